# The CPU speedrun: val loss 1.88 on shakespeare_char in a fraction of the time of a complete run of
# config/shakespeare_char_cpu.py (same 4 x 128 size, same 64-character context; docs/speed.md has the figures).
# python train.py config/shakespeare_char_speedrun.py --target_loss=1.88 --eval_interval=5
# What each choice bought, measured, is in docs/speedrun.md.
out_dir = "out-shakespeare-char-speedrun"
dataset = "shakespeare_char"
eval_interval = 100
eval_iters = 20
eval_windows = 1600  # val loss over 1600 fixed 64-token windows (102,400 tokens): no sampling noise
log_interval = 25  # each log line syncs; keep them rare
always_save_checkpoint = False

gradient_accumulation_steps = 1
batch_size = 24  # Muon's step costs the same at any batch: twice the batch of the cpu recipe amortizes it
block_size = 64

n_layer = 4
n_head = 4
n_embd = 128
dropout = 0.0
bias = False  # no quality lost, and fewer operations per iter
pos_emb = "rope"  # relative positions learn faster than a position table
norm = "layernorm"  # RMSNorm learns as well but is slower on CPU (no fused kernel)
activation = "gelu"  # ReLU^2 learned no faster here and costs two unfused ops
tie_weights = False
qk_norm = True  # unit-RMS q and k: fewer iters to 1.88, and a higher Muon rate holds
zero_init_proj = True  # each Block starts as the identity
logit_softcap = 15.0  # with the two above: a lower loss at the same iter than without
value_embeds = 2  # each token's own value vector mixed into v in layers 0, 1 (and again in 2, 3)

optimizer = "muon"  # Muon on the blocks' matrices (its Newton-Schulz in matmul_dtype on CPU), AdamW on the rest
muon_lr = 0.04  # the fastest to 1.88 with the embedding rate below
learning_rate = 3e-3  # AdamW's part: the head and the gains
embedding_lr = 0.1  # the token and value embeddings: each row moves only when its character appears
max_iters = 200  # the target stops the run at ~150; a 200-iteration cosine decays fast enough by then
lr_decay_iters = 200
lr_schedule = "cosine"  # reached 1.88 in fewer iters than warmup-stable-decay here
min_lr = 3e-4
beta2 = 0.99
warmup_iters = 20  # short: the embeddings' high rate pays from the first iterations

device = "cpu"
compile = False  # inductor's compile time exceeds the whole run
matmul_dtype = "auto"  # the products (linear layers, Muon) in bfloat16 where the CPU has it natively: cheaper iters
