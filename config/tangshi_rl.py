# Reinforcement learning for the Tang chat model: config/tangshi_sft.py's checkpoint learns rhyme and 平仄 from
# rewards checked against the 平水韻 dictionary (nanogpt/rewards.py, nanogpt/verse.py), on acrostic requests of train poems.
# python rl.py config/tangshi_rl.py && python data/tangshi/evaluate.py --out_dir=out-tangshi-rl --base=out-tangshi
out_dir = "out-tangshi-rl"
init_from = "out-tangshi-sft"
prompts = "tangshi"
requests = "acrostic"  # what evaluate.py asks; rhyme and tone carry over to form requests' quatrains
reward = "acrostic,form,rhyme,tone,guard"  # guard: 0 for a repeated 句, padding or a rhyme character twice

batch_size = 4  # prompts per iter: 32 answers, about 5 s an iteration on 2 cores
samples = 8  # answers per prompt: the baseline is their mean
max_new_tokens = 80  # a 七言 quatrain and <|end|> is 33 tokens; a runaway answer stops here
temperature = 1.0  # on-policy: the log-probabilities stepped on are those sampled from

learning_rate = 3e-4  # 1e-3 traded the acrostic away for tone within 10 iters (docs/rl.md)
warmup_iters = 10
grad_clip = 1.0
advantage = "mean"  # reward minus the prompt's mean (nanochat's); "zscore" is GRPO's
kl = 0.0  # no reference model: see docs/rl.md
max_iters = 180  # 13 min of wall time on the shared 2-core machine of docs/rl.md

eval_interval = 10  # held-out keys sampled at 0.8, as evaluate.py's sampled row; saves ckpt.pt
eval_keys = 50
device = "cpu"
