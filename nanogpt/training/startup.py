"""How a training run starts: the config it trains with and the model it trains (new, resumed from
out_dir, fine-tuned from another checkpoint, or GPT-2's), with every check of a resume or a fine-tune.

train.py calls start_run once; the Start it returns (train.py's Run, a Start with the loop's steps) holds what
the loop needs, and Start.restore puts a resumed run's optimizer, scaler and RNG state back once the optimizer
is built.
"""
import math
import os
import typing
from contextlib import nullcontext
from dataclasses import dataclass, fields, replace

import torch

from model import GPT, GPTConfig
from nanogpt.checkpoint import (RUNTIME_FIELDS, config_from_model_args, load_checkpoint, load_sharded,
                                model_from_checkpoint, set_rng_state)
from nanogpt.cpu.heap import keep_freed_memory
from nanogpt.cpu.threads import Threads
from nanogpt.dataset import prepared_dir
from nanogpt.device import autocast, peak_flops_for, resolve_device, resolve_dtype, should_compile, training_kernels
from nanogpt.errors import UserError
from nanogpt.interop.hf import load_pretrained
from nanogpt.memory import check_fits, fmt_bytes, param_count, settle_heap, training_bytes
from nanogpt.out_dir import interrupted_save, latest_form
from nanogpt.source import checkpoint_file
from nanogpt.tokenizer import base_meta, read_meta, token_byte_lengths, tokenizer_from_meta, tokenizer_kind
from nanogpt.training.batches import make_batches
from nanogpt.training.distill import Teachers, read_teachers, teacher_paths
from nanogpt.training.distributed import barrier, from_rank0, micro_batches
from nanogpt.training.notes import earlier_checkpoint, earlier_dataset, earlier_run
from nanogpt.training.optim import DAMAGED, restore_optimizer
from nanogpt.training.plan import more_minutes, plan_run, planned, positive
from nanogpt.training.resume import saved_settings
from nanogpt.training.sharding import checkpoint_activations, first_non_finite, load_optimizer_state, shard
from nanogpt.training.train_config import TrainConfig
from nanogpt.training.train_tasks import task_scores
from nanogpt.values import how_many, report_overrides

# the model's fields that fix what its weights mean: a resumed run keeps the checkpoint's
SHAPE_FIELDS = tuple(f.name for f in fields(GPTConfig) if f.name not in RUNTIME_FIELDS)
FIXED_ON_RESUME = SHAPE_FIELDS + ("optimizer",)  # the optimizer state must fit the optimizer
# fields about this machine and this invocation: a resumed run never takes them from the checkpoint
LOCAL_FIELDS = ("out_dir", "init_from", "eval_only", "device", "dtype", "compile", "backend", "peak_flops",
                "packed_linear", "matmul_dtype")


