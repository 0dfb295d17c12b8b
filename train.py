"""Train a GPT by teacher forcing: every position predicts the next token, all at once.

    python train.py config/shakespeare_char_cpu.py
    python train.py config/shakespeare_char.py --batch_size=32 --compile=False
    python train.py --init_from=resume --out_dir=out-shakespeare-char --max_iters=6000
    torchrun --standalone --nproc_per_node=2 train.py config/shakespeare_char_cpu.py
    torchrun --standalone --nproc_per_node=2 train.py config/shakespeare_char_cpu.py --parallel=fsdp

Writes out_dir/ckpt.pt (latest), out_dir/best.pt (best val loss) and
out_dir/log.jsonl (one JSON object per log line); with --parallel=fsdp the
checkpoints are sharded directories, ckpt.dcp and best.dcp (checkpoint.py). Ctrl-C saves the last
completed iteration and exits; a second Ctrl-C exits at once.
"""
import time

PROCESS_START = time.time()  # before the heavy imports: "training time" counts from here

from nanogpt import program

program.exit_quietly_on_ctrl_c()  # before the slow imports (torch): Ctrl-C during them exits quietly

# ruff: noqa: E402
import math
import os
import shlex
import typing
from contextlib import nullcontext
from dataclasses import asdict, fields, replace

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from tqdm import tqdm

from nanogpt import REPOSITORY
from nanogpt.batches import TRAINING, dataset_dir, estimate_loss, make_batches
from nanogpt.checkpoint import (RUNTIME_FIELDS, OutDirLock, config_from_model_args, discard, finetune_source,
                        interrupted_save, latest_form, load_checkpoint, load_sharded,
                        model_args, model_from_checkpoint, rng_state, save_checkpoint, save_sharded, set_rng_state,
                        sharded_path)
from nanogpt.hf import load_pretrained
from configurator import convert, parse_args, read_config_file, report_overrides
from nanogpt.program import run_main
from nanogpt.errors import UserError
from nanogpt.device import (autocast, batch_seconds, peak_flops_for, resolve_device, resolve_dtype, should_compile,
                    training_kernels)
from nanogpt.memory import check_fits, param_count, training_bytes
from nanogpt.metrics import Clock, Metrics
from model import GPT, GPTConfig
from nanogpt.optim import OptimizerSettings, configure_optimizers, lr_scale
from nanogpt.sharding import checkpoint_activations, first_non_finite, held_bytes, load_optimizer_state, no_gradient_sync, shard
from nanogpt.stopping import Interrupted, StopFlag
from nanogpt.tokenizer import base_meta, read_meta, token_byte_lengths, tokenizer_from_meta, tokenizer_kind
from nanogpt.train_config import TrainConfig
from nanogpt.train_tasks import task_scores

# the model's fields that fix what its weights mean: a resumed run keeps the checkpoint's
SHAPE_FIELDS = tuple(f.name for f in fields(GPTConfig) if f.name not in RUNTIME_FIELDS)
FIXED_ON_RESUME = SHAPE_FIELDS + ("optimizer",)  # the optimizer state must fit the optimizer
# fields about this machine and this invocation: a resumed run never takes them from the checkpoint
LOCAL_FIELDS = ("out_dir", "init_from", "eval_only", "device", "dtype", "compile", "backend", "peak_flops",
                "packed_linear", "matmul_dtype")
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
    if "embedding_lr" in overrides and (overrides["embedding_lr"] is None) != (saved.get("embedding_lr") is None):
        raise UserError(f"--embedding_lr={overrides['embedding_lr']!r} would add or remove the embeddings' own "
                        f"optimizer group, which the checkpoint's optimizer state {'lacks' if saved.get('embedding_lr') is None else 'has'} "
                        f"({path}); change its value, not whether it is set, or train anew in a new out_dir")
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


def check_same_tokenizer(trained, meta, source, data_dir, log):
    """A fine-tuning dataset must tokenize as the checkpoint's did (a chat dataset: its base tokenizer)."""
    if trained is None or meta is None:
        log(f"note: {source if trained is None else data_dir} names no tokenizer; assuming the two agree")
        return
    def signature(m):
        m = base_meta(m)
        return (tokenizer_kind(m), m.get("chars") or m.get("itos"), m.get("pattern"), m.get("ranks_text"))
    if signature(trained) != signature(meta):
        raise UserError(f"{data_dir}'s tokenizer is not the one {source} was trained with; prepare the fine-tuning "
                        f"data on the model's own dataset (python data/chat/prepare.py --base THAT_DATASET ...)")


def grow_vocab(ckpt, vocab_size):
    """Grow the checkpoint's token embeddings (wte, the head, value embeddings) to vocab_size rows, in place;
    each new row is the mean of the old ones, so new tokens start as an average token. Returns (old, new) or None."""
    old = ckpt["model_args"].get("vocab_size", GPTConfig().vocab_size)
    if vocab_size <= old:
        return None
    for name, weight in list(ckpt["model"].items()):
        is_table = name.endswith(("wte.weight", "lm_head.weight")) or ".ve." in name
        if is_table and weight.dim() == 2 and weight.size(0) == old:
            mean = weight.float().mean(0, keepdim=True).to(weight.dtype)
            ckpt["model"][name] = torch.cat([weight, mean.expand(vocab_size - old, -1)])
    ckpt["model_args"] = {**ckpt["model_args"], "vocab_size": vocab_size}
    return old, vocab_size


