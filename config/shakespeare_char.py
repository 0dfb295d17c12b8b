# The GPU recipe: a baby GPT on Shakespeare's characters (about 3 minutes on an A100 in nanoGPT).
# python train.py config/shakespeare_char.py
out_dir = "out-shakespeare-char"
eval_interval = 250  # small model: evaluate often
eval_iters = 200
log_interval = 10  # each log line syncs the GPU
always_save_checkpoint = False  # 1 MB of text overfits: keep ckpt.pt at the best val loss

wandb_log = False
wandb_project = "shakespeare-char"
wandb_run_name = "mini-gpt"

dataset = "shakespeare_char"
gradient_accumulation_steps = 1
batch_size = 64
block_size = 256  # context of 256 characters

n_layer = 6
n_head = 6
n_embd = 384
dropout = 0.2  # 10.7M parameters on 1M characters overfit without it

learning_rate = 1e-3  # small models tolerate a high learning rate
max_iters = 5000
lr_decay_iters = 5000  # decay over the whole run
min_lr = 1e-4  # learning_rate / 10
beta2 = 0.99  # few tokens per iter: average the second moment over more iters
warmup_iters = 100

# compile is left to the device: on by default on CUDA, where it pays for itself within a few hundred iters