@dataclass
class Start:
    """What a training run starts with: its config (the shape its weights have), its data, and its model on
    device, sharded where the run is (not yet compiled or wrapped in DDP)."""
    cfg: TrainConfig
    raw_model: GPT  # the model itself: train.py's model is it compiled or wrapped in DDP
    device: torch.device
    dtype: torch.dtype
    batches: object  # batches.Batches or ChatBatches
    tokenizer_meta: dict | None  # saved in each checkpoint: sampling needs no dataset
    sharded: bool  # FSDP's shards (under torchrun with --parallel=fsdp)
    compile: bool
    kernels: object  # device.MatmulKernels: the kernels of training's products
    tasks: object  # train_tasks.TaskScores, or None without eval_tasks
    token_bytes: torch.Tensor | None  # (vocab_size,) UTF-8 bytes per token, for val_bpb
    ctx: object  # the autocast context of a forward pass (FSDP casts per unit itself)
    peak: float | None  # the device's peak FLOP/s, for MFU
    ckpt_path: str  # out_dir/ckpt.pt
    replacing: str | None  # the earlier run in out_dir that this new run replaces when it first saves
    ckpt: dict | None  # the checkpoint a resume continues (restore() takes what the model did not)
    rank: int = 0
    world: int = 1
    log: typing.Callable = print
    plan: dict | None = None  # --minutes: what the plan chose and predicted (plan.py)
    teachers: Teachers | None = None  # --teacher: the models whose predictions the run distills (distill.py)
    threads: Threads | None = None  # --minutes on a CPU: the thread count, fitted to the load as the run goes
    revision: tuple | None = None  # --minutes: the plan's prediction revised halfway, (val bpb, sigma) (plan.py)

    def restore(self, optimizer, scaler):
        """(iter_num, best_val_loss, best_val_bpb, train_time) of the run: a resumed one's from its checkpoint, with the
        optimizer, scaler and RNG state loaded (and a sharded checkpoint's weights); (0, inf, 0) for a new one."""
        ckpt, self.ckpt = self.ckpt, None  # its weights are the model's now: nothing here keeps them alive
        if ckpt is None:
            return 0, float("inf"), None, 0.0
        path = ckpt.get("sharded", self.ckpt_path)
        if "sharded" in ckpt:  # whatever number of processes wrote it; the weights load with the state
            load = lambda: load_sharded(self.raw_model, optimizer, path)  # noqa: E731
        elif self.sharded:
            load = lambda: load_optimizer_state(self.raw_model, optimizer, ckpt["optimizer"])  # noqa: E731
        else:
            load = lambda: optimizer.load_state_dict(ckpt["optimizer"])  # noqa: E731
        restore_optimizer(self.raw_model, optimizer, load, path, f"optimizer={self.cfg.optimizer}")
        if "sharded" in ckpt and first_non_finite(self.raw_model, self.world):
            raise UserError(f"{path} holds non-finite weights: the run that wrote it diverged; use an earlier "
                            f"checkpoint (best.dcp?) or train again")
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
                scaler.load_state_dict(ckpt["scaler"])
            has_rng = self.rank < len(ckpt.get("rng") or [])
            if has_rng:
                set_rng_state(ckpt["rng"][self.rank])
        except DAMAGED as e:
            raise UserError(f"{path}: its RNG or gradient-scaler state is damaged ({type(e).__name__}: {e})") from None
        if not has_rng:
            self.log(f"note: {path} has no RNG state (a nanoGPT checkpoint?): resuming with fresh dropout RNG")
        self.log(f"resuming from {path} at iter {iter_num}")
        # the val bpb at best_val_loss; None: no val bpb, no best yet, or an older checkpoint
        best_bpb = positive(ckpt.get("best_val_bpb")) if best_val_loss < math.inf else None
        return iter_num, best_val_loss, best_bpb, trained_before(ckpt, path)


