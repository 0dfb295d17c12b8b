"""Train a GPT by teacher forcing: every position predicts the next token, all at once.

    python train.py config/shakespeare_char_cpu.py
    python train.py config/shakespeare_char.py --batch_size=32 --compile=False
    python train.py --init_from=resume --out_dir=out-shakespeare-char --max_iters=6000
    torchrun --standalone --nproc_per_node=2 train.py config/shakespeare_char_cpu.py

Writes out_dir/ckpt.pt (latest), out_dir/best.pt (best val loss) and
out_dir/log.jsonl (one JSON object per log line). Ctrl-C saves and exits.
"""
import time

PROCESS_START = time.time()  # before the heavy imports: "training time" counts from here

# ruff: noqa: E402
import json
import math
import os
import random
import shlex
import signal
import typing
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass, fields, replace

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from tqdm import tqdm

from batches import Batches, dataset_dir, estimate_loss
from checkpoint import OutDirLock, is_pretrained, load_checkpoint, load_pretrained, model_from_checkpoint, save_checkpoint
from configurator import UserError, convert, parse_args, report_overrides, run_main
from device import autocast, cpu_matmul_flops, peak_flops_for, resolve_device, resolve_dtype, should_compile
from memory import check_fits, param_count, training_bytes
from model import GPT, GPTConfig
from tokenizer import read_meta, tokenizer_kind

ROOT = os.path.dirname(os.path.abspath(__file__))
MODEL_FIELDS = tuple(f.name for f in fields(GPTConfig) if f.name != "vocab_size")
# fields that fix a checkpoint's tensor shapes or meaning: a resumed run cannot change them
SHAPE_FIELDS = tuple(f for f in MODEL_FIELDS if f not in ("dropout", "attn_impl"))
FIXED_ON_RESUME = SHAPE_FIELDS + ("optimizer",)  # the optimizer state must fit the optimizer
# fields about this machine and this invocation: a resumed run never takes them from the checkpoint
LOCAL_FIELDS = ("out_dir", "init_from", "eval_only", "device", "dtype", "compile", "backend", "peak_flops")


