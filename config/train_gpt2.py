# GPT-2 124M on OpenWebText, nanoGPT's recipe: about 4 days on 8 A100s for val loss ~2.85.
# python data/openwebtext/prepare.py, then
# torchrun --standalone --nproc_per_node=8 train.py config/train_gpt2.py
wandb_log = False
wandb_project = "owt"
wandb_run_name = "gpt2-124M"

# 12 batch x 1024 block x 40 accumulation = 491,520 tokens per iteration (~0.5M, as GPT-2)
# gradient_accumulation_steps counts micro-batches over all processes: 8 GPUs run 5 each
batch_size = 12
block_size = 1024
gradient_accumulation_steps = 5 * 8

# 600,000 iterations x 0.5M tokens = 300B tokens
max_iters = 600000
lr_decay_iters = 600000

eval_interval = 1000
eval_iters = 200
log_interval = 10  # each log line syncs the GPU

weight_decay = 1e-1
compile = True
