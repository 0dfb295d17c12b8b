"""Improve a chat model by reinforcement learning on verifiable rewards: policy gradient, as nanochat's chat_rl.

    python rl.py config/tangshi_rl.py
    python rl.py --init_from=out-tangshi-sft --out_dir=out-tangshi-rl --reward=acrostic,form,rhyme:2,tone,guard
    python rl.py --init_from=resume --out_dir=out-tangshi-rl --max_iters=400
    python rl.py --reward_file=my_rewards.py --reward=thou --prompts=FILE:requests.txt --init_from=out-my-chat
    torchrun --standalone --nproc_per_node=2 rl.py config/tangshi_rl.py

Each iteration every process takes its own batch_size prompts (requests from the dataset's train split, or
one per line of a file), samples `samples` answers to each with the serving engine (engine.py: batched
KV-cache decoding, sample.py's sampler), scores them with the rewards (nanogpt/rewards.py), and steps on
-(advantage x log-probability of each sampled token) (nanogpt/policy_gradient.py). Every eval_interval it samples
answers to acrostic keys of held-out poems at eval_temperature and logs the rewards' rates there.
Writes out_dir/ckpt.pt (a chat checkpoint chat.py and serve.py load as they are) at every eval and at the
end, and out_dir/log.jsonl. Ctrl-C saves the last completed iteration; --init_from=resume continues exactly
(the prompts' order and every sample's seed follow from the iteration; the RNGs are saved too).
"""
from nanogpt import program

program.exit_quietly_on_ctrl_c()  # before the slow imports (torch): Ctrl-C during them exits quietly

# ruff: noqa: E402
import copy
import os
import random
import shlex
import time
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from tqdm import tqdm

import data.tangshi.rewards  # noqa: F401  registers the Tang rewards (acrostic, form, rhyme, tone, guard)
import nanogpt.rewards as reward_registry
from configurator import parse_args, report_overrides
from data.tangshi.poems import ACROSTIC, held_out_keys, train_requests
from nanogpt.checkpoint import load_checkpoint, model_args, model_from_checkpoint, save_checkpoint, set_rng_state
from nanogpt.copies import Training
from nanogpt.dataset import dataset_dir
from nanogpt.device import Device, resolve_device
from nanogpt.errors import UserError
from nanogpt.files import read_named_text
from nanogpt.generate import check_sampling, sample_seed
from nanogpt.memory import check_fits, kv_cache_bytes, training_bytes
from nanogpt.out_dir import OutDirLock, latest_form
from nanogpt.policy_gradient import advantages, answer_batch, pg_loss, sample_answers, token_log_probs
from nanogpt.program import run_main
from nanogpt.source import checkpoint_file, init_from_kind, tokenizer_meta
from nanogpt.tokenizer import ChatTokenizer, tokenizer_from_meta
from nanogpt.training.distributed import (collective_device, gather_rng, record_mean_over_ranks, setup_distributed,
                                          sum_over_ranks, teardown)
from nanogpt.training.metrics import Metrics
from nanogpt.training.optim import (DAMAGED, OptimizerSettings, Schedule, configure_optimizers, lr_scale,
                                   restore_optimizer)
from nanogpt.training.resume import names_code, resume_command, saved_settings
from nanogpt.training.stopping import Interrupted, StopFlag
from nanogpt.training.train_config import check_settings
from nanogpt.values import how_many