def setup_distributed(cfg):
    """(rank, local_rank, world_size) from torchrun's environment; (0, 0, 1) when run plainly."""
    if "RANK" not in os.environ:
        return 0, 0, 1
    rank, local_rank, world = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"]), int(os.environ["WORLD_SIZE"])
    use_cuda = cfg.device in ("auto", "cuda") and torch.cuda.is_available() or cfg.device.startswith("cuda")
    backend = cfg.backend if cfg.backend != "auto" else ("nccl" if use_cuda else "gloo")
    if use_cuda:
        torch.cuda.set_device(local_rank)
    dist.init_process_group(backend=backend)
    return rank, local_rank, world


def micro_batches(gradient_accumulation_steps, world, source=""):
    """Micro-batches each process runs per iter: gradient_accumulation_steps counts them over all processes,
    so it must split evenly; source says where the value came from (a checkpoint's config)."""
    if gradient_accumulation_steps % world:
        up = -(-gradient_accumulation_steps // world) * world
        raise UserError(f"gradient_accumulation_steps ({gradient_accumulation_steps}{source}) must be divisible by "
                        f"the number of processes ({world}): it counts micro-batches over all of them; run a number "
                        f"of processes that divides it, or pass --gradient_accumulation_steps=N with N a multiple "
                        f"of {world} (e.g. {up}, a global batch of N x batch_size)")
    return gradient_accumulation_steps // world


def run_config(cfg, overrides, ckpt_path, world):
    """(cfg, base, ckpt): the config this run trains with (a resume's is the checkpoint's, with the overrides),
    what the overrides are reported against, and the checkpoint to resume (None for a new run)."""
    if cfg.init_from != "resume":
        micro_batches(cfg.gradient_accumulation_steps, world)
        return cfg, TrainConfig(), None
    ckpt = load_checkpoint(ckpt_path, weights=False)  # a sharded one's weights load once sharded (restore)
    base, resumed = resume_config(ckpt, overrides, ckpt_path)
    cfg = replace(resumed, **{k: getattr(cfg, k) for k in LOCAL_FIELDS})  # this invocation's, as given
    given = "gradient_accumulation_steps" in overrides
    micro_batches(cfg.gradient_accumulation_steps, world, "" if given else f", {ckpt.get('sharded', ckpt_path)}'s")
    return cfg, base, ckpt


def all_ranks(flag, world):
    """True where flag is true on every process (all of them call it together)."""
    if world == 1:
        return flag
    failed = torch.tensor([int(not flag)], device="cuda" if dist.get_backend() == "nccl" else "cpu")
    dist.all_reduce(failed)
    return failed.item() == 0


def train(cfg, overrides=None, log=print, t_start=None, config_files=()):
    """Run training as cfg says; returns a summary dict (iters, losses, time).

    t_start: when the clock for "training time" started (the process start for the script).
    config_files: the config files cfg was read from (a note on a slow CPU never suggests one of them).
    """
    t_start = t_start or time.time()
    stop = StopFlag()  # first: a signal during start-up stops the run at once, with nothing saved
    lock = OutDirLock(cfg.out_dir)  # taken once the run is about to write
    world = 1
    try:
        rank, local_rank, world = setup_distributed(cfg)
        stop.abandon = world == 1  # DDP ranks stop together, at a log iteration
        log = log if rank == 0 else (lambda *a, **k: None)
        run = Run(cfg, overrides or {}, rank, local_rank, world, log, t_start, stop, lock, config_files)
        with run.kernels.applied(run.raw_model):
            loop(run, stop)
        summary = run.finish(stop)
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


def loop(run, stop):
    """Evaluate when due, then one iteration, until max_iters, the target loss, or a signal."""
    run.clock.lap(run.iter_num)
    try:
        while True:
            last = run.iter_num >= run.cfg.max_iters
            if run.cfg.eval_only or last or run.eval_due():
                last = run.evaluate(last)
            if last or stop.agreed(run.world, run.iter_num, run.cfg.log_interval):
                break
            if stop.abandon and run.cfg.dropout > 0:  # only dropout draws random numbers in an iteration
                run.rng_at_iter = [rng_state()]
            loss = run.forward_backward()
            with stop.finishing():  # from the optimizer step on, the iteration completes
                run.step(loss)
    except Interrupted:  # the iteration in flight (or the evaluation) is abandoned; the weights are untouched
        run.optimizer.zero_grad(set_to_none=True)
    finally:
        run.close()


class Run:
    """One training run: what start-up builds, and the steps the loop takes."""

    def __init__(self, cfg, overrides, rank, local_rank, world, log, t_start, stop, lock, config_files=()):
        self.rank, self.world, self.log, self.stop, self.lock = rank, world, log, stop, lock
        self.master = rank == 0
        self.ckpt_path = ckpt_path = os.path.join(cfg.out_dir, "ckpt.pt")
        if cfg.init_from == "resume":
            if self.master and not cfg.eval_only and interrupted_save(ckpt_path):
                lock.acquire()  # now, not once about to write: it puts back the checkpoint a save moved aside
            if world > 1:
                dist.barrier()  # every rank reads out_dir as rank 0 left it
        cfg, base, ckpt = run_config(cfg, overrides, ckpt_path, world)
        report_overrides(overrides, base, log)
        self.device = device = resolve_device(cfg.device, local_rank)
        dtype = resolve_dtype(cfg.dtype, device)
        data_dir = dataset_dir(cfg.dataset)
        self.tokenizer_meta = meta = read_meta(data_dir)  # saved in each checkpoint: sampling needs no dataset
        self.batches = make_batches(data_dir, cfg.block_size, cfg.batch_size, device, cfg.seed, meta, log)
        self.batches.check_windows("val", cfg.eval_windows)
        torch.manual_seed(cfg.seed)  # the same initial weights on every rank
        self.raw_model, cfg = self.build_model(cfg, ckpt, meta, data_dir, overrides)
        self.cfg = cfg
        if cfg.block_size != self.batches.block_size:  # a fine-tuned checkpoint's context decided it
            self.batches = make_batches(data_dir, cfg.block_size, cfg.batch_size, device, cfg.seed, meta, log)
        self.batches.vocab_size = self.raw_model.config.vocab_size  # a token id beyond it is an error
        torch.manual_seed(cfg.seed + rank)  # distinct dropout masks per rank
        self.raw_model.to(device)
        compile = should_compile(cfg.compile, device)
        self.sharded = self.parallelize(cfg, dtype, compile)
        self.token_bytes = bytes_per_token(meta, self.raw_model.config.vocab_size, device, log)
        self.kernels = training_kernels(cfg, device, dtype, compile, self.sharded, log)
        self.tasks = task_scores(cfg, self.raw_model, meta, rank, self.sharded)  # None without eval_tasks
        self.optimizer = configure_optimizers(self.raw_model, OptimizerSettings.of(cfg, self.kernels.ns_dtype))
        self.scaler = torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)
        restored = self.restore(ckpt) if ckpt is not None else (0, float("inf"), 0.0)
        self.iter_num, self.best_val_loss, trained = restored
        del ckpt
        self.model = self.raw_model
        if compile:
            log("compiling the model... (takes a minute)")
            if not self.sharded:  # sharded Blocks were compiled one by one
                self.model = torch.compile(self.model)
        if world > 1 and not self.sharded:
            self.model = DDP(self.model, device_ids=[local_rank] if device.type == "cuda" else None)
        self.ctx = nullcontext() if self.sharded else autocast(device, dtype)  # FSDP casts per unit itself
        self.accum = micro_batches(cfg.gradient_accumulation_steps, world)
        self.tokens_per_iter = cfg.gradient_accumulation_steps * cfg.batch_size * cfg.block_size
        self.peak = cfg.peak_flops or peak_flops_for(device, dtype)
        log(f"model: {self.raw_model.get_num_params() / 1e6:.2f}M parameters; device {device}, {str(dtype)[6:]}, "
            f"{world} process(es); {self.tokens_per_iter:,} tokens per iter")
        # an earlier run's checkpoint that this new run replaces: kept until this run saves at an evaluation
        self.replacing = self.earlier_run(cfg)
        cpu_time = self.cpu_time(cfg) if device.type == "cpu" and not cfg.eval_only and world == 1 else None
        for note in startup_notes(cfg, ckpt_path, self.iter_num, self.replacing, cpu_time, config_files):
            log(f"note: {note}")
        writer = self.master and not cfg.eval_only  # eval_only only reads out_dir
        self.metrics = Metrics(os.path.join(cfg.out_dir, "log.jsonl"), cfg, log, record=writer, iter=self.iter_num)
        if writer:
            lock.acquire()  # out_dir is ours until the run ends
        self.start_iter, self.last_val, self.lr = self.iter_num, None, None
        self.reached = None  # (iter, training seconds) when val loss first reached target_loss
        self.rng_at_iter = None  # RNG state when the iteration in flight began: an abandoned one is saved with it
        self.clock = Clock(t_start, before=trained)  # a resumed run's clock goes on from its checkpoint's
        self.bar = tqdm(total=cfg.max_iters, initial=self.iter_num, disable=not self.master or None, desc="train",
                        unit="iter")

    def cpu_time(self, cfg):
        """Rough seconds of an iter and of an evaluation on this CPU, from a few passes over the run's first
        micro-batch (one process only: timing a sharded model would need every rank to time it in step)."""
        x, y = self.batches.get("train", (TRAINING, self.iter_num, 0))
        micro = batch_seconds(self.raw_model, x, y, self.ctx)
        eval_rows = cfg.eval_iters * cfg.batch_size + (cfg.eval_windows or cfg.eval_iters * cfg.batch_size)
        return micro * self.accum, micro * eval_rows / x.size(0) / 3  # a forward is about a third of training

    def earlier_run(self, cfg):
        """What out_dir's checkpoint holds where this run is a new one (not a resume) that will save: rank 0's
        view, shared, so that every rank agrees on whether an interrupt saves."""
        found = [earlier_run(self.ckpt_path) if self.master and cfg.init_from != "resume" and not cfg.eval_only
                 else None]
        if self.world > 1:
            dist.broadcast_object_list(found, src=0)
        return found[0]

    def parallelize(self, cfg, dtype, compile):
        """Activation checkpointing, and FSDP's shards under torchrun; True when the model is sharded."""
        if cfg.activation_checkpointing:
            checkpoint_activations(self.raw_model)
        if cfg.parallel != "fsdp":
            return False
        if dtype == torch.float16:
            raise UserError("--parallel=fsdp computes in bfloat16 or float32, not float16 (no gradient scaler for "
                            "shards here): use --dtype=bfloat16, or --parallel=ddp")
        if self.world == 1:
            self.log("note: --parallel=fsdp in one process: nothing to shard, so the model trains whole; "
                     "checkpoints are still sharded directories (run under torchrun to shard)")
            return False
        shard(self.raw_model, self.device, dtype, compile_blocks=compile)
        return True

    def build_model(self, cfg, ckpt, meta, data_dir, overrides=()):
        """The model: from the checkpoint, from GPT-2's weights, or new; and cfg with the shape it has."""
        if ckpt is not None and "sharded" in ckpt:  # its weights are loaded into the model, sharded or not, by restore
            config = config_from_model_args(ckpt["model_args"], ckpt["sharded"],
                                            dict(attn_impl=cfg.attn_impl, dropout=cfg.dropout))
            check_vocab(config.vocab_size, meta, data_dir, ckpt["sharded"])
            self.check_memory(config, cfg.batch_size)
            return GPT(config), cfg
        if ckpt is not None:
            model = model_from_checkpoint(ckpt, self.ckpt_path, attn_impl=cfg.attn_impl, dropout=cfg.dropout)
            check_vocab(model.config.vocab_size, meta, data_dir, self.ckpt_path)
            self.check_memory(model.config, cfg.batch_size, held=(ckpt, model.state_dict()))
            return model, cfg
        source = finetune_source(cfg.init_from)
        if source is not None:
            return self.finetune_model(cfg, source, meta, data_dir, "block_size" in overrides)
        if cfg.init_from != "scratch":
            model = load_pretrained(cfg.init_from, dropout=cfg.dropout, attn_impl=cfg.attn_impl)
            check_vocab(model.config.vocab_size, meta, data_dir, cfg.init_from)
            return self.fit_context(model, cfg, cfg.init_from)
        config = cfg.model_config(vocab_size=(meta or {}).get("vocab_size", cfg.vocab_size))
        self.check_memory(config, cfg.batch_size)
        return GPT(config), replace(cfg, vocab_size=config.vocab_size)

    def check_memory(self, config, batch_size, held=()):
        """Training config on micro-batches of batch_size fits in what the device has free, before training
        allocates it; held: tensors already in memory (a loaded checkpoint) that training's own take over."""
        held_bytes = tensor_bytes(held) if self.device.type == "cpu" else 0  # on a GPU they are not there yet
        check_fits(training_bytes(config, batch_size) - held_bytes, self.device,
                   f"training {param_count(config) / 1e6:,.1f}M parameters on micro-batches of {batch_size} x "
                   f"{config.block_size} tokens", "lower batch_size (raise gradient_accumulation_steps to keep the "
                   "batch), block_size, n_layer or n_embd")

    def finetune_model(self, cfg, source, meta, data_dir, block_size_given):
        """A trained checkpoint's model to fine-tune from iter 0, its embeddings and head grown by the role tokens a
        chat dataset adds; and cfg with the shape it has."""
        ckpt = load_checkpoint(source)
        check_same_tokenizer(ckpt.get("tokenizer"), meta, source, data_dir, self.log)
        vocab = (meta or {}).get("vocab_size", 0)
        grown = grow_vocab(ckpt, vocab)
        if grown:
            self.log(f"from {source}: vocabulary {grown[0]:,} -> {grown[1]:,} (new rows start at the mean embedding)")
        model = model_from_checkpoint(ckpt, source, attn_impl=cfg.attn_impl, dropout=cfg.dropout)
        check_vocab(model.config.vocab_size, meta, data_dir, source)
        if not block_size_given:  # the checkpoint's context, unless a config or the command line says otherwise
            cfg = replace(cfg, block_size=model.config.block_size)
        return self.fit_context(model, cfg, source)

    def fit_context(self, model, cfg, source):
        """A trained model cropped to cfg.block_size (at most its own context) and checked to fit in memory;
        and cfg with the shape the weights decide."""
        if cfg.block_size > model.config.block_size:
            raise UserError(f"block_size ({cfg.block_size}) is longer than {source}'s context "
                            f"({model.config.block_size}); use --block_size={model.config.block_size} or less")
        model.crop_block_size(cfg.block_size)
        self.check_memory(model.config, cfg.batch_size, held=model.state_dict())
        shape = {k: getattr(model.config, k) for k in SHAPE_FIELDS}
        changed = [f"{k}={v}" for k, v in shape.items() if getattr(cfg, k) != v]
        if changed:
            self.log(f"from {source}: {', '.join(changed)}")
        return model, replace(cfg, **shape)

    def restore(self, ckpt):
        """Optimizer, scaler and RNG state from the checkpoint (and a sharded one's weights); returns
        (iter_num, best_val_loss, train_time)."""
        path = ckpt.get("sharded", self.ckpt_path)
        peaks = [group["initial_lr"] for group in self.optimizer.param_groups]  # this run's peaks, not the saved ones
        try:
            if "sharded" in ckpt:  # whatever number of processes wrote it
                load_sharded(self.raw_model, self.optimizer, path)
            elif self.sharded:
                load_optimizer_state(self.raw_model, self.optimizer, ckpt["optimizer"])
            else:
                self.optimizer.load_state_dict(ckpt["optimizer"])
        except DAMAGED as e:
            raise UserError(f"{path}: its optimizer state does not fit optimizer={self.cfg.optimizer} ({e})") from None
        check_optimizer_state(self.raw_model, self.optimizer, path)
        if "sharded" in ckpt and first_non_finite(self.raw_model, self.world):
            raise UserError(f"{path} holds non-finite weights: the run that wrote it diverged; use an earlier "
                            f"checkpoint (best.dcp?) or train again")
        for group, peak in zip(self.optimizer.param_groups, peaks):
            group["initial_lr"] = peak
        if ckpt.get("iter_num") is None:
            raise UserError(f"{path} has no iter_num: it cannot be resumed (sample from it, or train anew)")
        best = ckpt.get("best_val_loss")  # nanoGPT writes a tensor
        iter_num, best_val_loss = int(ckpt["iter_num"]), float(best) if best is not None else float("inf")
        if math.isnan(best_val_loss) or best_val_loss == -math.inf:  # no val loss beats it: best.pt would stay
            self.log(f"note: {path} records best_val_loss={best_val_loss}, which no evaluation can beat; taken as "
                     f"no best yet: the next evaluation writes best.pt")
            best_val_loss = float("inf")
        try:
            if "scaler" in ckpt:
                self.scaler.load_state_dict(ckpt["scaler"])
            has_rng = self.rank < len(ckpt.get("rng") or [])
            if has_rng:
                set_rng_state(ckpt["rng"][self.rank])
        except DAMAGED as e:
            raise UserError(f"{path}: its RNG or gradient-scaler state is damaged ({type(e).__name__}: {e})") from None
        if not has_rng:
            self.log(f"note: {path} has no RNG state (a nanoGPT checkpoint?): resuming with fresh dropout RNG")
        self.log(f"resuming from {path} at iter {iter_num}")
        return iter_num, best_val_loss, trained_before(ckpt, path)

    def eval_due(self):
        return self.iter_num == 0 or (self.iter_num % self.cfg.eval_interval == 0 and self.iter_num != self.start_iter)

    def evaluate(self, last):
        """Losses now, logged; ckpt.pt and best.pt saved as configured. True when the run should end here."""
        cfg, it = self.cfg, self.iter_num
        wall, train_time = self.clock.wall(), self.clock.train_time()
        self.clock.pause()  # evaluating and saving is not training time
        losses = estimate_loss(self.model, self.batches, cfg, self.ctx, self.rank, self.world, self.token_bytes,
                               collective=self.sharded)
        self.last_val, bpb = losses["val"], losses.get("val_bpb")
        self.metrics.write(f"iter {it}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}"
                           + (f", val bpb {bpb:.4f}" if bpb is not None else ""), kind="eval", iter=it,
                           train_loss=losses["train"], val_loss=losses["val"], val_bpb=bpb, time=wall,
                           train_time=train_time)
        if cfg.target_loss is not None and losses["val"] <= cfg.target_loss and self.reached is None:
            self.reached = (it, train_time)
            self.metrics.say(f"reached val loss {losses['val']:.4f} <= {cfg.target_loss} at iter {it} after "
                             f"{train_time:.1f}s of training (from process start, evaluation excluded)")
            last = True
        if not math.isfinite(losses["val"]):
            raise UserError(f"val loss is {losses['val']} at iter {it}; the run diverged (lower learning_rate "
                            f"or raise warmup_iters); the last good checkpoint is kept")
        if self.tasks is not None:
            self.tasks.log(self.metrics, self.ctx, it, time=wall, train_time=train_time)
        if cfg.eval_only:
            return True
        improved = losses["val"] < self.best_val_loss
        self.best_val_loss = min(self.best_val_loss, losses["val"])
        if it > self.start_iter:
            if improved or cfg.always_save_checkpoint or last:
                self.save("ckpt.pt")
                self.replacing = None  # this run's own checkpoint now
            if improved and cfg.keep_best:
                self.save("best.pt")
        self.clock.resume()
        return last

    def forward_backward(self):
        """One iteration's gradients, accumulated over its micro-batches; returns its mean loss (a tensor)."""
        self.lr_scale = lr_scale(self.iter_num, self.cfg)
        for group in self.optimizer.param_groups:  # every group follows the schedule from its own peak
            group["lr"] = group["initial_lr"] * self.lr_scale
        loss_accum = torch.zeros((), device=self.device)
        for micro in range(self.accum):
            x, y = self.batches.get("train", (TRAINING, self.iter_num, self.rank * self.accum + micro))
            sync = self.world == 1 or micro == self.accum - 1  # grads are reduced on the last micro-step only
            with self.accumulating(sync), self.ctx:
                _, loss = self.model(x, y)
                loss = loss / self.accum
            self.scaler.scale(loss).backward()
            loss_accum += loss.detach()
        return loss_accum

    def accumulating(self, sync):
        """Where gradients stay local: every micro-step but the last of an iteration, under torchrun."""
        if sync:
            return nullcontext()
        return no_gradient_sync(self.model) if self.sharded else self.model.no_sync()

    def step(self, loss):
        """The optimizer step that completes the iteration; every log_interval iters, its log line."""
        if self.cfg.grad_clip > 0:
            self.scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.grad_clip)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        if self.iter_num == self.start_iter:
            self.log_memory()
        self.optimizer.zero_grad(set_to_none=True)
        self.iter_num += 1
        self.rng_at_iter = None
        self.bar.update(1)
        if self.iter_num % self.cfg.log_interval == 0:
            self.log_iter(loss)

    def log_memory(self):
        """What this process holds for training, beside activations: its shards under FSDP."""
        held = held_bytes(self.raw_model, self.optimizer)
        self.metrics.write(f"memory per process: parameters {held['params'] / 2**20:,.1f} MiB, gradients "
                           f"{held['grads'] / 2**20:,.1f} MiB, optimizer state {held['optimizer'] / 2**20:,.1f} MiB "
                           f"({self.world} process(es), {self.cfg.parallel})", kind="memory", iter=self.iter_num + 1,
                           world=self.world,
                           parallel=self.cfg.parallel, **held)

    def log_iter(self, loss):
        if self.world > 1:  # log the loss of the whole global batch, not rank 0's share
            dist.all_reduce(loss)
            loss /= self.world
        lossf = loss.item()  # sync point: only on log iterations
        if not math.isfinite(lossf):
            raise UserError(f"training loss is {lossf} at iter {self.iter_num}; the run diverged (lower "
                            f"learning_rate or raise warmup_iters); the last good checkpoint is kept")
        dt = self.clock.lap(self.iter_num)  # seconds per iter since the last log, evaluations excluded
        lr = self.cfg.learning_rate * self.lr_scale
        tok_s = self.tokens_per_iter / dt
        mfu = self.raw_model.estimate_mfu(self.cfg.gradient_accumulation_steps * self.cfg.batch_size, dt,
                                          self.peak) if self.peak else None
        self.metrics.write(f"iter {self.iter_num}: loss {lossf:.4f}, lr {lr:.2e}, {dt * 1000:.1f} ms/iter, "
                           f"{tok_s:,.0f} tok/s" + (f", mfu {mfu * 100:.1f}%" if mfu is not None else ""),
                           kind="train", iter=self.iter_num, loss=lossf, lr=lr, ms=dt * 1000, tok_s=tok_s, mfu=mfu,
                           time=self.clock.wall(), train_time=self.clock.train_time())

    def save(self, name, rng=None):
        """ckpt.pt or best.pt (with --parallel=fsdp: ckpt.dcp or best.dcp), atomically; never non-finite weights.
        The other form of the same checkpoint, older, is removed."""
        if not all_ranks(self.lock.held(), self.world):  # rank 0 holds it; the others agree, and stop together
            raise self.lock.lost()
        bad = first_non_finite(self.raw_model, self.world)
        if bad:
            raise UserError(f"the weights are not finite at iter {self.iter_num} ({bad}); not saving {name}: the last "
                            f"good checkpoint is kept (lower learning_rate or raise warmup_iters)")
        meta = {"model_args": model_args(self.raw_model.config), "iter_num": self.iter_num,
                "best_val_loss": self.best_val_loss, "config": asdict(self.cfg), "scaler": self.scaler.state_dict(),
                "rng": rng or gather_rng(self.world), "tokenizer": self.tokenizer_meta,
                "train_time": self.clock.train_time()}
        path = os.path.join(self.cfg.out_dir, name)
        with self.stop.finishing():
            if self.cfg.parallel == "fsdp":
                save_sharded(meta, self.raw_model, self.optimizer, sharded_path(path), self.rank, self.world)
                stale = path
            else:
                state = {"model": self.raw_model.state_dict(), "optimizer": self.optimizer.state_dict(), **meta}
                if self.master:
                    save_checkpoint(state, path)
                stale = sharded_path(path)
            if self.master and os.path.exists(stale):
                discard(stale)

    def close(self):
        self.bar.close()
        self.metrics.close()

    def finish(self, stop):
        """After the loop: save what a signal interrupted; the summary."""
        cfg, log = self.cfg, self.log
        if stop.set and not cfg.eval_only:
            if self.iter_num > self.start_iter and self.replacing is not None:
                log(f"interrupted at iter {self.iter_num}, before this run saved at an evaluation: nothing saved, so "
                    f"{latest_form(self.ckpt_path)} keeps the earlier run ({self.replacing}); to keep a new run's "
                    f"first iters, train it into another --out_dir or evaluate sooner (--eval_interval)")
            elif self.iter_num > self.start_iter:
                self.save("ckpt.pt", rng=self.rng_at_iter)
                log(f"interrupted: saved {latest_form(self.ckpt_path)} at iter {self.iter_num}; continue with "
                    f"python train.py --init_from=resume --out_dir={shlex.quote(cfg.out_dir)}")
            else:
                log(f"interrupted at iter {self.iter_num}, before this run completed an iteration: nothing saved")
        summary = {"iters": self.iter_num, "val_loss": self.last_val, "best_val_loss": self.best_val_loss,
                   "time": self.clock.wall(), "train_time": self.clock.train_time(), "interrupted": stop.set,
                   "reached": self.reached}
        if cfg.target_loss is not None and self.reached is None and self.last_val is not None:
            log(f"did not reach val loss {cfg.target_loss} in {self.iter_num} iters (last {self.last_val:.4f})")
        if self.last_val is not None and not cfg.eval_only and not stop.set:
            ran = self.iter_num - self.start_iter  # the wall time is this process's: so is the count beside it
            total = f" ({self.iter_num} in all)" if self.start_iter else ""
            log(f"done: {ran} iters in {summary['time']:.1f} s{total}; val loss {self.last_val:.4f} "
                f"(best {self.best_val_loss:.4f}); checkpoint {latest_form(self.ckpt_path)}")
        return summary


