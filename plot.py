"""Overlay val loss (or bits per byte) against training time and against iterations, from runs' log.jsonl files;
below them the lm-eval tasks' scores where train.py scored them (eval_tasks).

    python plot.py out-shakespeare-char-cpu out-shakespeare-char-speedrun --png docs/speedrun.png
    python plot.py out-tangshi-char out-tangshi-bpe --bpb --png tangshi.png
    python plot.py out-tangshi-rl --rewards --png docs/rl.png   # rl.py's rewards, each component, against iters

Training time is wall time from process start with evaluation excluded, as
train.py logs it. Needs matplotlib (pip install matplotlib).
"""
import argparse
import os
import sys

from nanogpt.errors import UserError
from nanogpt.program import run_main
from nanogpt.training.metrics import read_log


def last_run(path, quiet=False):
    """The records of the last run in a log.jsonl. A resumed process continues its run from the checkpoint's
    iter: the records logged after it are replaced by the resumed process's. The lines skipped are noted on
    stderr (quiet: not, where a reading before has noted them)."""
    runs = []
    for record in read_log(path, note=lambda line: quiet or print(line, file=sys.stderr)):
        if record["kind"] == "config" and record.get("init_from") == "resume" and runs:
            start = record.get("iter", float("inf"))  # a config record that does not say where it resumed: every earlier record is kept
            runs[-1] = [r for r in runs[-1] if r.get("iter", 0) <= start]
        elif record["kind"] == "config":
            runs.append([])
        elif runs:
            runs[-1].append(record)
    return runs[-1] if runs else []


def log_path(out_dir):
    path = os.path.join(out_dir, "log.jsonl")
    if not os.path.exists(path):
        raise UserError(f"{path} not found; train.py writes it into out_dir")
    return path


def read_evals(out_dir, metric="val_loss"):
    """[(iter, train_time, metric)] of a run's evaluations; the last run when the log holds several."""
    path = log_path(out_dir)
    evals = [(r["iter"], r["train_time"], r[metric]) for r in last_run(path)
             if r["kind"] == "eval" and r.get(metric) is not None]
    if not evals:
        raise UserError(f"{path} has no evaluations" + (f" with {metric}" if metric != "val_loss" else ""))
    return evals


def read_tasks(out_dir, metric="acc"):
    """{task: [(iter, train_time, metric)]} of the lm-eval tasks scored at the last run's evaluations
    (train.py's eval_tasks); {} where none were. (read_evals has noted the lines skipped.)"""
    scores = {}
    for r in last_run(log_path(out_dir), quiet=True):
        for key, value in r.items() if r["kind"] == "tasks" else ():
            task, _, name = key.rpartition("/")
            if task and name == metric and value is not None:
                scores.setdefault(task, []).append((r["iter"], r["train_time"], value))
    return scores


def loss_limits(runs):
    """(bottom, top) of the loss axis: every point inside, with a 5% margin."""
    losses = [loss for evals in runs.values() for _, _, loss in evals]
    lo, hi = min(losses), max(losses)
    margin = 0.05 * (hi - lo) or 0.05 * abs(hi) or 0.1
    return lo - margin, hi + margin


def draw(runs, target=None, label="val loss", tasks=None, task_metric="acc"):
    """The figure: val loss against training time and against iterations, one line per run; below them, where
    tasks ({run: {task: points}}) has scores, each run's tasks on the same axes."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = 2 if tasks and any(tasks.values()) else 1
    fig, axes = plt.subplots(rows, 2, figsize=(11, 4.2 * rows), sharey="row", sharex="col", squeeze=False)
    (by_time, by_iter) = axes[0]
    name = {run: os.path.basename(os.path.normpath(run)) for run in runs}
    for run, evals in runs.items():
        iters, times, losses = zip(*evals)
        by_time.plot(times, losses, marker=".", label=name[run])
        by_iter.plot(iters, losses, marker=".", label=name[run])
    if rows == 2:
        for run, scores in tasks.items():
            for task, points in scores.items():
                iters, times, values = zip(*points)
                axes[1][0].plot(times, values, marker=".", label=f"{name[run]}: {task}")
                axes[1][1].plot(iters, values, marker=".", label=f"{name[run]}: {task}")
        axes[1][0].set_ylabel(f"{task_metric} (lm-eval tasks)")
        axes[1][1].legend()
    for ax in axes.flat:
        ax.grid(alpha=0.3)
    for ax in axes[0]:
        if target is not None:
            ax.axhline(target, color="gray", linestyle="--", linewidth=1)
    axes[-1][0].set_xlabel("training time, s (from process start, evals excluded)")
    axes[-1][1].set_xlabel("iterations")
    by_time.set_ylabel(label)
    by_time.set_ylim(*loss_limits(runs))
    by_iter.legend()
    fig.tight_layout()
    return fig


def read_rewards(out_dir):
    """({component: [(iter, mean)]} of rl.py's training samples, {rate: [(iter, share)]} of its held-out
    evaluations: the last run's."""
    path = log_path(out_dir)
    train, held_out = {}, {}
    for r in last_run(path):
        if r["kind"] == "rl":
            for key, value in r.items():
                if key not in ("kind", "iter", "loss", "tokens", "seconds", "kl"):
                    train.setdefault(key, []).append((r["iter"], value))
        elif r["kind"] == "rl_eval":
            for key, value in r.items():
                if key.endswith("_pass"):
                    held_out.setdefault(key[:-len("_pass")], []).append((r["iter"], value))
    if not train and not held_out:
        raise UserError(f"{path} has no rl.py records; plot.py --rewards draws the log of an rl.py run")
    return train, held_out


def draw_rewards(runs):
    """Left: each reward's mean over the training samples; right: the held-out keys' pass rates; against iters."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for run, (train, held_out) in runs.items():
        name = os.path.basename(os.path.normpath(run)) + ": " if len(runs) > 1 else ""
        for key, points in train.items():
            left.plot(*zip(*points), linewidth=1, label=name + key)
        for key, points in held_out.items():
            right.plot(*zip(*points), marker=".", label=name + key)
    left.set_title("training samples: mean reward")
    right.set_title("held-out keys: share that pass")
    for ax in (left, right):
        ax.set_xlabel("iterations")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dirs", nargs="+", help="the runs to draw: out_dirs holding a log.jsonl")
    parser.add_argument("--png", required=True, help="where to write the figure")
    parser.add_argument("--target", type=float, default=None, help="draw a horizontal line at this loss")
    parser.add_argument("--task_metric", default="acc",
                        help="the lm-eval metric drawn below the loss where train.py scored tasks (eval_tasks)")
    parser.add_argument("--bpb", action="store_true",
                        help="plot val bits per byte, which compares across tokenizers, instead of val loss")
    parser.add_argument("--rewards", action="store_true", help="draw rl.py's rewards (each component) against iters")
    args = parser.parse_args(argv)
    if args.rewards:
        runs = {d: read_rewards(d) for d in args.out_dirs}
        draw_rewards(runs).savefig(args.png, dpi=110)
        print(f"wrote {args.png}")
        return
    metric = "val_bpb" if args.bpb else "val_loss"
    runs = {d: read_evals(d, metric) for d in args.out_dirs}
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UserError("plot.py needs matplotlib: pip install matplotlib") from None
    tasks = {d: read_tasks(d, args.task_metric) for d in args.out_dirs}
    draw(runs, args.target, "val bits per byte" if args.bpb else "val loss", tasks, args.task_metric).savefig(
        args.png, dpi=110)
    print(f"wrote {args.png}")


if __name__ == "__main__":
    run_main(main)