@dataclass
class RLConfig(Device):
    init_from: str = "out-tangshi-sft"  # a chat model's out_dir (or checkpoint file), or "resume": continue out_dir
    out_dir: str = "out-rl"
    prompts: str = "tangshi"  # "tangshi": requests of the dataset's train split; or FILE:path, one request per line
    dataset: str = "tangshi"  # with prompts="tangshi": the prepared poems (train split: prompts; val: eval keys)
    requests: str = "acrostic"  # with prompts="tangshi": acrostic, form, or acrostic,form
    reward: str = "acrostic,form,rhyme,tone,guard"  # data/tangshi/rewards.py's names, weights after a colon: rhyme:2
    reward_file: str | None = names_code()  # a Python file of @reward functions, imported; never from a checkpoint
    max_iters: int = 200
    batch_size: int = 8  # prompts per iteration, per process
    samples: int = 8  # answers sampled per prompt (k): the baseline is their mean reward
    max_new_tokens: int = 80
    temperature: float = 1.0  # the policy sampled from, and whose log-probabilities are stepped on
    top_k: int | None = None
    top_p: float | None = None
    learning_rate: float = 1e-4
    warmup_iters: int = 0
    min_lr: float | None = None  # None: learning_rate throughout (after warmup); else a cosine decay to min_lr at max_iters
    weight_decay: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0  # 0: off
    advantage: str = "mean"  # "mean": reward minus the prompt's mean; "zscore": also over the prompt's std
    kl: float = 0.0  # weight of KL(policy || starting model) per sampled token; 0: no reference model
    eval_interval: int = 25  # also saves ckpt.pt
    eval_keys: int = 50  # held-out acrostic keys (data/tangshi/evaluate.py's draw); 0: no evaluation
    eval_temperature: float = 0.8
    eval_top_k: int | None = None  # evaluate.py's sampled row: chat.py's defaults (0.8, every token kept)
    log_interval: int = 1
    seed: int = 1337
    device: str = "cpu"  # not auto: rl.py takes a torch device as given (cpu, cuda, cuda:N)
    wandb_log: bool = False
    wandb_project: str = "rl"
    wandb_run_name: str = "rl"

    def __post_init__(self):
        check_settings(self)  # the keys train.py has too, by its rules
        check_sampling(self.max_new_tokens, self.temperature, self.top_k, self.top_p)
        check_sampling(0, self.eval_temperature, self.eval_top_k, None)
        if self.temperature == 0:
            raise ValueError("temperature must be above 0: greedy answers to one prompt are all alike, so every "
                             "advantage is 0")
        for key in ("max_iters", "batch_size", "samples", "eval_interval", "log_interval", "max_new_tokens"):
            if getattr(self, key) < 1:
                raise ValueError(f"{key} must be at least 1, got {getattr(self, key)}")
        if self.samples < 2:
            raise ValueError(f"samples must be at least 2 (the baseline is their mean), got {self.samples}")
        if self.advantage not in ("mean", "zscore"):
            raise ValueError(f"advantage must be mean or zscore, got {self.advantage!r}")
        if self.min_lr is not None and not 0 <= self.min_lr <= self.learning_rate:
            raise ValueError(f"min_lr must be between 0 and learning_rate ({self.learning_rate}), got {self.min_lr}")
        if not (self.kl >= 0 and self.learning_rate > 0):
            raise ValueError(f"kl must be >= 0 and learning_rate > 0, got {self.kl} and {self.learning_rate}")


def schedule(cfg):
    """train.py's schedule (optim.lr_scale): a linear warmup over warmup_iters, then learning_rate, or with min_lr
    a cosine from learning_rate to min_lr at max_iters."""
    floor = cfg.learning_rate if cfg.min_lr is None else cfg.min_lr
    return Schedule(cfg.learning_rate, floor, cfg.warmup_iters, lr_decay_iters=cfg.max_iters)


def learning_rate(cfg, it):
    """The rate of iteration it."""
    return cfg.learning_rate * lr_scale(it, schedule(cfg))


def load_start(cfg, device):
    """(ckpt, path) the run starts from: out_dir's own (resume) or init_from's chat checkpoint."""
    source = cfg.out_dir if cfg.init_from == "resume" else cfg.init_from
    if init_from_kind(cfg.init_from) == "pretrained":
        raise UserError(f"--init_from={cfg.init_from} is pretrained weights without a chat template; RL improves a "
                        f"chat model: fine-tune one first (docs/chat.md)")
    path = os.path.join(source, "ckpt.pt") if cfg.init_from == "resume" else (checkpoint_file(source) or source)
    if not os.path.exists(latest_form(path)):
        hint = ("start a run with --init_from=<a chat model's out_dir>" if cfg.init_from == "resume" else
                "fine-tune a chat model first: python train.py config/tangshi_sft.py (docs/chat.md)")
        raise UserError(f"{path} not found; {hint}")
    ckpt = load_checkpoint(path, map_location=device)
    if cfg.init_from == "resume" and "rl" not in ckpt:
        raise UserError(f"{path} was not written by rl.py; start from it with --init_from={source} and a new --out_dir")
    return ckpt, path


