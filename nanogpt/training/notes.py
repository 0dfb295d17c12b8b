"""The notes train.py prints before a run starts: a run that will be slow on this CPU (its rough time, and a
smaller recipe), a warmup or decay that does not fit max_iters, an earlier run about to be replaced, a resume
with nothing left to do. Advice only: nothing here changes what the run does."""
import os

from nanogpt import REPOSITORY
from nanogpt.device import batch_seconds
from nanogpt.out_dir import latest_form
from nanogpt.pickles import torch_load
from nanogpt.settings import read_config_file
from nanogpt.training.optim import lr_scale
from nanogpt.training.plan import more_minutes

# an iter slower than this on a CPU gets a note with its estimated time
SLOW_CPU_ITER = 1.0  # seconds


def cpu_time_of(start, accum, iter_num):
    """Rough seconds of an iter and of an evaluation on this CPU, from a few passes over the run's first
    micro-batch (one process only: timing a sharded model would need every rank to time it in step)."""
    from nanogpt.training.batches import TRAINING
    cfg = start.cfg
    x, y = start.batches.get("train", (TRAINING, iter_num, 0))
    micro = batch_seconds(start.raw_model, x, y, start.ctx)
    eval_rows = cfg.eval_iters * cfg.batch_size + (cfg.eval_windows or cfg.eval_iters * cfg.batch_size)
    return micro * accum, micro * eval_rows / x.size(0) / 3  # a forward is about a third of training


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
                     + (f"the planned run is over ({more_minutes(cfg.dataset)})" if cfg.minutes is not None else
                        f"pass --max_iters=N with N > {iter_num} to continue"))
    return notes


def earlier_checkpoint(ckpt_path):
    """The fields of the checkpoint at ckpt_path (its latest form), its weights left on disk (mmap); None where there
    is none, {} where it cannot be read (only for a note or a refusal that keeps it: what the file holds is checked
    where it is loaded)."""
    path = latest_form(ckpt_path)
    if not os.path.exists(path):
        return None
    try:
        if os.path.isdir(path):
            path = os.path.join(path, "meta.pt")
        ckpt = torch_load(path, path, map_location="cpu", mmap=True)
    except Exception:
        return {}
    return ckpt if isinstance(ckpt, dict) else {}


def earlier_dataset(ckpt):
    """The dataset folder an earlier checkpoint's fields (earlier_checkpoint) say it trained on, where that folder is
    there; None where there is no checkpoint, or it names none that can be found (only such a folder is compared)."""
    from nanogpt.dataset import dataset_dir
    config = (ckpt or {}).get("config")
    dataset = config.get("dataset") if isinstance(config, dict) else None
    folder = dataset_dir(dataset) if isinstance(dataset, str) and dataset else None
    return folder if folder and os.path.isfile(os.path.join(folder, "train.bin")) else None


def earlier_run(ckpt):
    """'iter N, best val loss X' of an earlier checkpoint's fields (earlier_checkpoint); None where there is none."""
    if ckpt is None:
        return None
    try:
        return f"iter {int(ckpt['iter_num'])}, best val loss {float(ckpt['best_val_loss']):.4f}"
    except (KeyError, TypeError, ValueError):
        return "its iter and val loss could not be read"


def fmt_seconds(s):
    return f"{s:.1f} s" if s < 90 else f"{s / 60:.0f} min" if s < 5400 else f"{s / 3600:.1f} h"