def start_run(cfg, overrides, rank, local_rank, world, log, lock, into=Start, elapsed=lambda: 0.0):
    """The Start of a run of cfg (overrides: the keys the user set, for a resume), as rank of world
    processes: from scratch, a resume of out_dir's checkpoint, a fine-tune or GPT-2's weights, as
    cfg.init_from says; with cfg.minutes, a new run's keys are first planned (plan.py). lock: out_dir's, which a
    resume takes at once where a save was interrupted. into: Start, or a class that extends it (train.py's Run).
    elapsed: the seconds since the process started (a plan's budget counts them)."""
    ckpt_path = os.path.join(cfg.out_dir, "ckpt.pt")
    if cfg.init_from == "resume":
        if rank == 0 and not cfg.eval_only and interrupted_save(ckpt_path):
            lock.acquire()  # now, not once about to write: it puts back the checkpoint a save moved aside
        barrier(world)  # every rank reads out_dir as rank 0 left it
    cfg, base, ckpt = run_config(cfg, overrides, ckpt_path, world, log)
    report_overrides(overrides, base, log)
    # --teacher: the files, checked before a plan's probe spends time; saved absolute, so a resume reads the same
    # files from any directory; none where nothing is distilled (distill=0, or an evaluation)
    teacher_files = ()
    if "distill" in overrides and not cfg.teacher:
        log("note: --distill weighs what --teacher names; without a teacher the run learns from the text alone")
    if cfg.teacher and cfg.distill > 0 and not cfg.eval_only:
        teacher_files = teacher_paths(cfg.teacher, cfg.out_dir,
                                      ckpt_path if ckpt is not None and "teacher" not in overrides else None)
        cfg = replace(cfg, teacher=",".join(teacher_files))
    teacher_ckpts = read_teachers(teacher_files)
    device = resolve_device(cfg.device, local_rank)
    if device.type == "cpu":
        keep_freed_memory()  # before a plan's probe, which times the iterations the run will take
    dtype = resolve_dtype(cfg.dtype, device)
    data_dir = prepared_dir(cfg.dataset)
    # a new run into out_dir would replace, at its first evaluation, a model of another text (a recipe's out_dir
    # taken with a config file while --dataset names the user's own): refused, before a plan's probe spends time
    # (rank 0 reads the checkpoint's fields once, shared, so that every rank agrees on whether an interrupt saves:
    # its dataset, and the earlier run this new one replaces)
    earlier = earlier_checkpoint(ckpt_path) if rank == 0 and cfg.init_from != "resume" and not cfg.eval_only else None
    other, replacing = from_rank0((earlier_dataset(earlier), earlier_run(earlier)), world)
    if other is not None and os.path.realpath(other) != os.path.realpath(data_dir):
        name = os.path.basename(os.path.normpath(data_dir))
        source = checkpoint_file(cfg.init_from)  # a fine-tune of that very checkpoint: it cannot be moved away
        away = ("" if source is not None and os.path.realpath(source) == os.path.realpath(latest_form(ckpt_path))
                else ", or move that checkpoint away to replace it")
        raise UserError(f"{latest_form(ckpt_path)} holds a model of {other} ({replacing}), and this run trains on "
                        f"{data_dir}: give it a folder of its own (--out_dir=out-{name}){away}")
    del earlier  # its tensors, mapped from the file, are not held while the run builds its own
    meta = read_meta(data_dir)
    # a planned run is bound by the clock, not by reproducible sums: on a CPU its threads are the cores other
    # processes leave idle (two threads on two cores beside a busy process trained up to 78x slower), from the
    # probe on; not under torchrun, whose ranks would each count the others as load and step at the slowest's pace
    threads = Threads() if cfg.minutes is not None and device.type == "cpu" and world == 1 else None
    plan = revision = None
    taught_by = [config for _, _, config in teacher_ckpts]  # their shapes, checked against their weights when read
    if cfg.minutes is not None:
        if ckpt is None:  # the teachers' forward passes are planned too
            cfg, plan = plan_run(cfg, overrides, meta, data_dir, device, dtype, rank, world, elapsed, log, taught_by)
        else:
            plan, revision = planned(cfg.out_dir)
    batches = make_batches(data_dir, cfg.block_size, cfg.batch_size, device, cfg.seed, meta, log)
    batches.check_windows("val", cfg.eval_windows)
    torch.manual_seed(cfg.seed)  # the same initial weights on every rank
    model, cfg = build_model(cfg, ckpt, meta, data_dir, overrides, device, ckpt_path, log, taught_by)
    if cfg.block_size != batches.block_size:  # a fine-tuned checkpoint's context decided it
        batches = make_batches(data_dir, cfg.block_size, cfg.batch_size, device, cfg.seed, meta, log)
    batches.vocab_size = model.config.vocab_size  # a token id beyond it is an error
    torch.manual_seed(cfg.seed + rank)  # distinct dropout masks per rank
    model.to(device)
    compile = should_compile(cfg.compile, device)
    sharded = parallelize(model, cfg, device, dtype, compile, world, log)
    token_bytes = bytes_per_token(meta, model.config.vocab_size, device, log)
    kernels = training_kernels(cfg, device, dtype, compile, sharded, log)
    tasks = task_scores(cfg, model, meta, rank, sharded)
    teachers = (Teachers.load(teacher_ckpts, cfg.distill, meta, data_dir, model.config.vocab_size, cfg.block_size,
                              device, dtype, kernels, log, check_same_tokenizer) if teacher_ckpts else None)
    return into(cfg, model, device, dtype, batches, meta, sharded, compile, kernels, tasks, token_bytes,
                ctx=nullcontext() if sharded else autocast(device, dtype),
                peak=cfg.peak_flops or peak_flops_for(device, dtype), ckpt_path=ckpt_path,
                replacing=replacing, ckpt=ckpt, rank=rank, world=world, log=log, plan=plan, threads=threads,
                teachers=teachers, revision=revision)