def resume_config(cfg, overrides, ckpt, path, log=print):
    """(the run's config, this one's): a resumed run's config is the checkpoint's (as data: no key that leads to
    code), with the keys this command line sets on top (overrides) and init_from, out_dir and device as given."""
    saved = saved_settings(ckpt, RLConfig, path, overrides, log)
    local = {"init_from": cfg.init_from, "out_dir": cfg.out_dir, "device": cfg.device}
    try:
        return RLConfig(**{**saved, **local}), RLConfig(**{**saved, **overrides, **local})
    except ValueError as e:
        raise UserError(f"{path}: its saved config does not fit: {e}") from None


def chat_tokenizer(ckpt, path, vocab_size):
    meta = tokenizer_meta(ckpt, path)
    tokenizer = tokenizer_from_meta(meta) if meta is not None else None
    if not isinstance(tokenizer, ChatTokenizer):
        raise UserError(f"{path} has no chat template (it was not fine-tuned on conversations); RL improves a chat "
                        f"model: fine-tune one first (docs/chat.md)")
    if tokenizer.vocab_size > vocab_size:
        raise UserError(f"{path}: its tokenizer has {tokenizer.vocab_size} tokens, the model {vocab_size}")
    return tokenizer


def read_requests(cfg):
    """The train prompts (request texts) and the held-out eval keys (None without the Tang dataset)."""
    if cfg.prompts.startswith("FILE:"):
        path = cfg.prompts[5:]
        text = read_named_text(path, f"--prompts={cfg.prompts}")  # a regular file: /dev/zero never ends
        requests = [line.strip() for line in text.splitlines() if line.strip()]
        keys = None
    elif cfg.prompts == "tangshi":
        kinds = tuple(k.strip() for k in cfg.requests.split(","))
        if not set(kinds) <= {"acrostic", "form"}:
            raise UserError(f"--requests={cfg.requests!r}: give acrostic, form or acrostic,form")
        data = dataset_dir(cfg.dataset)
        requests = train_requests(data, kinds)
        keys = held_out_keys(data, cfg.eval_keys, cfg.seed) if cfg.eval_keys else None
    else:
        raise UserError(f"--prompts={cfg.prompts!r}: give tangshi or FILE:path (one request per line)")
    if not requests:
        raise UserError(f"--prompts={cfg.prompts}: no requests")
    return requests, keys


def encode_requests(tokenizer, requests, block_size, max_new_tokens, what="prompt"):
    ids = [tokenizer.render([{"role": "user", "content": r}])[0] for r in requests]
    longest = max(range(len(ids)), key=lambda i: len(ids[i]))
    if len(ids[longest]) + max_new_tokens > block_size:
        raise UserError(f"the {what} {requests[longest]!r} is {len(ids[longest])} tokens; with max_new_tokens="
                        f"{max_new_tokens} it passes the model's context of {block_size}; shorten it or lower "
                        f"max_new_tokens")
    return ids


def prompt_order(seed, n, epoch, cache={}):
    """The prompts' order in an epoch: a shuffle fixed by the seed and the epoch (cached)."""
    if (seed, n, epoch) not in cache:
        order = list(range(n))
        random.Random(seed * 1_000_003 + epoch).shuffle(order)
        cache.clear()
        cache[(seed, n, epoch)] = order
    return cache[(seed, n, epoch)]


