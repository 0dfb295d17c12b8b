# The laptop recipe for Tang poems (data/tangshi): a small GPT on 1.1M Chinese characters, about two minutes on 2 CPU cores.
# python data/tangshi/prepare.py && python train.py config/tangshi_cpu.py && python sample.py --out_dir=out-tangshi
out_dir = "out-tangshi"
dataset = "tangshi"  # characters by default; data/tangshi/prepare.py --tokenizer bpe trains a BPE instead
eval_interval = 250
eval_iters = 20
log_interval = 25  # each log line syncs
always_save_checkpoint = False  # keep ckpt.pt at the best val loss

gradient_accumulation_steps = 1
batch_size = 6  # x 128: the 768 tokens per iter of 12 x 64
block_size = 128  # 128 characters: a whole 律詩 with its title, and room for a request when fine-tuned

n_layer = 4
n_head = 4
n_embd = 128  # the 6,552-character embedding is half the model: wider costs more than it learns here
dropout = 0.0

learning_rate = 2e-3  # small models tolerate a high learning rate
max_iters = 1500
lr_decay_iters = 1500
min_lr = 2e-4
beta2 = 0.99
warmup_iters = 100

device = "cpu"
compile = False
