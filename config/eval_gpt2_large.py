# Evaluate OpenAI's gpt2-large on OpenWebText's val split (python data/openwebtext/prepare.py first).
# python train.py config/eval_gpt2_large.py
batch_size = 8
eval_iters = 500  # 500 x 8 x 1024 = 4M tokens: a low-noise estimate
eval_only = True
wandb_log = False
init_from = "gpt2-large"