@dataclass
class TrainConfig:
    help_from = (GPTConfig,)  # --help takes the model fields' comments from there
    # I/O
    out_dir: str = "out"  # checkpoints and log.jsonl go here
    eval_interval: int = 2000  # evaluate (and save) every this many iters
    log_interval: int = 1  # print and log the training loss every this many iters
    eval_iters: int = 200  # batches per split in each evaluation
    eval_only: bool = False  # evaluate once and exit
    always_save_checkpoint: bool = True  # False: at evals, write ckpt.pt only when val loss improves
    keep_best: bool = True  # also keep best.pt, the checkpoint with the best val loss
    init_from: str = "scratch"  # "scratch", "resume" (out_dir/ckpt.pt), or GPT-2 weights: gpt2, gpt2-medium, ..., a local HF dir
    wandb_log: bool = False  # also log to Weights & Biases (pip install wandb)
    wandb_project: str = "owt"
    wandb_run_name: str = "gpt2"
    # data
    dataset: str = "openwebtext"  # data/<dataset>/, or a path to a directory
    gradient_accumulation_steps: int = 5 * 8  # micro-batches per iter, over all processes
    batch_size: int = 12  # micro-batch size, per process
    block_size: int = 1024  # context length of the training windows (and the model)
    # model (see GPTConfig)
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dropout: float = 0.0
    bias: bool = True
    attn_impl: str = "sdpa"
    pos_emb: str = "learned"
    rope_base: float = 10000.0
    norm: str = "layernorm"
    norm_eps: float = 1e-5
    activation: str = "gelu"
    mlp_hidden: int | None = None
    n_kv_head: int | None = None
    tie_weights: bool = True
    # optimizer: AdamW, or Muon for the blocks' matrices with AdamW for the rest
    optimizer: str = "adamw"  # "adamw" or "muon"
    muon_lr: float = 0.02  # Muon's peak learning rate (scheduled like learning_rate)
    muon_momentum: float = 0.95
    muon_weight_decay: float = 0.0
    learning_rate: float = 6e-4  # AdamW's peak learning rate
    max_iters: int = 600000  # total optimizer steps
    weight_decay: float = 1e-1  # AdamW's decoupled decay, for matrices and embeddings only
    beta1: float = 0.9  # AdamW's first-moment decay
    beta2: float = 0.95  # AdamW's second-moment decay
    grad_clip: float = 1.0  # 0 disables clipping
    # schedule: linear warmup, then cosine decay to min_lr ("cosine"), or constant then a linear
    # cool-down to min_lr over the last cooldown_iters before lr_decay_iters ("wsd": warmup-stable-decay)
    decay_lr: bool = True  # False: learning_rate throughout
    lr_schedule: str = "cosine"  # "cosine" or "wsd"
    cooldown_iters: int = 0  # wsd: iters of linear decay at the end
    warmup_iters: int = 2000  # iters of linear warmup from 0
    lr_decay_iters: int = 600000  # ~ max_iters, per Chinchilla
    min_lr: float = 6e-5  # ~ learning_rate / 10
    # system
    device: str = "auto"  # auto (cuda, else mps, else cpu), cpu, cuda, cuda:1, mps
    dtype: str = "auto"  # auto (bfloat16 on CUDA where supported, else float16; float32 on CPU)
    compile: bool | None = None  # torch.compile the model; None: on CUDA yes (it pays off), elsewhere no
    backend: str = "auto"  # torch.distributed backend: auto (nccl on CUDA, gloo on CPU), nccl, gloo
    seed: int = 1337  # initial weights, batches and dropout all follow from it
    peak_flops: float | None = None  # the device's peak FLOP/s for MFU (bench.py measures it)
    # measurement: val loss over fixed windows, and stopping at a target
    eval_windows: int = 0  # > 0: val loss over this many fixed block_size windows spread over val, not eval_iters batches
    target_loss: float | None = None  # stop once val loss <= target_loss (and report the training time it took)

    def __post_init__(self):
        self.model_config(vocab_size=1)  # validates the model fields
        if self.init_from not in ("scratch", "resume") and not is_pretrained(self.init_from):
            raise ValueError(f"init_from must be scratch, resume, gpt2, gpt2-medium, gpt2-large, gpt2-xl or a local "
                             f"Hugging Face GPT-2 directory, got {self.init_from!r}")
        if self.optimizer not in ("adamw", "muon"):
            raise ValueError(f"optimizer must be adamw or muon, got {self.optimizer!r}")
        if self.lr_schedule not in ("cosine", "wsd"):
            raise ValueError(f"lr_schedule must be cosine or wsd, got {self.lr_schedule!r}")
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise ValueError(f"dtype must be auto, float32, bfloat16 or float16, got {self.dtype!r}")
        for name in ("batch_size", "gradient_accumulation_steps", "eval_interval", "log_interval", "eval_iters"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        for name in ("max_iters", "warmup_iters", "lr_decay_iters", "learning_rate", "min_lr", "grad_clip",
                     "cooldown_iters", "eval_windows", "muon_lr", "weight_decay", "muon_weight_decay"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        for name in ("beta1", "beta2", "muon_momentum"):
            if not 0 <= getattr(self, name) < 1:
                raise ValueError(f"{name} must be in [0, 1), got {getattr(self, name)}")
        if not 0 <= self.seed < 1 << 64:
            raise ValueError(f"seed must be in [0, 2^64), got {self.seed}")
        if self.peak_flops is not None and self.peak_flops <= 0:
            raise ValueError(f"peak_flops must be > 0 (or None), got {self.peak_flops}")

    def model_config(self, vocab_size):
        return GPTConfig(vocab_size=vocab_size, **{k: getattr(self, k) for k in MODEL_FIELDS})


def get_lr(it, cfg):
    """Linear warmup for warmup_iters; then cosine decay to min_lr at lr_decay_iters, or (wsd) the
    peak until cooldown_iters before lr_decay_iters and a linear decay to min_lr there; then min_lr."""
    if not cfg.decay_lr:
        return cfg.learning_rate
    if it < cfg.warmup_iters:
        return cfg.learning_rate * (it + 1) / (cfg.warmup_iters + 1)
    if it >= cfg.lr_decay_iters:
        return cfg.min_lr
    if cfg.lr_schedule == "wsd":
        left = cfg.lr_decay_iters - it  # > 0
        if left >= cfg.cooldown_iters:
            return cfg.learning_rate
        return cfg.min_lr + (cfg.learning_rate - cfg.min_lr) * left / cfg.cooldown_iters
    ratio = (it - cfg.warmup_iters) / (cfg.lr_decay_iters - cfg.warmup_iters)  # > 0: it < lr_decay_iters
    return cfg.min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (cfg.learning_rate - cfg.min_lr)


def rng_state():
    """Every RNG a run may use, as tensors and plain types (weights_only loading accepts them)."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    return {"torch": torch.get_rng_state(), "numpy": [kind, keys.tolist(), pos, has_gauss, gauss],
            "python": random.getstate(), "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []}


def set_rng_state(state):
    torch.set_rng_state(state["torch"])
    kind, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, gauss))
    random.setstate(state["python"])
    if state.get("cuda") and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# what loading a damaged optimizer, scaler or RNG state raises
DAMAGED = (ValueError, KeyError, TypeError, IndexError, RuntimeError, AttributeError, OverflowError)


def resume_config(ckpt, overrides, path):
    """The checkpoint's config, with the user's overrides unless they would change the model."""
    hints = typing.get_type_hints(TrainConfig)
    saved = {k: convert(v, hints[k], k, f"{path}: config") for k, v in (ckpt.get("config") or {}).items()
             if k in hints and k not in LOCAL_FIELDS}
    model_args = ckpt["model_args"]
    default = GPTConfig()
    for key in SHAPE_FIELDS:  # model_args is the truth about the weights
        saved[key] = model_args.get(key, getattr(default, key))
    saved.setdefault("optimizer", "adamw")  # nanoGPT's
    for key, value in overrides.items():
        if key in FIXED_ON_RESUME and value != saved[key]:
            raise UserError(f"--{key}={value!r} contradicts the checkpoint's {key}={saved[key]!r} ({path}); "
                            f"a resumed run keeps the model's shape and optimizer: train from scratch in a new "
                            f"out_dir to change them")
    try:
        base = TrainConfig(**saved)
        return base, TrainConfig(**{**saved, **overrides})
    except (TypeError, ValueError) as e:
        raise UserError(f"{path}: its saved config does not fit: {e}") from None


def check_vocab(model_vocab, meta, data_dir, path):
    if meta is None:
        return
    vocab = meta.get("vocab_size")
    char = tokenizer_kind(meta) == "char"
    if vocab is not None and (vocab > model_vocab or (char and vocab != model_vocab)):
        raise UserError(f"{path} was trained on a vocabulary of {model_vocab} tokens but {data_dir} has {vocab}; "
                        f"resume with the dataset it was trained on (--dataset)")


def setup_distributed(cfg):
    """(rank, local_rank, world_size) from torchrun's environment; (0, 0, 1) when run plainly."""
    if "RANK" not in os.environ:
        return 0, 0, 1
    rank, local_rank, world = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"]), int(os.environ["WORLD_SIZE"])
    if cfg.gradient_accumulation_steps % world:
        raise UserError(f"gradient_accumulation_steps ({cfg.gradient_accumulation_steps}) must be divisible by "
                        f"the number of processes ({world}): it counts micro-batches over all of them")
    use_cuda = cfg.device in ("auto", "cuda") and torch.cuda.is_available() or cfg.device.startswith("cuda")
    backend = cfg.backend if cfg.backend != "auto" else ("nccl" if use_cuda else "gloo")
    if use_cuda:
        torch.cuda.set_device(local_rank)
    dist.init_process_group(backend=backend)
    return rank, local_rank, world


class Interrupted(Exception):
    """Raised by the first SIGINT/SIGTERM in work that can be abandoned."""


class StopFlag:
    """SIGINT/SIGTERM: the first stops the run within moments, the second at once.

    The first abandons what is in flight (start-up, a compile, an evaluation,
    the forward and backward of an iteration, whose weights are untouched until
    the optimizer step) by raising Interrupted; inside a `finishing()` section
    (the optimizer step, a save) it waits for the section's end. Under DDP
    (abandon=False) ranks must stop together, so it only sets the flag and the
    ranks agree at a log iteration. A second signal raises KeyboardInterrupt
    wherever the run is: nothing more is saved.
    """

    def __init__(self):
        self.set, self.abandon, self.finishing_depth = False, True, 0
        self.previous = {s: signal.signal(s, self.handle) for s in (signal.SIGINT, signal.SIGTERM)}

    def handle(self, signum, frame):
        if self.set:
            raise KeyboardInterrupt(f"stopped at once by a second {signal.Signals(signum).name}; nothing more saved")
        self.set = True
        if self.abandon and not self.finishing_depth:
            raise Interrupted()

    @contextmanager
    def finishing(self):
        """A section a first signal lets finish."""
        self.finishing_depth += 1
        try:
            yield
        finally:
            self.finishing_depth -= 1

    def restore(self):
        for s, handler in self.previous.items():
            signal.signal(s, handler)


def train(cfg, overrides=None, log=print, t_start=None):
    """Run training as cfg says; returns a summary dict (iters, losses, time).

    t_start: when the clock for "training time" started (the process start for the script).
    """
    t_start = t_start or time.time()
    stop = StopFlag()  # first: a signal during start-up stops the run at once, with nothing saved
    lock = OutDirLock(cfg.out_dir)  # taken once the run is about to write
    world = 1
    try:
        rank, local_rank, world = setup_distributed(cfg)
        stop.abandon = world == 1  # DDP ranks stop together, at a log iteration
        master = rank == 0
        log = log if master else (lambda *a, **k: None)
        summary = run(cfg, overrides or {}, rank, local_rank, world, master, log, t_start, stop, lock)
        if world > 1:  # rank 0 saves last: no rank tears down its connections while another still uses them
            dist.barrier()
        return summary
    except Interrupted:
        log("interrupted during start-up: nothing saved")
        return {"iters": None, "val_loss": None, "best_val_loss": None, "time": time.time() - t_start,
                "train_time": None, "interrupted": True, "reached": None}
    finally:
        lock.release()
        stop.restore()
        if world > 1:
            dist.destroy_process_group()


def run(cfg, overrides, rank, local_rank, world, master, log, t_start, stop, lock):
    ckpt_path = os.path.join(cfg.out_dir, "ckpt.pt")
    ckpt = None
    if cfg.init_from == "resume":
        ckpt = load_checkpoint(ckpt_path)
        base, cfg = resume_config(ckpt, overrides, ckpt_path)
    else:
        base = TrainConfig()
    report_overrides(overrides, base, log)
    device = resolve_device(cfg.device, local_rank)
    dtype = resolve_dtype(cfg.dtype, device)
    data_dir = dataset_dir(cfg.dataset)
    meta = read_meta(data_dir)
    batches = Batches(data_dir, cfg.block_size, cfg.batch_size, device, cfg.seed, meta)

    torch.manual_seed(cfg.seed)  # the same initial weights on every rank
    if ckpt is not None:
        model = model_from_checkpoint(ckpt, ckpt_path, attn_impl=cfg.attn_impl, dropout=cfg.dropout)
        check_vocab(model.config.vocab_size, meta, data_dir, ckpt_path)
    elif cfg.init_from != "scratch":
        model = load_pretrained(cfg.init_from, dropout=cfg.dropout, attn_impl=cfg.attn_impl)
        check_vocab(model.config.vocab_size, meta, data_dir, cfg.init_from)
        if cfg.block_size > model.config.block_size:
            raise UserError(f"block_size ({cfg.block_size}) is longer than {cfg.init_from}'s context "
                            f"({model.config.block_size}); use --block_size={model.config.block_size} or less")
        model.crop_block_size(cfg.block_size)
        shape = {k: getattr(model.config, k) for k in SHAPE_FIELDS}  # the weights decide the model's shape
        changed = [f"{k}={v}" for k, v in shape.items() if getattr(cfg, k) != v]
        if changed:
            log(f"from {cfg.init_from}: {', '.join(changed)}")
        cfg = replace(cfg, **shape)
    else:
        config = cfg.model_config(vocab_size=(meta or {}).get("vocab_size", 50304))
        check_fits(training_bytes(config, cfg.batch_size), device,
                   f"training {param_count(config) / 1e6:,.1f}M parameters on micro-batches of {cfg.batch_size} x "
                   f"{cfg.block_size} tokens", "lower batch_size (raise gradient_accumulation_steps to keep the "
                   "batch), block_size, n_layer or n_embd")
        model = GPT(config)
    batches.vocab_size = model.config.vocab_size  # a token id beyond it is an error, not an index fault
    torch.manual_seed(cfg.seed + rank)  # distinct dropout masks per rank
    model.to(device)
    optimizer = model.configure_optimizers(cfg.weight_decay, cfg.learning_rate, (cfg.beta1, cfg.beta2), device.type,
                                           cfg.optimizer, cfg.muon_lr, cfg.muon_momentum, cfg.muon_weight_decay)
    scaler = torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)
    iter_num, best_val_loss = 0, float("inf")
    if ckpt is not None:
        peaks = [group["initial_lr"] for group in optimizer.param_groups]  # this run's peaks, not the saved ones
        try:
            optimizer.load_state_dict(ckpt["optimizer"])
        except DAMAGED as e:
            raise UserError(f"{ckpt_path}: its optimizer state does not fit optimizer={cfg.optimizer} ({e})") from None
        for group, peak in zip(optimizer.param_groups, peaks):
            group["initial_lr"] = peak
        if ckpt.get("iter_num") is None:
            raise UserError(f"{ckpt_path} has no iter_num: it cannot be resumed (sample from it, or train anew)")
        best = ckpt.get("best_val_loss")
        iter_num, best_val_loss = int(ckpt["iter_num"]), float(best) if best is not None else float("inf")  # nanoGPT: a tensor
        try:
            if "scaler" in ckpt:
                scaler.load_state_dict(ckpt["scaler"])
            has_rng = rank < len(ckpt.get("rng") or [])
            if has_rng:
                set_rng_state(ckpt["rng"][rank])
        except DAMAGED as e:
            raise UserError(f"{ckpt_path}: its RNG or gradient-scaler state is damaged ({type(e).__name__}: {e})") from None
        if not has_rng:
            log(f"note: {ckpt_path} has no RNG state (a nanoGPT checkpoint?): resuming with fresh dropout RNG")
        log(f"resuming from {ckpt_path} at iter {iter_num}")
    del ckpt
    raw_model = model
    if should_compile(cfg.compile, device):
        log("compiling the model... (takes a minute)")
        model = torch.compile(model)
    if world > 1:
        model = DDP(model, device_ids=[local_rank] if device.type == "cuda" else None)
    ctx = autocast(device, dtype)
    accum = cfg.gradient_accumulation_steps // world
    tokens_per_iter = cfg.gradient_accumulation_steps * cfg.batch_size * cfg.block_size
    peak = cfg.peak_flops or peak_flops_for(device, dtype)
    log(f"model: {raw_model.get_num_params() / 1e6:.2f}M parameters; device {device}, {str(dtype)[6:]}, "
        f"{world} process(es); {tokens_per_iter:,} tokens per iter")

    for note in startup_notes(cfg, raw_model, device, tokens_per_iter, ckpt_path):
        log(f"note: {note}")

    logger = JsonLog(os.path.join(cfg.out_dir, "log.jsonl"), cfg, master and not cfg.eval_only)
    if master and not cfg.eval_only:  # a writer: out_dir is ours until the run ends (eval_only only reads)
        lock.acquire()
    say = tqdm.write if master else (lambda text: None)
    start_iter, loss_accum, last_val = iter_num, None, None
    eval_time = 0.0  # seconds spent evaluating and saving: training time is wall time since t_start less this
    reached = None  # (iter, training seconds) when val loss first reached target_loss

    def save(name, rng=None):
        bad = [n for n, p in raw_model.named_parameters() if not torch.isfinite(p).all()]
        if bad:
            raise UserError(f"the weights are not finite at iter {iter_num} ({bad[0]}); not saving {name}: the last "
                            f"good checkpoint is kept (lower learning_rate or raise warmup_iters)")
        state = {"model": raw_model.state_dict(), "optimizer": optimizer.state_dict(),
                 "model_args": raw_model.config.model_args(), "iter_num": iter_num,
                 "best_val_loss": best_val_loss, "config": asdict(cfg), "scaler": scaler.state_dict(),
                 "rng": rng or gather_rng(world)}
        if master:
            with stop.finishing():
                save_checkpoint(state, os.path.join(cfg.out_dir, name))

    bar = tqdm(total=cfg.max_iters, initial=iter_num, disable=not master or None, desc="train", unit="iter")
    rng_at_iter = None  # RNG state when the iteration in flight began: an abandoned one is saved with it
    try:
        t_mark, iters_mark, eval_mark = time.time(), iter_num, 0.0  # the last log's time, iter and eval_time
        while True:
            last = iter_num >= cfg.max_iters
            if cfg.eval_only or last or (iter_num % cfg.eval_interval == 0 and iter_num != start_iter) or iter_num == 0:
                t_eval = time.time()
                train_time = t_eval - t_start - eval_time
                losses = estimate_loss(model, batches, cfg, ctx, rank, world)
                last_val = losses["val"]
                say(f"iter {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
                logger.write(kind="eval", iter=iter_num, train_loss=losses["train"], val_loss=losses["val"],
                             time=t_eval - t_start, train_time=train_time)
                if cfg.target_loss is not None and losses["val"] <= cfg.target_loss and reached is None:
                    reached = (iter_num, train_time)
                    say(f"reached val loss {losses['val']:.4f} <= {cfg.target_loss} at iter {iter_num} after "
                        f"{train_time:.1f}s of training (from process start, evaluation excluded)")
                    last = True
                if not math.isfinite(losses["val"]):
                    raise UserError(f"val loss is {losses['val']} at iter {iter_num}; the run diverged (lower "
                                    f"learning_rate or raise warmup_iters); the last good checkpoint is kept")
                if cfg.eval_only:
                    break
                improved = losses["val"] < best_val_loss
                best_val_loss = min(best_val_loss, losses["val"])
                if iter_num > start_iter:
                    if improved or cfg.always_save_checkpoint or last:
                        save("ckpt.pt")
                    if improved and cfg.keep_best:
                        save("best.pt")
                eval_time += time.time() - t_eval
            if last or stop_agreed(stop, world, iter_num, cfg):
                break

            if stop.abandon:
                rng_at_iter = [rng_state()]
            lr = get_lr(iter_num, cfg)
            scale = lr / cfg.learning_rate if cfg.learning_rate else 0.0
            for group in optimizer.param_groups:  # every group follows the schedule from its own peak
                group["lr"] = group["initial_lr"] * scale
            loss_accum = torch.zeros((), device=device)
            for micro in range(accum):
                x, y = batches.get("train", (0, iter_num, rank * accum + micro))
                sync = world == 1 or micro == accum - 1  # DDP all-reduces grads on the last micro-step only
                with (nullcontext() if sync else model.no_sync()), ctx:
                    _, loss = model(x, y)
                    loss = loss / accum
                scaler.scale(loss).backward()
                loss_accum += loss.detach()
            with stop.finishing():  # from the optimizer step on, the iteration completes
                if cfg.grad_clip > 0:
                    scaler.unscale_(optimizer)
                    torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
                scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad(set_to_none=True)
                iter_num += 1
                rng_at_iter = None
                bar.update(1)

                if iter_num % cfg.log_interval == 0:
                    if world > 1:  # log the loss of the whole global batch, not rank 0's share
                        dist.all_reduce(loss_accum)
                        loss_accum /= world
                    lossf = loss_accum.item()  # sync point: only on log iterations
                    if not math.isfinite(lossf):
                        raise UserError(f"training loss is {lossf} at iter {iter_num}; the run diverged (lower "
                                        f"learning_rate or raise warmup_iters); the last good checkpoint is kept")
                    now = time.time()
                    dt = (now - t_mark - (eval_time - eval_mark)) / (iter_num - iters_mark)  # evals excluded
                    t_mark, iters_mark, eval_mark = now, iter_num, eval_time
                    mfu = raw_model.estimate_mfu(cfg.gradient_accumulation_steps * cfg.batch_size, dt, peak) if peak else None
                    say(f"iter {iter_num}: loss {lossf:.4f}, lr {lr:.2e}, {dt * 1000:.1f} ms/iter, "
                        f"{tokens_per_iter / dt:,.0f} tok/s" + (f", mfu {mfu * 100:.1f}%" if mfu is not None else ""))
                    logger.write(kind="train", iter=iter_num, loss=lossf, lr=lr, ms=dt * 1000,
                                 tok_s=tokens_per_iter / dt, mfu=mfu, time=now - t_start,
                                 train_time=now - t_start - eval_time)
    except Interrupted:  # the iteration in flight (or the evaluation) is abandoned; the weights are untouched
        optimizer.zero_grad(set_to_none=True)
    finally:
        bar.close()
        logger.close()

    if stop.set and not cfg.eval_only:
        if iter_num > start_iter:
            save("ckpt.pt", rng=rng_at_iter)
            log(f"interrupted: saved {os.path.join(cfg.out_dir, 'ckpt.pt')} at iter {iter_num}; continue with "
                f"python train.py --init_from=resume --out_dir={shlex.quote(cfg.out_dir)}")
        else:
            log(f"interrupted at iter {iter_num}, before this run completed an iteration: nothing saved")
    summary = {"iters": iter_num, "val_loss": last_val, "best_val_loss": best_val_loss,
               "time": time.time() - t_start, "train_time": time.time() - t_start - eval_time,
               "interrupted": stop.set, "reached": reached}
    if cfg.target_loss is not None and reached is None and last_val is not None:
        log(f"did not reach val loss {cfg.target_loss} in {iter_num} iters (last {last_val:.4f})")
    if last_val is not None and not cfg.eval_only and not stop.set:
        log(f"done: {iter_num} iters in {summary['time']:.1f}s; val loss {last_val:.4f} (best {best_val_loss:.4f}); "
            f"checkpoint {ckpt_path}")
    return summary


# a training iteration on a CPU reaches about this fraction of a plain matmul's FLOP/s
CPU_TRAINING_EFFICIENCY = 0.5


def startup_notes(cfg, model, device, tokens_per_iter, ckpt_path):
    """Warnings worth a line before a run starts: a GPU-sized run on a CPU, a warmup longer than the run,
    a scratch run about to replace a checkpoint."""
    notes = []
    if device.type == "cpu" and not cfg.eval_only:
        flops_per_token = model.flops_per_token()
        rate = CPU_TRAINING_EFFICIENCY * cpu_matmul_flops()
        per_iter = flops_per_token * tokens_per_iter / rate
        per_eval = 2 * cfg.eval_iters * cfg.batch_size * cfg.block_size * flops_per_token / 3 / rate  # forward only
        if per_iter > 1.0:
            laptop = f"config/{os.path.basename(os.path.normpath(cfg.dataset))}_cpu.py"
            if not os.path.exists(os.path.join(ROOT, laptop)):
                laptop = "a smaller batch_size, block_size, n_layer and n_embd (see config/shakespeare_char_cpu.py)"
            notes.append(f"this run is sized for a GPU: on this CPU an iter takes about {fmt_seconds(per_iter)} and "
                         f"each evaluation about {fmt_seconds(per_eval)}, {fmt_seconds(cfg.max_iters * per_iter)} "
                         f"for {cfg.max_iters} iters; for a laptop-sized run use {laptop}")
    if cfg.decay_lr and 0 < cfg.max_iters <= cfg.warmup_iters:
        reached = get_lr(cfg.max_iters - 1, cfg)
        notes.append(f"warmup_iters ({cfg.warmup_iters}) >= max_iters ({cfg.max_iters}): the learning rate rises "
                     f"only to {reached:.2e} of its {cfg.learning_rate:.2e}; lower warmup_iters to reach it")
    if cfg.init_from != "resume" and not cfg.eval_only and os.path.exists(ckpt_path):
        notes.append(f"{ckpt_path} holds an earlier run; this {cfg.init_from} run replaces it at its first save "
                     f"(--init_from=resume would continue it instead; --out_dir=DIR keeps both)")
    return notes


def fmt_seconds(s):
    return f"{s:.1f} s" if s < 90 else f"{s / 60:.0f} min" if s < 5400 else f"{s / 3600:.1f} h"


def gather_rng(world):
    """Every rank's RNG state (rank 0 saves them all), so each resumes its own dropout stream."""
    state = rng_state()
    if world == 1:
        return [state]
    states = [None] * world
    dist.all_gather_object(states, state)
    return states


def stop_agreed(stop, world, iter_num, cfg):
    """True when a signal asked to stop; under DDP every rank must agree at the same iteration."""
    if world == 1:
        return stop.set
    if iter_num % cfg.log_interval:  # an all-reduce costs a sync: agree only on log iterations
        return False
    flag = torch.tensor([float(stop.set)], device="cuda" if dist.get_backend() == "nccl" else "cpu")
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    stop.set = bool(flag.item())
    return stop.set


class JsonLog:
    """Metrics as JSON lines in out_dir/log.jsonl, and to Weights & Biases with wandb_log.

    Opened on the first write, so a run that fails before it leaves out_dir (and wandb) alone.
    """

    def __init__(self, path, cfg, active):
        self.path, self.active, self.file = path, active, None
        self.header = {"kind": "config", **asdict(cfg)}
        self.wandb = None
        if active and cfg.wandb_log:
            try:
                import wandb
            except ImportError:
                raise UserError("wandb_log=True needs wandb: pip install wandb (or drop --wandb_log)") from None
            self.wandb, self.wandb_args = wandb, dict(project=cfg.wandb_project, name=cfg.wandb_run_name,
                                                      config=asdict(cfg))

    def write(self, **record):
        if not self.active:
            return
        if self.file is None:
            os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
            self.file = open(self.path, "a", encoding="utf-8")
            self.file.write(json.dumps(self.header) + "\n")
            if self.wandb is not None:
                self.wandb.init(**self.wandb_args)
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()
        if self.wandb is not None:  # e.g. train/loss, eval/val_loss, at step iter
            self.wandb.log({f"{record['kind']}/{k}": v for k, v in record.items() if k not in ("kind", "iter")},
                           step=record["iter"])

    def close(self):
        if self.file is not None:
            self.file.close()


def main(argv):
    cfg, overrides = parse_args(TrainConfig, argv)
    train(cfg, overrides, t_start=PROCESS_START)


if __name__ == "__main__":
    run_main(main)