def build_model(cfg, ckpt, meta, data_dir, overrides, device, ckpt_path, log, teachers=()):
    """The model: from the checkpoint, from GPT-2's weights, or new; and cfg with the shape it has. teachers: the
    GPTConfigs of the models it learns from (--teacher), which its memory check counts too."""
    if ckpt is not None and "sharded" in ckpt:  # its weights are loaded into the model, sharded or not, by restore
        config = config_from_model_args(ckpt["model_args"], ckpt["sharded"],
                                        dict(attn_impl=cfg.attn_impl, dropout=cfg.dropout))
        check_vocab(config.vocab_size, meta, data_dir, ckpt["sharded"])
        check_resumed_tokenizer(ckpt, meta, ckpt["sharded"], data_dir, log)
        check_memory(config, cfg.batch_size, device, teachers=teachers, log=log)
        return GPT(config), cfg
    if ckpt is not None:
        model = model_from_checkpoint(ckpt, ckpt_path, attn_impl=cfg.attn_impl, dropout=cfg.dropout)
        check_vocab(model.config.vocab_size, meta, data_dir, ckpt_path)
        check_resumed_tokenizer(ckpt, meta, ckpt_path, data_dir, log)
        check_memory(model.config, cfg.batch_size, device, held=(ckpt, model.state_dict()), teachers=teachers, log=log)
        return model, cfg
    source = checkpoint_file(cfg.init_from)
    if source is not None:
        return finetune_model(cfg, source, meta, data_dir, "block_size" in overrides, device, log, teachers)
    if cfg.init_from != "scratch":
        model = load_pretrained(cfg.init_from, dropout=cfg.dropout, attn_impl=cfg.attn_impl)
        check_vocab(model.config.vocab_size, meta, data_dir, cfg.init_from)
        return fit_context(model, cfg, cfg.init_from, device, log, teachers)
    config = cfg.model_config(vocab_size=(meta or {}).get("vocab_size", cfg.vocab_size))
    check_memory(config, cfg.batch_size, device, sized=cfg.minutes is None, teachers=teachers, log=log)
    return GPT(config), replace(cfg, vocab_size=config.vocab_size)


def finetune_model(cfg, source, meta, data_dir, block_size_given, device, log, teachers=()):
    """A trained checkpoint's model to fine-tune from iter 0, its embeddings and head grown by the role tokens a
    chat dataset adds; and cfg with the shape it has."""
    ckpt = load_checkpoint(source)
    check_same_tokenizer(ckpt.get("tokenizer"), meta, source, data_dir, log)
    vocab = (meta or {}).get("vocab_size", 0)
    grown = grow_vocab(ckpt, vocab)
    if grown:
        log(f"from {source}: vocabulary {grown[0]:,} -> {grown[1]:,} (new rows start at the mean embedding)")
    model = model_from_checkpoint(ckpt, source, attn_impl=cfg.attn_impl, dropout=cfg.dropout)
    check_vocab(model.config.vocab_size, meta, data_dir, source)
    if not block_size_given:  # the checkpoint's context, unless a config or the command line says otherwise
        cfg = replace(cfg, block_size=model.config.block_size)
    return fit_context(model, cfg, source, device, log, teachers)


