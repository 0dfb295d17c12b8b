# The laptop recipe: a small GPT-2-style model on Shakespeare's characters, a few minutes on 2 CPU cores.
# python train.py config/shakespeare_char_cpu.py
out_dir = "out-shakespeare-char-cpu"  # its own: the GPU recipe writes out-shakespeare-char
dataset = "shakespeare_char"
eval_interval = 250  # the model is small: evaluating often costs little
eval_iters = 20  # 20 batches of 12 x 64 tokens: a quick, noisy estimate
log_interval = 10  # each log line syncs; every iteration would be noise anyway
always_save_checkpoint = False  # 1 MB of text overfits: keep ckpt.pt at the best val loss

gradient_accumulation_steps = 1
batch_size = 12
block_size = 64  # context of 64 characters

n_layer = 4
n_head = 4
n_embd = 128
dropout = 0.0  # too small and too short a run to overfit

learning_rate = 1e-3  # small models tolerate a high learning rate
max_iters = 2000
lr_decay_iters = 2000  # decay over the whole run
min_lr = 1e-4  # learning_rate / 10
beta2 = 0.99  # few tokens per iter: average the second moment over more iters
warmup_iters = 100

device = "cpu"
compile = False  # compiling takes longer than this whole run saves
