# Instruction tuning for the Tang poems: the pretrained poems model learns to answer requests
# (data/tangshi/chat.py: acrostics, and poems of a form for a title), the loss on its answers only.
# python data/tangshi/chat.py && python train.py config/tangshi_sft.py && python chat.py --out_dir=out-tangshi-sft
out_dir = "out-tangshi-sft"
init_from = "out-tangshi"  # config/tangshi_cpu.py's model; its embedding and head grow by the 4 role tokens
dataset = "tangshi_chat"
eval_interval = 100
eval_iters = 20
log_interval = 25
always_save_checkpoint = False  # keep ckpt.pt at the best val loss (on the answers)

gradient_accumulation_steps = 1
batch_size = 16  # conversations per iter, each padded to the batch's longest

learning_rate = 1e-3  # a tenth of the way from pretraining's 2e-3 would be too timid for a new task
max_iters = 600
lr_decay_iters = 600
min_lr = 1e-4
warmup_iters = 30
beta2 = 0.99
dropout = 0.0

device = "cpu"
compile = False