def fit_context(model, cfg, source, device, log, teachers=()):
    """A trained model cropped to cfg.block_size (at most its own context) and checked to fit in memory;
    and cfg with the shape the weights decide."""
    if cfg.block_size > model.config.block_size:
        raise UserError(f"block_size ({cfg.block_size}) is longer than {source}'s context "
                        f"({model.config.block_size}); use --block_size={model.config.block_size} or less")
    model.crop_block_size(cfg.block_size)
    check_memory(model.config, cfg.batch_size, device, held=model.state_dict(), teachers=teachers, log=log)
    shape = {k: getattr(model.config, k) for k in SHAPE_FIELDS}
    changed = [f"{k}={v}" for k, v in shape.items() if getattr(cfg, k) != v]
    if changed:
        log(f"from {source}: {', '.join(changed)}")
    return model, replace(cfg, **shape)


def check_memory(config, batch_size, device, held=(), sized=False, teachers=(), log=print):
    """Training config on micro-batches of batch_size fits in what the device has free, before training
    allocates it; held: tensors already in memory (a loaded checkpoint) that training's own take over; sized: a new
    model whose size --minutes could choose instead (the defaults are GPT-2's, which a learner meets by leaving out
    a config file); teachers: the GPTConfigs of the models it learns from (--teacher). Where it fits only with freed
    blocks handed back to the kernel, the heap stops keeping them."""
    on_cpu = device.type == "cpu"
    held_bytes = tensor_bytes(held) if on_cpu else 0  # on a GPU they are not there yet (nor the teachers)
    kept_need = training_bytes(config, batch_size, kept=True, teachers=teachers, on_cpu=on_cpu) - held_bytes
    free, kept, given_up = settle_heap(device, kept_need)
    live_need = training_bytes(config, batch_size, teachers=teachers, on_cpu=on_cpu) - held_bytes
    if given_up and live_need <= free:  # else the error below names the least
        log(f"memory: training keeps the blocks each iteration frees only in about {fmt_bytes(kept_need)}, more than "
            f"the {fmt_bytes(free)} free; they go back to the kernel instead (each iteration slower, most over a large "
            f"vocabulary: docs/speed.md)")
    taught = f" from {how_many(len(teachers), 'teacher')}" if teachers else ""
    check_fits(kept_need if kept else live_need, device, f"training {param_count(config) / 1e6:,.1f}M parameters"
               f"{taught} on micro-batches of {batch_size} x {config.block_size} tokens",
               "lower batch_size (raise gradient_accumulation_steps to keep the batch), block_size, n_layer or n_embd"
               + (", or leave them unset and let --minutes=N choose a model this machine trains in N minutes"
                  if sized else ""))


def parallelize(model, cfg, device, dtype, compile, world, log):
    """Activation checkpointing, and FSDP's shards under torchrun; True when the model is sharded."""
    if cfg.activation_checkpointing:
        checkpoint_activations(model)
    if cfg.parallel != "fsdp":
        return False
    if dtype == torch.float16:
        raise UserError("--parallel=fsdp computes in bfloat16 or float32, not float16 (no gradient scaler for "
                        "shards here): use --dtype=bfloat16, or --parallel=ddp")
    if world == 1:
        log("note: --parallel=fsdp in one process: nothing to shard, so the model trains whole; "
            "checkpoints are still sharded directories (run under torchrun to shard)")
        return False
    shard(model, device, dtype, compile_blocks=compile)
    return True


def run_config(cfg, overrides, ckpt_path, world, log=print):
    """(cfg, base, ckpt): the config this run trains with (a resume's is the checkpoint's, with the overrides),
    what the overrides are reported against, and the checkpoint to resume (None for a new run)."""
    if cfg.init_from != "resume":
        micro_batches(cfg.gradient_accumulation_steps, world)
        return cfg, TrainConfig(), None
    ckpt = load_checkpoint(ckpt_path, weights=False)  # a sharded one's weights load once sharded (restore)
    base, resumed = resume_config(ckpt, overrides, ckpt_path, log)
    cfg = replace(resumed, **{k: getattr(cfg, k) for k in LOCAL_FIELDS})  # this invocation's, as given
    if cfg.minutes is not None and "matmul_dtype" not in overrides:
        cfg = replace(cfg, matmul_dtype="auto")  # a planned run's products, on whatever machine resumes it
    given = "gradient_accumulation_steps" in overrides
    micro_batches(cfg.gradient_accumulation_steps, world, "" if given else f", {ckpt.get('sharded', ckpt_path)}'s")
    return cfg, base, ckpt