# an iter slower than this on a CPU gets a note with its estimated time
SLOW_CPU_ITER = 1.0  # seconds


def cpu_time_note(cfg, per_iter, per_eval, config_files=()):
    """The note for a run whose iters take over SLOW_CPU_ITER on this CPU, given rough seconds per iter and per
    evaluation: its estimated time, and a smaller recipe where there is one that this run is not already."""
    if per_iter <= SLOW_CPU_ITER:
        return None
    total = cfg.max_iters * per_iter + (cfg.max_iters // cfg.eval_interval + 1) * per_eval
    took = (f"on this CPU an iter takes about {fmt_seconds(per_iter)} and each evaluation about "
            f"{fmt_seconds(per_eval)}, {fmt_seconds(total)} for {cfg.max_iters} iters and their evaluations "
            f"(rough: timed at start-up as if the CPU were free; a busy one takes longer)")
    name = f"config/{os.path.basename(os.path.normpath(cfg.dataset))}_cpu.py"
    laptop = os.path.join(REPOSITORY, name)
    cpu_recipe = next((f for f in config_files if os.path.realpath(f) == os.path.realpath(laptop)
                       or read_config_file(f).get("device") == "cpu"), None)
    if cpu_recipe is not None:  # a recipe sized for a CPU by its author: the CPU is what is slow
        return f"{took}; {cpu_recipe} is a CPU recipe: this CPU is slower than the one it was sized on"
    if os.path.exists(laptop):
        smaller = f"for a laptop-sized run use {name}"
    elif cfg.init_from == "scratch":
        smaller = ("for a laptop-sized run use a smaller batch_size, block_size, n_layer and n_embd "
                   "(see config/shakespeare_char_cpu.py)")
    else:  # a fine-tune or a resume keeps its model's shape
        smaller = "a smaller batch_size or block_size shortens each iter"
    return f"this run is sized for a GPU: {took}; {smaller}"


def startup_notes(cfg, ckpt_path, iter_num=0, earlier=None, cpu_time=None, config_files=()):
    """Warnings worth a line before a run starts: a run slow on this CPU (cpu_time: rough seconds per iter and
    per evaluation, None off a CPU), a warmup longer than the run, a scratch run about to replace a checkpoint,
    a resumed run with nothing left to do."""
    notes = []
    if cpu_time is not None and (note := cpu_time_note(cfg, *cpu_time, config_files)):
        notes.append(note)
    if cfg.decay_lr and 0 < cfg.max_iters <= cfg.warmup_iters:
        reached = cfg.learning_rate * lr_scale(cfg.max_iters - 1, cfg)
        notes.append(f"warmup_iters ({cfg.warmup_iters}) >= max_iters ({cfg.max_iters}): the learning rate rises "
                     f"only to {reached:.2e} of its {cfg.learning_rate:.2e}; lower warmup_iters to reach it")
    elif cfg.decay_lr and cfg.warmup_iters < cfg.max_iters < cfg.lr_decay_iters:
        last = cfg.learning_rate * lr_scale(cfg.max_iters - 1, cfg)
        notes.append(f"max_iters ({cfg.max_iters}) < lr_decay_iters ({cfg.lr_decay_iters}): the run ends at a "
                     f"learning rate of {last:.2e}, before its decay to {cfg.min_lr:.2e}; "
                     f"--lr_decay_iters={cfg.max_iters} decays within the run")
    if earlier is not None:
        first = min(cfg.eval_interval, cfg.max_iters)
        notes.append(f"{latest_form(ckpt_path)} holds an earlier run ({earlier}); this {cfg.init_from} run replaces "
                     f"it, and its best checkpoint, when it first saves at an evaluation (at iter {first} at the "
                     f"earliest); until then it is kept, and Ctrl-C saves nothing (--init_from=resume would continue "
                     f"it instead; --out_dir=DIR keeps both)")
    if cfg.init_from == "resume" and not cfg.eval_only and iter_num >= cfg.max_iters:
        notes.append(f"the checkpoint is at iter {iter_num} and max_iters is {cfg.max_iters}: nothing to train; "
                     f"pass --max_iters=N with N > {iter_num} to continue")
    return notes


def earlier_run(ckpt_path):
    """'iter N, best val loss X' of the checkpoint at ckpt_path (its latest form), read without its weights;
    None where there is none."""
    path = latest_form(ckpt_path)
    if not os.path.exists(path):
        return None
    import warnings
    from nanogpt.files import check_regular
    try:
        if os.path.isdir(path):
            path = os.path.join(path, "meta.pt")
        check_regular(path)  # a FIFO would block torch.load forever
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch's notes on what it reads: never the user's
            ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=True)  # mmap: the weights stay on disk
        return f"iter {int(ckpt['iter_num'])}, best val loss {float(ckpt['best_val_loss']):.4f}"
    except Exception:  # only for a note: what the file holds is checked where it is loaded
        return "its iter and val loss could not be read"


