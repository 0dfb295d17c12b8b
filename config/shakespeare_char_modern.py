# The laptop recipe with the architecture of current small LLMs (LLaMA, Qwen, nanochat):
# rotary positions, RMSNorm, ReLU^2 MLP, untied head, no biases. Same size and iters as shakespeare_char_cpu.py.
# python train.py config/shakespeare_char_modern.py
out_dir = "out-shakespeare-char-modern"
dataset = "shakespeare_char"
eval_interval = 250
eval_iters = 20
log_interval = 10
always_save_checkpoint = False

gradient_accumulation_steps = 1
batch_size = 12
block_size = 64

n_layer = 4
n_head = 4
n_embd = 128
dropout = 0.0
bias = False  # biases add parameters and time, not quality, at this size
pos_emb = "rope"  # relative positions: no position table to learn from 1 MB
norm = "rmsnorm"  # cheaper than LayerNorm, as good
activation = "relu2"  # sparse, sharper MLP activations; trains faster than GELU here
tie_weights = False  # the output head is free to differ from the input embedding

learning_rate = 1e-3  # 2e-3 and 3e-3 end within eval noise of it (docs/speed.md); 1e-3 was lowest
max_iters = 2000
lr_decay_iters = 2000
min_lr = 1e-4  # learning_rate / 10
beta2 = 0.99
warmup_iters = 100

device = "cpu"
compile = False
