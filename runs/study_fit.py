"""Fit the law of nanogpt/training/plan.py to the study's points (runs/study.py), and draw the frontier.

    python runs/study_fit.py --datasets /work/ds --study /work/study --png docs/minutes_frontier.png

Prints the fitted constants (LAW), the error of each point, each corpus's error when the law is fitted without it
(leave one corpus out: how far a prediction on a corpus never seen can be off), and the table of the best point at
each corpus and budget. The points are the best val bpb of each run; the law's inputs are the run's shape, the tokens
it trained on, its dropout and its corpus (plan.read_corpus).
"""
import argparse
import json
import math
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from nanogpt.tokenizer import read_meta, token_byte_lengths, tokenizer_from_meta  # noqa: E402
from nanogpt.training.plan import LAW, predict_bpb, read_corpus  # noqa: E402

# alpha and beta stay at Chinchilla's exponents (Hoffmann et al., 2022: 0.34 and 0.28): two budgets and three sizes
# a corpus cannot pin them down, and freed they trade against the floor (beta ran to its bound, the floor below 0)
FREE = ("e0", "e1", "A", "B", "R", "R_dropout")
LOW = (-5.0, -2.0, 0.0, 0.0, 0.5, 0.0)
HIGH = (5.0, 5.0, 10.0, 50.0, 100.0, 500.0)


def corpus_of(datasets, name, cache={}):
    if name not in cache:
        path = os.path.join(datasets, name)
        meta = read_meta(path)
        cache[name] = read_corpus(path, meta, token_byte_lengths(tokenizer_from_meta(meta), meta["vocab_size"]))
    return cache[name]


def predictions(values, points, datasets):
    law = {**LAW, **dict(zip(FREE, values))}
    return np.array([predict_bpb(p, p["max_iters"] * p["batch_size"] * p["block_size"], corpus_of(datasets, p["dataset"]),
                                 law) for p in points])


def fit(points, datasets, start):
    from scipy.optimize import least_squares
    target = np.array([p["best_val_bpb"] for p in points])
    best = None
    for b in (0.5, 2.0, 8.0):  # a few starts: the surface has shallow valleys
        x0 = np.clip([*start[:3], b, *start[4:]], LOW, HIGH)
        r = least_squares(lambda v: np.log(np.maximum(predictions(v, points, datasets), 0.05)) - np.log(target), x0,
                          bounds=(LOW, HIGH))
        if best is None or r.cost < best.cost:
            best = r
    return best.x


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--datasets", required=True)
    p.add_argument("--study", required=True)
    p.add_argument("--png")
    args = p.parse_args()
    with open(os.path.join(args.study, "points.jsonl")) as f:
        points = [json.loads(line) for line in f if '"best_val_bpb"' in line]
    start = [LAW[k] for k in FREE]
    values = fit(points, args.datasets, start)
    law = dict(zip(FREE, values))
    pred = predictions(values, points, args.datasets)
    rel = pred / np.array([p["best_val_bpb"] for p in points]) - 1
    print("LAW = dict(" + ", ".join(f"{k}={v:.4g}" for k, v in law.items()) + ")")
    print(f"in-sample: rms relative error {math.sqrt((rel ** 2).mean()) * 100:.2f}%, worst {abs(rel).max() * 100:.2f}%")
    print(f"\n{'point':34s} {'params':>7s} {'tokens':>7s} {'epochs':>6s} {'val bpb':>8s} {'law':>7s}")
    for pt, y, e in zip(points, pred, rel):
        c = corpus_of(args.datasets, pt["dataset"])
        tokens = pt["max_iters"] * pt["batch_size"] * pt["block_size"]
        print(f"{pt['name']:34s} {12 * pt['n_layer'] * pt['n_embd'] ** 2 / 1e6:6.2f}M {tokens / 1e6:6.2f}M "
              f"{tokens / c.train_tokens:6.1f} {pt['best_val_bpb']:8.4f} {y:7.4f} {e * 100:+5.1f}%")
    # leave one corpus out: the law without a corpus, on that corpus
    print("\nleave one corpus out (fitted on the others, predicting this one):")
    errors = []
    for name in sorted({p["dataset"] for p in points}):
        rest = [p for p in points if p["dataset"] != name]
        held = [p for p in points if p["dataset"] == name]
        v = fit(rest, args.datasets, values)
        e = predictions(v, held, args.datasets) / np.array([p["best_val_bpb"] for p in held]) - 1
        errors.extend(e)
        print(f"  {name:18s} mean {e.mean() * 100:+5.1f}%, worst {abs(e).max() * 100:5.1f}% over {len(held)} points")
    errors = np.array(errors)
    print(f"  all: rms {math.sqrt((errors ** 2).mean()) * 100:.2f}%  (LAW's rel_sigma)")
    # the best point at each corpus and budget
    print(f"\n{'corpus':18s} {'minutes':>7s} {'best shape':>10s} {'val bpb':>8s}   others")
    for name in sorted({p["dataset"] for p in points}):
        for minutes in sorted({p["minutes"] for p in points if p["dataset"] == name}):
            here = sorted((p for p in points if p["dataset"] == name and p["minutes"] == minutes),
                          key=lambda p: p["best_val_bpb"])
            others = ", ".join(f"{p['shape']}{'/d' + str(p['dropout']) if p['dropout'] else ''} {p['best_val_bpb']:.4f}"
                               for p in here[1:])
            b = here[0]
            print(f"{name:18s} {minutes:7g} {b['shape'] + ('/d' + str(b['dropout']) if b['dropout'] else ''):>10s} "
                  f"{b['best_val_bpb']:8.4f}   {others}")
    if args.png:
        draw(points, values, args.datasets, args.png)


def draw(points, values, datasets, png):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    names = sorted({p["dataset"] for p in points})
    fig, axes = plt.subplots(1, len(names), figsize=(4 * len(names), 3.6), squeeze=False)
    for ax, name in zip(axes[0], names):
        for minutes, colour in zip(sorted({p["minutes"] for p in points}), ("tab:blue", "tab:orange", "tab:green")):
            here = sorted((p for p in points if p["dataset"] == name and p["minutes"] == minutes and not p["dropout"]),
                          key=lambda p: p["n_embd"] * p["n_layer"])
            if not here:
                continue
            n = [12 * p["n_layer"] * p["n_embd"] ** 2 / 1e6 for p in here]
            ax.plot(n, [p["best_val_bpb"] for p in here], "o", color=colour, label=f"{minutes:g} min")
            ax.plot(n, predictions(values, here, datasets), "--", color=colour)
        ax.set_xscale("log")
        ax.set_title(name)
        ax.set_xlabel("parameters in the blocks (M)")
    axes[0][0].set_ylabel("best val bpb (points) and the law (dashed)")
    axes[0][0].legend()
    fig.tight_layout()
    fig.savefig(png, dpi=110)


if __name__ == "__main__":
    main()