def resume_config(ckpt, overrides, path, log=print):
    """The checkpoint's config (as data: no key that leads to code), with the user's overrides unless they
    would change the model."""
    saved = saved_settings(ckpt, TrainConfig, path, overrides, log, skip=LOCAL_FIELDS)
    model_args = ckpt["model_args"]
    default = GPTConfig()
    for key in SHAPE_FIELDS:  # model_args is the truth about the weights
        saved[key] = model_args.get(key, getattr(default, key))
    saved.setdefault("optimizer", "adamw")  # nanoGPT's
    if "embedding_lr" in overrides and (overrides["embedding_lr"] is None) != (saved.get("embedding_lr") is None):
        raise UserError(f"--embedding_lr={overrides['embedding_lr']!r} would add or remove the embeddings' own "
                        f"optimizer group, which the checkpoint's optimizer state {'lacks' if saved.get('embedding_lr') is None else 'has'} "
                        f"({path}); change its value, not whether it is set, or train anew in a new out_dir")
    if "minutes" in overrides and overrides["minutes"] != saved.get("minutes"):
        if saved.get("minutes") is None:
            raise UserError(f"--minutes: {path} is not from a planned run (--minutes), so there is no plan to keep; "
                            f"resume without --minutes, or plan a new run in a new --out_dir")
        raise UserError(f"--minutes={overrides['minutes']:g}: {path} was planned for --minutes={saved['minutes']:g}, "
                        f"and a resumed run keeps its plan; resume without --minutes ("
                        f"{more_minutes(overrides.get('dataset', saved.get('dataset')))})")
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


def check_resumed_tokenizer(ckpt, meta, path, data_dir, log):
    """A resume reads its dataset as the checkpoint did: a dataset prepared again over other characters, as many of
    them, passes the vocabulary's size and would train on ids that now mean other characters. (A checkpoint that
    names no tokenizer, nanoGPT's, is taken as it is.)"""
    if ckpt.get("tokenizer") is not None:
        check_same_tokenizer(ckpt["tokenizer"], meta, path, data_dir, log,
                             advice="resume with the dataset it was trained on (--dataset), prepared as it was")


FINETUNE_ADVICE = ("prepare the fine-tuning data on the model's own dataset (python data/chat/prepare.py --base "
                   "THAT_DATASET ...)")


def check_same_tokenizer(trained, meta, source, data_dir, log, advice=FINETUNE_ADVICE):
    """A dataset must tokenize as the checkpoint's did (a chat dataset: its base tokenizer): a fine-tune's, or a
    teacher's; advice: what to do when it does not."""
    if trained is None or meta is None:
        log(f"note: {source if trained is None else data_dir} names no tokenizer; assuming the two agree")
        return
    def signature(m):
        m = base_meta(m)
        return (tokenizer_kind(m), m.get("chars") or m.get("itos"), m.get("pattern"), m.get("ranks_text"))
    if signature(trained) != signature(meta):
        raise UserError(f"{data_dir}'s tokenizer is not the one {source} was trained with; {advice}")


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


def trained_before(ckpt, path):
    """Seconds of training the checkpoint's run had behind it (0 for a checkpoint that does not say)."""
    seconds = ckpt.get("train_time", 0.0)
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 <= seconds < math.inf:
        raise UserError(f"{path}: train_time is {seconds!r}, expected seconds >= 0; the file is damaged")
    return float(seconds)


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


def bytes_per_token(meta, vocab_size, device, log):
    """(vocab_size,) UTF-8 bytes of each token, for val_bpb; None (with a note) where the tokenizer cannot be had."""
    try:
        lengths = token_byte_lengths(tokenizer_from_meta(meta), vocab_size)
    except UserError as e:
        log(f"note: no val_bpb: {e}")
        return None
    return torch.tensor(lengths, dtype=torch.float64, device=device)
