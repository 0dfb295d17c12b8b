# Reinforcement learning for the Tang chat model: config/tangshi_sft.py's checkpoint learns rhyme and 平仄 from
# rewards checked against the 平水韻 dictionary (data/tangshi/rewards.py and verse.py), on acrostic requests of train poems.
# python rl.py config/tangshi_rl.py && python data/tangshi/evaluate.py --out_dir=out-tangshi-rl --base=out-tangshi
# two processes train the same (10-13 min on 2 cores, docs/rl.md):
# torchrun --standalone --nproc_per_node=2 rl.py config/tangshi_rl.py --batch_size=2
out_dir = "out-tangshi-rl"
init_from = "out-tangshi-sft"
prompts = "tangshi"
requests = "acrostic"  # what evaluate.py asks; rhyme and tone carry over to form requests' quatrains
# every reward a gate: an answer scores the product of its shares, as good as its weakest check; a weighted mean
# let the policy trade the acrostic for tone (docs/rl.md)
reward = "acrostic:gate,form:gate,rhyme:gate,tone:gate,guard"

batch_size = 4  # prompts per iter (per process under torchrun)
samples = 16  # answers per prompt: the baseline is their mean; 16 finds a rhyme among them sooner than 8
max_new_tokens = 80  # a 七言 quatrain and <|end|> is 33 tokens; a runaway answer stops here
temperature = 1.0  # on-policy: the log-probabilities stepped on are those sampled from

learning_rate = 3e-4  # 1e-3 collapsed half the answers into one template within 200 iters (docs/rl.md)
min_lr = 3e-5  # decays by a cosine to a tenth at max_iters; at a constant rate tone ended lower (docs/rl.md)
warmup_iters = 10
grad_clip = 1.0
advantage = "mean"  # reward minus the prompt's mean (nanochat's); "zscore" is GRPO's
kl = 0.005  # none: one template for every key (seed 1337); 0.03 and more: no rhyme in 800 iters (docs/rl.md)
max_iters = 1200  # the curve is flat from about iteration 600 (docs/rl.md)

eval_interval = 50  # held-out keys sampled as chat.py samples (0.8, every token kept); saves ckpt.pt
eval_keys = 50
device = "cpu"
