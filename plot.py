"""Overlay val loss (or bits per byte) against training time and against iterations, from runs' log.jsonl files.

    python plot.py out-shakespeare-char-cpu out-shakespeare-char-speedrun --png docs/speedrun.png
    python plot.py out-tangshi-char out-tangshi-bpe --bpb --png tangshi.png

Training time is wall time from process start with evaluation excluded, as
train.py logs it. Needs matplotlib (pip install matplotlib).
"""
import argparse
import os
import sys

from configurator import UserError, run_main
from metrics import read_log


def read_evals(out_dir, metric="val_loss"):
    """[(iter, train_time, metric)] of a run's log; the last run when the log holds several. A resumed
    process continues its run from the checkpoint's iter: the evaluations logged after it are replaced."""
    path = os.path.join(out_dir, "log.jsonl")
    if not os.path.exists(path):
        raise UserError(f"{path} not found; train.py writes it into out_dir")
    runs = []
    for record in read_log(path, note=lambda line: print(line, file=sys.stderr)):
        if record["kind"] == "config" and record.get("init_from") == "resume" and runs:
            start = record.get("iter", float("inf"))  # logs of older versions do not say
            runs[-1] = [point for point in runs[-1] if point[0] <= start]
        elif record["kind"] == "config":
            runs.append([])
        elif record["kind"] == "eval" and runs and record.get(metric) is not None:
            runs[-1].append((record["iter"], record["train_time"], record[metric]))
    if not runs or not runs[-1]:
        raise UserError(f"{path} has no evaluations" + (f" with {metric}" if metric != "val_loss" else ""))
    return runs[-1]


def loss_limits(runs):
    """(bottom, top) of the loss axis: every point inside, with a 5% margin."""
    losses = [loss for evals in runs.values() for _, _, loss in evals]
    lo, hi = min(losses), max(losses)
    margin = 0.05 * (hi - lo) or 0.05 * abs(hi) or 0.1
    return lo - margin, hi + margin


def draw(runs, target=None, label="val loss"):
    """The figure: val loss against training time and against iterations, one line per run."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (by_time, by_iter) = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for name, evals in runs.items():
        iters, times, losses = zip(*evals)
        by_time.plot(times, losses, marker=".", label=os.path.basename(os.path.normpath(name)))
        by_iter.plot(iters, losses, marker=".", label=os.path.basename(os.path.normpath(name)))
    for ax, xlabel in ((by_time, "training time, s (from process start, evals excluded)"), (by_iter, "iterations")):
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
        if target is not None:
            ax.axhline(target, color="gray", linestyle="--", linewidth=1)
    by_time.set_ylabel(label)
    by_time.set_ylim(*loss_limits(runs))
    by_iter.legend()
    fig.tight_layout()
    return fig


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dirs", nargs="+")
    parser.add_argument("--png", required=True, help="where to write the figure")
    parser.add_argument("--target", type=float, default=None, help="draw a horizontal line at this loss")
    parser.add_argument("--bpb", action="store_true",
                        help="plot val bits per byte, which compares across tokenizers, instead of val loss")
    args = parser.parse_args(argv)
    metric = "val_bpb" if args.bpb else "val_loss"
    runs = {d: read_evals(d, metric) for d in args.out_dirs}
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UserError("plot.py needs matplotlib: pip install matplotlib") from None
    draw(runs, args.target, "val bits per byte" if args.bpb else "val loss").savefig(args.png, dpi=110)
    print(f"wrote {args.png}")


if __name__ == "__main__":
    run_main(main)
