"""One step of reinforcement learning on verifiable rewards, as nanochat's chat_rl takes it: sample k answers
per prompt from the model itself, score them, and step on -(advantage x log-probability of each sampled token).

The estimator: for answers y drawn from the policy p, grad E[R] = E[R(y) grad log p(y)], and log p(y) is the
sum of the sampled tokens' log-probabilities. On-policy (the answers come from the weights being stepped,
one step per batch of samples) the expectation is over the distribution being differentiated, so no
importance ratio p/p_old corrects for a stale sampler and there is nothing to clip. Subtracting a baseline
(the mean reward of the prompt's k answers) keeps the estimate unbiased and removes the part of the
reward every answer to that prompt shares, which is most of its variance. The loss is normalised by the
number of sampled tokens in the batch (token level): a long answer weighs by its tokens, not as one.

The log-probabilities are those of the distribution the sampler drew from: the logits over the
temperature, filtered by top_k / top_p as generate.sample_next filters them.
"""
from contextlib import nullcontext

import torch
import torch.nn.functional as F

from nanogpt.engine import Engine, Sequence
from nanogpt.generate import filter_logits


class Answer:
    """An engine sink: the tokens of one answer, its stop token included (the model learns to end)."""

    def __init__(self, stops):
        self.stops, self.ids, self.reason, self.error = stops, [], None, None

    def add(self, token, info):
        self.ids.append(token)
        return token in self.stops

    def end(self, reason, error):
        self.reason, self.error = reason, error


def sample_answers(model, prompts, k, generators, max_new_tokens, temperature=1.0, top_k=None, top_p=None,
                   stops=(), device="cpu", max_batch=None):
    """k answers (token lists) to each prompt (token lists), prompt-major: answer j of prompt i at i * k + j,
    drawn by the serving engine (engine.Engine: batched KV-cache decoding, sample_next's sampler); each
    answer draws from its own generator, so it is the same text whatever else is in the batch."""
    answers = [Answer(set(stops)) for _ in range(len(prompts) * k)]
    seqs = [Sequence(prompts[n // k], max_new_tokens, a, temperature, top_k, top_p, g)
            for n, (a, g) in enumerate(zip(answers, generators))]
    was_training = model.training
    model.eval()
    try:
        engine = Engine(model, max_batch or len(seqs), len(seqs), device, nullcontext())
        engine.submit(seqs)
        engine.drain()
    finally:
        model.train(was_training)
    return [a.ids for a in answers]


def answer_batch(prompts, answers, k, device="cpu"):
    """(x, targets) of the prompts' answers, each row prompt + answer padded: targets are the answer tokens
    (the next token at each position), -1 elsewhere."""
    rows = [prompts[n // k] + a for n, a in enumerate(answers)]
    T = max(len(r) for r in rows) - 1
    x = torch.zeros(len(rows), T, dtype=torch.long)
    y = torch.full((len(rows), T), -1, dtype=torch.long)
    for n, (row, a) in enumerate(zip(rows, answers)):
        x[n, :len(row) - 1] = torch.tensor(row[:-1])
        if a:
            y[n, len(row) - 1 - len(a):len(row) - 1] = torch.tensor(a)
    return x.to(device), y.to(device)


def token_log_probs(model, x, targets, temperature=1.0, top_k=None, top_p=None):
    """(B, T) log-probability of each target under the sampler's distribution, 0 where the target is -1."""
    logits, _ = model(x)  # (B, T, V)
    B, T, V = logits.shape
    scaled = logits.float().view(-1, V) / (temperature if temperature > 0 else 1.0)
    logp = F.log_softmax(filter_logits(scaled, top_k, top_p), dim=-1)  # (B*T, V)
    mask = targets.view(-1) >= 0
    picked = logp.gather(1, targets.view(-1, 1).clamp(min=0)).squeeze(1)
    return torch.where(mask, picked, torch.zeros_like(picked)).view(B, T)


def advantages(rewards, k, how="mean"):
    """(P * k,) advantages of rewards (P * k,), prompt-major: each minus its prompt's mean reward; "zscore"
    also divides by the prompt's standard deviation (GRPO's), 0 where its k answers score alike."""
    r = rewards.view(-1, k)
    adv = r - r.mean(dim=1, keepdim=True)
    if how == "zscore":
        adv = adv / (r.std(dim=1, keepdim=True, unbiased=False) + 1e-6)
    return adv.reshape(-1)


def pg_loss(logp, targets, adv, ref_logp=None, kl=0.0, tokens=None):
    """-(advantage x log-prob) summed over the sampled tokens / their number (or / tokens, given: the count a
    process's share of a larger batch is normalised by); with kl > 0 plus kl times the k3 estimate of
    KL(policy || reference) per sampled token (Schulman's: exp(d) - d - 1, d = ref - policy)."""
    mask = (targets >= 0).float()
    n = mask.sum().clamp(min=1) if tokens is None else max(tokens, 1.0)
    loss = -(logp * adv[:, None] * mask).sum() / n
    if kl > 0 and ref_logp is not None:
        d = (ref_logp - logp).masked_fill(mask == 0, 0.0)
        loss = loss + kl * ((torch.exp(d) - d - 1) * mask).sum() / n
    return loss