def step_prompts(cfg, it, rank, world, n):
    """The prompt indices process `rank` takes at iteration it: each its own, every prompt once per epoch."""
    out = []
    for i in range(cfg.batch_size):
        p = (it * world + rank) * cfg.batch_size + i
        out.append(prompt_order(cfg.seed, n, p // n)[p % n])
    return out


def generators(seed, it, rank, count):
    """One generator per answer, seeded by the iteration and the answer's place among all processes' (rank's answers
    follow those of the ranks before it): 2 processes of batch_size b draw what 1 process of 2b draws."""
    return [torch.Generator().manual_seed(sample_seed(seed, (it << 32) + rank * count + j)) for j in range(count)]


def answer_texts(tokenizer, answers):
    """Each answer's text (its ids, the answer's stop tokens left out)."""
    stops = {s[0] for s in tokenizer.answer_stops}
    return [tokenizer.decode([t for t in ids if t not in stops]) for ids in answers]


def score_answers(rewards, tokenizer, requests, answers, k):
    """(totals tensor, [{name: score}]) of each answer (prompt-major)."""
    totals, parts = [], []
    for n, text in enumerate(answer_texts(tokenizer, answers)):
        total, part = reward_registry.score(rewards, requests[n // k], text)
        totals.append(total)
        parts.append(part)
    return torch.tensor(totals), parts


def means(parts):
    names = sorted({k for p in parts for k in p})
    return {k: sum(p[k] for p in parts if k in p) / max(1, sum(k in p for p in parts)) for k in names}


class Run:
    """One RL run: the model, its optimizer, the prompts and rewards, and the loop's steps."""

    def __init__(self, cfg, overrides, log, stop, lock):
        self.cfg, self.log, self.stop, self.lock = cfg, log, stop, lock
        self.rank, local_rank, self.world = setup_distributed(cfg.device)
        if self.world > 1 and cfg.device.startswith("cuda"):
            cfg.device = f"cuda:{local_rank}"
        self.master = self.rank == 0
        device = self.device = resolve_device(cfg.device, local_rank)  # before the checkpoint: a missing GPU is named
        ckpt, path = load_start(cfg, device)
        base = RLConfig()
        if cfg.init_from == "resume":  # the run's own settings, with what this command line gives on top
            base, cfg = resume_config(cfg, overrides, ckpt, path, log)
            self.cfg = cfg
        if cfg.reward_file:
            reward_registry.load_reward_file(cfg.reward_file)
        self.rewards = reward_registry.parse_rewards(cfg.reward)
        self.model = model_from_checkpoint(ckpt, path, dropout=0.0).to(device)
        self.tokenizer = chat_tokenizer(ckpt, path, self.model.config.vocab_size)
        self.tokenizer_meta = ckpt.get("tokenizer") or tokenizer_meta(ckpt, path)
        self.stops = [s[0] for s in self.tokenizer.answer_stops]
        config = self.model.config
        rows = cfg.batch_size * cfg.samples
        check_fits(training_bytes(config, rows) * (2 if cfg.kl > 0 else 1) + kv_cache_bytes(config, rows)
                   + 3 * rows * config.block_size * config.vocab_size * 4, device,  # the logits and their softmax
                   f"an RL step of {cfg.batch_size} prompts x {cfg.samples} samples", "lower batch_size or samples")
        self.requests, self.keys = read_requests(cfg)
        self.prompts = encode_requests(self.tokenizer, self.requests, config.block_size, cfg.max_new_tokens)
        self.eval_requests = [ACROSTIC + k for k in self.keys] if self.keys else []
        self.eval_prompts = encode_requests(self.tokenizer, self.eval_requests, config.block_size, cfg.max_new_tokens,
                                            "eval prompt") if self.keys else []
        # the train split, where the held-out answers' copies are looked for (evaluate.py's "copied" column)
        self.training = Training(dataset_dir(cfg.dataset)) if self.keys else None
        self.reference = copy.deepcopy(self.model).eval().requires_grad_(False) if cfg.kl > 0 else None
        self.optimizer = configure_optimizers(self.model, OptimizerSettings.adamw(cfg.learning_rate, cfg.weight_decay,
                                                                                  cfg.beta1, cfg.beta2))
        self.schedule = schedule(cfg)
        self.iter_num = 0
        if cfg.init_from == "resume":
            self.restore(ckpt, path)
        self.start_iter = self.iter_num
        self.held_out = None  # the last evaluation's rates on the held-out keys
        self.ddp = DDP(self.model) if self.world > 1 else self.model
        self.metrics = Metrics(os.path.join(cfg.out_dir, "log.jsonl"), cfg, log, record=self.master, iter=self.iter_num)
        report_overrides(overrides, base, log=log)
        log(f"{len(self.requests):,} train prompts, {len(self.eval_prompts)} held-out eval keys; "
            f"{how_many(self.world, 'process')} x {cfg.batch_size} prompts x {cfg.samples} samples per iter; from {path}")
        self.bar = tqdm(total=cfg.max_iters, initial=self.iter_num, desc="rl", disable=not self.master or None)

    def restore(self, ckpt, path):
        state = ckpt["rl"]
        self.iter_num = int(ckpt["iter_num"])
        moments = one_group_state_regrouped(self.model, self.optimizer, ckpt["optimizer"])
        restore_optimizer(self.model, self.optimizer, lambda: self.optimizer.load_state_dict(moments), path,
                          "rl.py's AdamW")
        if self.reference is not None:
            if state.get("reference") is None:
                raise UserError(f"{path} has no reference model: its run had kl=0; resume with --kl=0")
            self.reference.load_state_dict(state["reference"])
        if len(state["rng"]) == self.world:
            set_rng_state(state["rng"][self.rank])

    def step(self):
        """One iteration: sample, score, step. Returns the record of it."""
        cfg, k = self.cfg, self.cfg.samples
        t0 = time.time()
        idx = step_prompts(cfg, self.iter_num, self.rank, self.world, len(self.prompts))
        prompts, requests = [self.prompts[i] for i in idx], [self.requests[i] for i in idx]
        gens = generators(cfg.seed, self.iter_num, self.rank, len(prompts) * k)
        answers = sample_answers(self.model, prompts, k, gens, cfg.max_new_tokens, cfg.temperature, cfg.top_k,
                                 cfg.top_p, self.stops, self.device)
        totals, parts = score_answers(self.rewards, self.tokenizer, requests, answers, k)  # a bad reward raises here
        adv = advantages(totals, k, cfg.advantage).to(self.device)
        x, y = answer_batch(prompts, answers, k, self.device)
        self.model.train()
        logp = token_log_probs(self.ddp, x, y, cfg.temperature, cfg.top_k, cfg.top_p)
        ref = None
        if self.reference is not None:
            with torch.no_grad():
                ref = token_log_probs(self.reference, x, y, cfg.temperature, cfg.top_k, cfg.top_p)
        # normalised by the sampled tokens of all processes: DDP's mean of the gradients is then one process's
        tokens = (y >= 0).sum().float().to(collective_device() if self.world > 1 else self.device)
        loss = pg_loss(logp, y, adv, ref, cfg.kl, tokens=sum_over_ranks(tokens, self.world).item() / self.world)
        loss.backward()
        with self.stop.finishing():  # from the optimizer step on, the iteration completes
            if cfg.grad_clip:
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.grad_clip)
            for group in self.optimizer.param_groups:  # every group follows the schedule from its own peak
                group["lr"] = group["initial_lr"] * lr_scale(self.iter_num, self.schedule)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            self.iter_num += 1
        mask = y >= 0
        record = {"reward": totals.mean().item(), **means(parts), "loss": loss.item(),
                  "tokens": int(mask.sum()) / len(answers), "seconds": time.time() - t0}
        if ref is not None:
            record["kl"] = ((logp - ref).detach() * mask).sum().item() / mask.sum().item()
        return record_mean_over_ranks(record, self.world)

    def evaluate(self):
        """The rewards' rates on the held-out keys, sampled at eval_temperature (one seed per key), and the mean
        share of each answer copied verbatim from the train split."""
        cfg = self.cfg
        gens = [torch.Generator().manual_seed(sample_seed(cfg.seed, j)) for j in range(len(self.eval_prompts))]
        answers = sample_answers(self.model, self.eval_prompts, 1, gens, cfg.max_new_tokens, cfg.eval_temperature,
                                 cfg.eval_top_k, None, self.stops, self.device)
        totals, parts = score_answers(self.rewards, self.tokenizer, self.eval_requests, answers, 1)
        passed = {f"{name}_pass": sum(p.get(name) == 1 for p in parts) / len(parts) for name in means(parts)}
        passed["all_pass"] = sum(all(v == 1 for v in p.values()) for p in parts) / len(parts)
        copied = self.training.mean_copied(answer_texts(self.tokenizer, answers))
        return {"reward": totals.mean().item(), **means(parts), **passed, "copied": copied}

    def save(self):
        meta = {"model_args": model_args(self.model.config), "iter_num": self.iter_num, "best_val_loss": None,
                "config": asdict(self.cfg), "tokenizer": self.tokenizer_meta}
        state = {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(), **meta,
                 "rl": {"rng": gather_rng(self.world),
                        "reference": self.reference.state_dict() if self.reference is not None else None}}
        if self.master:
            if not self.lock.held():
                raise self.lock.lost()
            with self.stop.finishing():
                save_checkpoint(state, os.path.join(self.cfg.out_dir, "ckpt.pt"))


def one_group_state_regrouped(model, optimizer, state):
    """An optimizer state saved with every parameter in one AdamW group (rl.py's own before it built its optimizer
    as train.py does: matrices decayed, gains and biases not) in optimizer's groups; any other state as it is."""
    groups = state.get("param_groups") if isinstance(state, dict) else None
    if not isinstance(groups, list) or len(groups) != 1 or len(optimizer.param_groups) == 1:
        return state
    whole = torch.optim.AdamW(model.parameters())
    try:
        whole.load_state_dict(state)
    except DAMAGED:
        return state  # damaged: restore_optimizer says so
    index = {id(p): i for i, p in enumerate(p for group in optimizer.param_groups for p in group["params"])}
    return {"state": {index[id(p)]: s for p, s in whole.state.items()},
            "param_groups": [{**groups[0], **{k: group[k] for k in ("weight_decay", "initial_lr") if k in group},
                              "params": [index[id(p)] for p in group["params"]]} for group in optimizer.param_groups]}


def pass_rates(rates):
    """'acrostic_pass 90.0%, ..., copied 2.0%': an evaluation's shares of held-out answers that pass each reward,
    and the share of their characters copied from the train split."""
    return ", ".join(f"{k} {v:.1%}" for k, v in rates.items() if k.endswith("_pass") or k == "copied")


def loop(run):
    cfg, stop = run.cfg, run.stop
    try:
        while True:
            last = run.iter_num >= cfg.max_iters
            if run.eval_prompts and (last or run.iter_num % cfg.eval_interval == 0):
                rates = run.held_out = run.evaluate()
                run.metrics.write(f"iter {run.iter_num}: held-out {pass_rates(rates)}", kind="rl_eval",
                                  iter=run.iter_num, **rates)
            if run.iter_num > run.start_iter and (last or run.iter_num % cfg.eval_interval == 0):
                run.save()
            if last or stop.agreed(run.world, run.iter_num, cfg.log_interval):
                break
            record = run.step()
            run.bar.update(1)
            if run.iter_num % cfg.log_interval == 0:
                run.metrics.write(f"iter {run.iter_num}: reward {record['reward']:.3f}, " + ", ".join(
                    f"{k} {v:.3f}" for k, v in record.items() if k not in ("reward", "seconds")) +
                    f", {record['seconds']:.1f}s", kind="rl", iter=run.iter_num, **record)
    except Interrupted:  # the iteration in flight is abandoned; the weights are untouched
        run.optimizer.zero_grad(set_to_none=True)
    finally:
        run.bar.close()
        run.metrics.close()
    if stop.set:
        if run.iter_num > run.start_iter:
            run.save()
            run.log(f"interrupted: saved {os.path.join(cfg.out_dir, 'ckpt.pt')} at iter {run.iter_num}; continue with "
                    f"{resume_command('rl.py', cfg, run.world)}")
        else:
            run.log(f"interrupted at iter {run.iter_num}, before this run completed an iteration: nothing saved")


def rl(cfg, overrides=None, log=print):
    """Run RL as cfg says; returns {"iters", "interrupted"}."""
    lock = OutDirLock(cfg.out_dir, program="rl.py", instead="run RL into another --out_dir")  # may refuse: first
    stop = StopFlag()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    stop.abandon = world == 1  # DDP ranks stop together, at a log iteration
    t0 = time.time()
    try:
        torch.manual_seed(cfg.seed)
        run = Run(cfg, overrides or {}, log if int(os.environ.get("RANK", "0")) == 0 else (lambda *a, **k: None),
                  stop, lock)
        if run.master:
            lock.acquire()
        loop(run)
        return {"iters": run.iter_num, "ran": run.iter_num - run.start_iter, "seconds": time.time() - t0,
                "held_out": run.held_out, "interrupted": stop.set}
    except Interrupted:
        log("interrupted during start-up: nothing saved")
        return {"iters": None, "interrupted": True}
    finally:
        lock.release()
        stop.restore()
        if dist.is_initialized():
            teardown(world)


def main(argv):
    cfg, overrides = parse_args(RLConfig, argv)
    summary = rl(cfg, overrides)
    if summary["iters"] is not None and not summary["interrupted"] and int(os.environ.get("RANK", "0")) == 0:
        total = f" ({summary['iters']} in all)" if summary["ran"] != summary["iters"] else ""
        rates = summary["held_out"]
        held_out = f"; held-out {pass_rates(rates)}" if rates else ""
        print(f"done: {summary['ran']} iters in {summary['seconds']:.1f} s{total}{held_out}; checkpoint "
              f"{os.path.join(cfg.out_dir, 'ckpt.pt')}; talk to it: python chat.py --out_dir={shlex.quote(cfg.out_dir)}")


if __name__ == "__main__":
    run_main(main)