def trained_before(ckpt, path):
    """Seconds of training the checkpoint's run had behind it (0 for a checkpoint that does not say)."""
    seconds = ckpt.get("train_time", 0.0)
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 <= seconds < math.inf:
        raise UserError(f"{path}: train_time is {seconds!r}, expected seconds >= 0; the file is damaged")
    return float(seconds)


def check_optimizer_state(model, optimizer, path):
    """Each parameter's state (AdamW's exp_avg and exp_avg_sq, Muon's momentum_buffer) has the parameter's
    shape: loading does not check it, and a wrong one would fail only in the first step."""
    names = {p: name for name, p in model.named_parameters()}
    state = optimizer.state
    for group in optimizer.param_groups:
        for p in group["params"]:
            for key, value in state.get(p, {}).items():
                if isinstance(value, torch.Tensor) and value.dim() and value.shape != p.shape:
                    raise UserError(f"{path}: its optimizer state does not fit the model: {key} of {names.get(p)} "
                                    f"has shape {tuple(value.shape)}, the parameter {tuple(p.shape)}; the file is "
                                    f"damaged: resume from another checkpoint (best.pt?) or train anew")


def tensor_bytes(obj):
    """Bytes of the tensors in obj (nested dicts, lists and tuples), each storage once."""
    seen, total, stack = set(), 0, [obj]
    while stack:
        item = stack.pop()
        if isinstance(item, torch.Tensor):
            storage = item.untyped_storage()
            if storage.data_ptr() not in seen:
                seen.add(storage.data_ptr())
                total += storage.nbytes()
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return total


def fmt_seconds(s):
    return f"{s:.1f} s" if s < 90 else f"{s / 60:.0f} min" if s < 5400 else f"{s / 3600:.1f} h"


def bytes_per_token(meta, vocab_size, device, log):
    """(vocab_size,) UTF-8 bytes of each token, for val_bpb; None (with a note) where the tokenizer cannot be had."""
    try:
        lengths = token_byte_lengths(tokenizer_from_meta(meta), vocab_size)
    except UserError as e:
        log(f"note: no val_bpb: {e}")
        return None
    return torch.tensor(lengths, dtype=torch.float64, device=device)


def gather_rng(world):
    """Every rank's RNG state (rank 0 saves them all), so each resumes its own dropout stream."""
    state = rng_state()
    if world == 1:
        return [state]
    states = [None] * world
    dist.all_gather_object(states, state)
    return states


def main(argv):
    cfg, overrides = parse_args(TrainConfig, argv)
    train(cfg, overrides, t_start=PROCESS_START, config_files=[a for a in argv if not a.startswith("--")])


if __name__ == "__main__":
    run_main(main)
