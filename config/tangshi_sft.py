# Instruction tuning for the Tang poems: the pretrained poems model learns to answer requests
# (data/tangshi/conversations.py: acrostics, and poems of a form for a title), the loss on its answers only.
# python data/tangshi/conversations.py && python train.py config/tangshi_sft.py && python chat.py --out_dir=out-tangshi-sft
out_dir = "out-tangshi-sft"
init_from = "out-tangshi"  # config/tangshi_cpu.py's model; its embedding and head grow by the 4 role tokens
dataset = "tangshi_chat"
eval_interval = 575
eval_iters = 10
log_interval = 100
always_save_checkpoint = False  # keep ckpt.pt at the best val loss (on the answers)

gradient_accumulation_steps = 1
batch_size = 16  # conversations per iter, each padded to the batch's longest

learning_rate = 3e-3  # above pretraining's 2e-3: copying the key into each 句 is a new skill, not a nudge
max_iters = 2300  # the acrostic clicks after ~1,000 iters; sampling at temperature 0.8 needs the rest
lr_decay_iters = 2300
min_lr = 3e-4
warmup_iters = 50
beta2 = 0.99
dropout = 0.0

device = "cpu"
compile = False
