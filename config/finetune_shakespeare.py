# Fine-tune OpenAI's GPT-2 on Shakespeare (BPE tokens): python data/shakespeare/prepare.py first.
# python train.py config/finetune_shakespeare.py      (gpt2-xl needs a large GPU; try --init_from=gpt2 first)
out_dir = "out-shakespeare"
eval_interval = 5
eval_iters = 40
wandb_log = False
wandb_project = "shakespeare"
wandb_run_name = "ft"

dataset = "shakespeare"
init_from = "gpt2-xl"  # the largest GPT-2: 1.5B parameters

always_save_checkpoint = False  # only keep checkpoints that improve val loss: 1 MB overfits within minutes

# 1 x 32 x 1024 = 32,768 tokens per iter; shakespeare has 301,966, so one epoch is ~9.2 iters
batch_size = 1
gradient_accumulation_steps = 32
max_iters = 20

learning_rate = 3e-5  # fine-tuning: a small, constant learning rate
decay_lr = False
