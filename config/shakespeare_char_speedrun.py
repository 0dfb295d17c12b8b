# The CPU speedrun: val loss 1.88 on shakespeare_char in half the time of config/shakespeare_char_cpu.py.
# python train.py config/shakespeare_char_speedrun.py --target_loss=1.88 --eval_windows=1600 --eval_interval=50
# What each choice bought is in docs/speedrun.md.
out_dir = "out-shakespeare-char-speedrun"
dataset = "shakespeare_char"
eval_interval = 250
eval_iters = 20
eval_windows = 1600  # val loss over 1600 fixed 64-token windows (102,400 tokens): no sampling noise
log_interval = 50
always_save_checkpoint = False

gradient_accumulation_steps = 1
batch_size = 12
block_size = 64

n_layer = 4
n_head = 4
n_embd = 128
dropout = 0.0
bias = False
pos_emb = "rope"
norm = "rmsnorm"
activation = "relu2"
tie_weights = False

optimizer = "muon"  # Muon on the blocks' matrices, AdamW on embeddings, head and gains
muon_lr = 0.02
learning_rate = 3e-3  # AdamW's part
max_iters = 1000
lr_decay_iters = 1000
lr_schedule = "wsd"  # hold the peak, then cool down linearly
cooldown_iters = 300
min_lr = 3e-4
beta2 = 0.99
warmup_iters = 50

device = "cpu"
compile = False
