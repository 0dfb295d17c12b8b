"""Fit the law of nanogpt/training/plan.py to the study's points (runs/study.py), and draw the frontier.

    python runs/study_fit.py --png docs/minutes_frontier.png                      # the committed points
    python runs/study_fit.py --study /work/study --datasets /work/ds             # a study's own points.jsonl

The study's points as measured are committed (docs/minutes_points.jsonl), each with what the law reads of its corpus
(its tokens, bytes a token, hardness and share of Chinese characters: plan.read_corpus), so the law refits without the corpora; --datasets is needed
only for points that lack that record (a study run before it was written).

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

from nanogpt.training.plan import DROPOUTS, LAW, Corpus, max_epochs, planned_dropouts, predict_bpb  # noqa: E402
from runs.study import corpus_record  # noqa: E402

POINTS = os.path.join(ROOT, "docs", "minutes_points.jsonl")  # the study's points, as measured

# alpha and beta stay at Chinchilla's exponents (Hoffmann et al., 2022: 0.34 and 0.28): two budgets and three sizes
# a corpus cannot pin them down, and freed they trade against the floor (beta ran to its bound, the floor below 0)
SHARED = ("A", "B", "R", "R_dropout", "dropout_cost")
FITTED = ("e0", "e1", *SHARED)  # the constants of LAW this script fits (the rest are read off the study by hand)
LOW = (0.0, 0.0, 0.5, 0.0, 0.0)
HIGH = (10.0, 50.0, 100.0, 500.0, 4.5)


def read_points(path, datasets=None):
    """The measured points of a study (points.jsonl), each with its corpus's record: measured again from the prepared
    datasets where they are given (a changed measure then reaches every point), else the one each point carries."""
    with open(path) as f:
        runs = [json.loads(line) for line in f if '"best_val_bpb"' in line]
    records = {}
    for p in runs:
        if datasets is not None:
            if p["dataset"] not in records:
                records[p["dataset"]] = corpus_record(os.path.join(datasets, p["dataset"]))
            p["corpus"] = records[p["dataset"]]
        elif "corpus" not in p:
            raise SystemExit(f"{path}: point {p['name']} has no corpus record; give --datasets to measure it")
    return runs


def corpus_of(point):
    return Corpus(point["dataset"], **point["corpus"])


def tokens_of(point):
    return point["max_iters"] * point["batch_size"] * point["block_size"]


def epochs_of(point):
    return tokens_of(point) / point["corpus"]["train_tokens"]


def predictions(law, points, floors=None):
    """The law's val bpb for each point; floors: a floor for each corpus, in place of the law's e0 + e1 * hardness."""
    out = []
    for p in points:
        c = corpus_of(p)
        here = law if floors is None else {**law, "e0": floors[p["dataset"]], "e1": 0.0}
        out.append(predict_bpb(p, tokens_of(p), c, here))
    return np.array(out)


# where the fit starts: fixed, not LAW, so that a constant of LAW edited by hand is not found again where it was put
START = {**LAW, "A": 0.1, "R": 1.5, "R_dropout": 5.0, "dropout_cost": 3.0}


def fit(points, start=START):
    """The law fitted in two steps: first what it says within a corpus (A, B, R: the shapes, budgets and
    dropouts), each corpus with a floor of its own; then the floors as a line in the corpora's hardness (e0, e1).
    Within a corpus the floor cancels, so the shape the plan chooses does not hang on how well hardness predicts
    it."""
    from scipy.optimize import least_squares
    names = sorted({p["dataset"] for p in points})
    target = np.array([p["best_val_bpb"] for p in points])

    def unpack(v):
        return {**start, **dict(zip(SHARED, v[:len(SHARED)]))}, dict(zip(names, v[len(SHARED):]))
    best = None
    for b in (0.3, 0.8, 2.0):  # a few starts: the surface has shallow valleys
        x0 = [*np.clip([b if k == "B" else start[k] for k in SHARED], LOW, HIGH),
              *([1.0] * len(names))]
        def residuals(v):
            law, floors = unpack(v)
            return np.log(np.maximum(predictions(law, points, floors), 0.05)) - np.log(target)
        r = least_squares(residuals, x0, bounds=([*LOW, *[-5.0] * len(names)], [*HIGH, *[5.0] * len(names)]))
        if best is None or r.cost < best.cost:
            best = r
    law, floors = unpack(best.x)
    corpora = {p["dataset"]: corpus_of(p) for p in points}
    x = np.array([[1.0, corpora[n].hardness] for n in names])
    e0, e1 = np.linalg.lstsq(x, [floors[n] for n in names], rcond=None)[0]
    return {**law, "e0": float(e0), "e1": float(e1)}, floors


def fitted(runs):
    """(points, beyond): the runs the law describes, and the rest. The law describes the runs a plan makes: none past
    the epochs a plan schedules at its dropout (those runs peaked there, with their rate still high), none at a
    dropout it does not weigh for that text and shape (0.3; any on Chinese text; any on a shape below plan.DROPOUT_FILL
    of what the text fills without it, 0.1 above plan.LIGHT_DROPOUT_FILL of it); the rest are shown after the fit."""
    # (max_epochs without the corpus: 4 epochs of Chinese text too, where a plan schedules 3; the classical Chinese
    # corpora have points at 4 epochs only, and their floors are the law's)
    points = [p for p in runs if epochs_of(p) <= 1.1 * max_epochs(p["dropout"])
              and p["dropout"] in planned_dropouts(corpus_of(p), p)]
    return points, [p for p in runs if p not in points]


def budget_order(budget):
    """Minutes first, in order, then budgets in epochs ("4ep")."""
    return (0, budget) if isinstance(budget, (int, float)) else (1, float(budget.removesuffix("ep")))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--points", default=POINTS, help="a study's points (default: the committed ones)")
    p.add_argument("--study", help="a study's folder: its points.jsonl, in place of --points")
    p.add_argument("--datasets", help="the prepared datasets: each corpus's record measured again from them")
    p.add_argument("--write", help="write the points, with the records measured, to this file (docs/minutes_points.jsonl)")
    p.add_argument("--png")
    args = p.parse_args()
    runs = read_points(os.path.join(args.study, "points.jsonl") if args.study else args.points, args.datasets)
    corpora = {p["dataset"]: corpus_of(p) for p in runs}
    if args.write:
        with open(args.write, "w") as f:
            f.writelines(json.dumps(p) + "\n" for p in runs)
    points, beyond = fitted(runs)
    law, floors = fit(points)
    pred = predictions(law, points)
    within = predictions(law, points, floors)
    rel = pred / np.array([p["best_val_bpb"] for p in points]) - 1
    print("LAW = dict(" + ", ".join(f"{k}={law[k]:.4g}" for k in FITTED) + ")")
    print(f"in-sample: rms relative error {math.sqrt((rel ** 2).mean()) * 100:.2f}%, worst {abs(rel).max() * 100:.2f}%")
    rel_within = within / np.array([p["best_val_bpb"] for p in points]) - 1
    print(f"within a corpus (its own floor): rms {math.sqrt((rel_within ** 2).mean()) * 100:.2f}%, "
          f"worst {abs(rel_within).max() * 100:.2f}%")
    print("floors: " + ", ".join(f"{n} {f:.3f} (hardness {corpora[n].hardness:.3f})"
                                 for n, f in floors.items()))
    print(f"\n{'point':34s} {'params':>7s} {'tokens':>7s} {'epochs':>6s} {'val bpb':>8s} {'law':>7s}")
    for pt, y, e in zip(points, pred, rel):
        c = corpus_of(pt)
        tokens = tokens_of(pt)
        print(f"{pt['name']:34s} {12 * pt['n_layer'] * pt['n_embd'] ** 2 / 1e6:6.2f}M {tokens / 1e6:6.2f}M "
              f"{tokens / c.train_tokens:6.1f} {pt['best_val_bpb']:8.4f} {y:7.4f} {e * 100:+5.1f}%")
    if beyond:
        print("\nnot fitted: runs scheduled past the epochs a plan allows at their dropout (their best came sooner), "
              "or at a dropout the plan does not choose")
        for pt in beyond:
            print(f"{pt['name']:34s} {epochs_of(pt):6.1f} epochs, best at iteration {pt['best_iter']:,} "
                  f"of {pt['max_iters']:,}: {pt['best_val_bpb']:.4f}")
    # leave one corpus out: the law without a corpus, on that corpus
    print("\nleave one corpus out (fitted on the others, predicting this one):")
    errors = []
    for name in sorted({p["dataset"] for p in points}):
        rest = [p for p in points if p["dataset"] != name]
        held = [p for p in points if p["dataset"] == name]
        v, _ = fit(rest, law)
        e = predictions(v, held) / np.array([p["best_val_bpb"] for p in held]) - 1
        errors.extend(e)
        print(f"  {name:18s} mean {e.mean() * 100:+5.1f}%, worst {abs(e).max() * 100:5.1f}% over {len(held)} points")
    errors = np.array(errors)
    print(f"  all: rms {math.sqrt((errors ** 2).mean()) * 100:.2f}%  (LAW's rel_sigma)")
    # the best point at each corpus and budget
    print(f"\n{'corpus':18s} {'minutes':>7s} {'best shape':>10s} {'val bpb':>8s}   others")
    for name in sorted({p["dataset"] for p in runs}):
        for minutes in sorted({p["minutes"] for p in runs if p["dataset"] == name}, key=budget_order):
            here = sorted((p for p in runs if p["dataset"] == name and p["minutes"] == minutes),
                          key=lambda p: p["best_val_bpb"])
            others = ", ".join(f"{p['shape']}{'/d' + str(p['dropout']) if p['dropout'] else ''} {p['best_val_bpb']:.4f}"
                               for p in here[1:])
            b = here[0]
            print(f"{name:18s} {minutes!s:>7s} {b['shape'] + ('/d' + str(b['dropout']) if b['dropout'] else ''):>10s} "
                  f"{b['best_val_bpb']:8.4f}   {others}")
    if args.png:
        draw(points, law, floors, args.png)


def draw(points, law, floors, png):
    """Each corpus's points against parameters, a colour a budget, and the law with that corpus's own floor
    (dashed): how well it ranks shapes and budgets, the choice a plan makes."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker  # noqa: F401 (matplotlib.ticker, below)
    names = sorted({p["dataset"] for p in points})
    cols = 4
    rows = -(-(len(names) + 1) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3.4 * rows), squeeze=False)
    for ax in axes.flat[len(names) + 1:]:
        ax.axis("off")
    # the last panel: each corpus's own floor against its hardness, and the law's line through them (E)
    ax = axes.flat[len(names)]
    hardness = {p["dataset"]: p["corpus"]["hardness"] for p in points}
    ax.plot([hardness[n] for n in names], [floors[n] for n in names], "o", color="tab:gray")
    for n in names:
        ax.annotate(n, (hardness[n], floors[n]), fontsize=6)
    h = np.linspace(min(hardness.values()), max(hardness.values()), 2)
    ax.plot(h, law["e0"] + law["e1"] * h, "--", color="tab:gray")
    ax.set_title("each corpus's floor E, and the law's line")
    ax.set_xlabel("hardness (character n-grams, bits a byte)")
    ax.set_ylabel("floor (bits a byte)")
    for ax, name in zip(axes.flat, names):
        budgets = sorted({p["minutes"] for p in points}, key=budget_order)
        colours = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink", "tab:olive",
                   "tab:cyan")
        for minutes, colour in zip(budgets, colours):
            for dropout, marker in zip(DROPOUTS, "o^sD"):  # the dropouts a plan weighs, each its marker
                here = sorted((p for p in points if p["dataset"] == name and p["minutes"] == minutes
                               and p["dropout"] == dropout), key=lambda p: p["n_embd"] * p["n_layer"])
                if not here:
                    continue
                n = [12 * p["n_layer"] * p["n_embd"] ** 2 / 1e6 for p in here]
                label = f"{minutes:g} min" if isinstance(minutes, (int, float)) else minutes
                ax.plot(n, [p["best_val_bpb"] for p in here], marker, color=colour,
                        label=label + (f", dropout {dropout:g}" if dropout else ""))
                ax.plot(n, predictions(law, here, floors), "--", color=colour)
        ax.set_xscale("log")
        ax.set_xticks(sorted({12 * p["n_layer"] * p["n_embd"] ** 2 / 1e6 for p in points if p["dataset"] == name}))
        ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda x, _: f"{x:.2g}"))  # the shapes' sizes
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
        ax.ticklabel_format(axis="y", useOffset=False)  # a corpus with one point: its value, not an offset
        low, high = ax.get_ylim()
        if high - low < 0.02:  # one point, or points close together: a window of 0.02 around them
            ax.set_ylim((low + high) / 2 - 0.01, (low + high) / 2 + 0.01)
        ax.set_title(name)
        ax.set_xlabel("parameters in the blocks (M)")
    for row in axes:
        row[0].set_ylabel("best val bpb, and the law (dashed)")
    for ax in axes.flat[:len(names)]:
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(png, dpi=110)


if __name__ == "__main__":
    main()
