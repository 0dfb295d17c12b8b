"""The targets of train.py --minutes, measured (docs/minutes.md): a plan against a hand-tuned recipe at the same
wall time, and a plan at several budgets, each best checkpoint scored the same way.

    python runs/minutes_bench.py --dataset DIR --against config/shakespeare_char_cpu.py --out /tmp/mb/pride
    python runs/minutes_bench.py --dataset DIR --budgets 1,3,10 --out /tmp/mb/pride
    python runs/minutes_bench.py --dataset DIR --distil 10 --out /tmp/mb/pride100k
    python runs/minutes_bench.py --rescore /tmp/mb

--rescore DIR: every planned run under DIR (each log.jsonl with a plan and its result, a plan in parts' own parts
included) with its prediction, its own evaluation, and its best.pt over the whole val split in windows of the run's
own block size: a short run on a large vocabulary affords 24 of its val windows an evaluation, and the prediction is
of the whole text. Nothing is trained; one line a run, also to DIR/rescored.jsonl.

--distil M: M minutes as three runs by hand (docs/minutes.md, "More minutes than a text is worth"): a plan of 0.3 M,
the same with --seed=2, and a plan of 0.4 M that distils both (--teacher); each scored, the first two's ensemble too
(the mean of their probabilities), with the three runs' time in all. A plan splits its budget so by itself where its
text is used up well before it (from 2 minutes); --distil splits any budget, for a text where the plan does not, and
--budgets scores a plan's teachers and their ensemble where it did.

--against: the recipe retargeted to DIR (--dataset, its own out_dir) runs to completion, timed from process start to
exit; then train.py --dataset=DIR --minutes=(that time) runs, timed the same way. --budgets: one plan per budget.
Every best.pt is then scored over the whole val split in consecutive windows of --context tokens (64: the shortest
context of the recipes compared), each token predicted from the window before it, in bits per byte: the same
tokens and the same contexts for every model. Results go to OUT/results.jsonl, one line a run, and a table; a
plan's row also shows its prediction revised, halfway by the run's own val bpb (plan.halfway_revision) or, for a
plan in parts, by its teachers' measurements (parts.revised), and how far that is off its own evaluation (--rescore
too). Run it on a quiet machine: the budgets are wall time.
"""
import argparse
import contextlib
import json
import math
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def timed(args, log):
    """Seconds from start to exit of `python train.py args`; raises on failure."""
    t0 = time.time()
    r = subprocess.run([sys.executable, "train.py", *args], cwd=ROOT, capture_output=True, text=True)
    seconds = time.time() - t0
    with open(log, "w") as f:
        f.write(r.stdout + r.stderr)
    if r.returncode != 0:
        raise SystemExit(f"train.py {' '.join(args)} failed (rc {r.returncode}); see {log}")
    return seconds


def score(ckpt_dir, dataset, context):
    """Bits per byte of best.pt in ckpt_dir over dataset's whole val split, in windows of `context` tokens."""
    from nanogpt.source import Source, load_model
    model, _ = load_model(Source(init_from=ckpt_dir, ckpt="best.pt"))
    return val_bpb(model, dataset, context)


class Ensemble:
    """Models whose mean probability is one prediction: called as a model, it returns the log of that mean (as
    logits: their softmax is the mean itself)."""

    def __init__(self, models):
        self.models, self.config = models, models[0].config  # one vocabulary: val_bpb reads it

    def __call__(self, x):
        from nanogpt.training.distill import log_mean_probs
        return log_mean_probs([m(x)[0] for m in self.models]), None


def ensemble_score(ckpt_dirs, dataset, context):
    """Bits per byte of the mean probability of the best.pt in each of ckpt_dirs, as score() scores one."""
    from nanogpt.source import Source, load_model
    return val_bpb(Ensemble([load_model(Source(init_from=d, ckpt="best.pt"))[0] for d in ckpt_dirs]), dataset,
                   context)


def val_bpb(model, dataset, context, autocast=contextlib.nullcontext):
    """Bits per byte of model over dataset's whole val split, in consecutive windows of `context` tokens, each token
    predicted from the window before it (computed within autocast()): the same tokens and contexts for every model."""
    import numpy as np
    import torch
    import torch.nn.functional as F

    from nanogpt.tokenizer import read_meta, token_byte_lengths, tokenizer_from_meta
    meta = read_meta(dataset)
    lengths = torch.tensor(token_byte_lengths(tokenizer_from_meta(meta), model.config.vocab_size), dtype=torch.float64)
    val = np.fromfile(os.path.join(dataset, "val.bin"), dtype=np.dtype(meta.get("dtype", "uint16"))).astype(np.int64)
    n = (len(val) - 1) // context
    x = torch.from_numpy(val[:n * context].reshape(n, context))
    y = torch.from_numpy(val[1:n * context + 1].reshape(n, context))
    nats, nbytes = 0.0, 0.0
    with torch.no_grad(), autocast():
        for i in range(0, n, 64):
            logits, _ = model(x[i:i + 64])
            loss = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), y[i:i + 64].reshape(-1), reduction="sum")
            nats += loss.item()
            nbytes += lengths[y[i:i + 64].reshape(-1)].sum().item()
    return nats / math.log(2) / nbytes


def distilled(minutes, dataset, out, context):
    """The rows of --distil: plans A and B (B with --seed=2), their ensemble, and a plan S distilled from both, of the
    shares of `minutes` the plan's line offers; then the three runs in all."""
    from nanogpt.training.plan import DISTILL_SHARES  # the shares the plan's line offers
    rows, total = [], 0.0
    # A and B one run each, as by hand (a budget of 34 minutes or more would split each share into three of its
    # own); S learns from teachers, which a plan never splits
    extras = (["--plan_teachers=False"], ["--seed=2", "--plan_teachers=False"], [f"--teacher={out}/A,{out}/B"])
    for name, share, extra in zip("ABS", DISTILL_SHARES, extras):
        run_dir = os.path.join(out, name)
        seconds = timed([f"--dataset={dataset}", f"--out_dir={run_dir}", f"--minutes={share * minutes:.4f}", *extra],
                        run_dir + ".log")
        total += seconds
        rows.append({"run": f"{name}: --minutes={share * minutes:.3f} {' '.join(extra)}".strip(), "seconds": seconds,
                     "budget": share * minutes * 60, "bpb": score(run_dir, dataset, context), **plan_of(run_dir)})
        if name == "B":
            rows.append({"run": "A and B, the mean of their probabilities", "seconds": 0.0,
                         "bpb": ensemble_score([os.path.join(out, "A"), run_dir], dataset, context)})
    rows.append({"run": f"the three, in {minutes:g} minutes", "seconds": total, "bpb": rows[-1]["bpb"]})
    return rows


def latest_run(out_dir):
    """The records of out_dir/log.jsonl from the start of its latest run on (a log only grows: an out_dir used again
    holds the runs before it too, and best.pt is the latest's): from its last config record of a first iteration
    that is not a plan in parts' third run, which writes into the same log."""
    from nanogpt.training.parts import is_third_part, records
    found = records(out_dir)
    starts = [i for i, r in enumerate(found) if r.get("kind") == "config" and r.get("iter") == 0 and not is_third_part(r)]
    return found[starts[-1]:] if starts else found


def plan_of(out_dir, found=None):
    found = latest_run(out_dir) if found is None else found
    plan = next(r for r in found if r.get("kind") == "plan")  # the first: a plan in parts' own, then its model's
    results = [r for r in found if r.get("kind") == "plan_result"]  # the last: a plan in parts' result
    revised = results[-1].get("revised_val_bpb") if results else None
    return {"shape": plan["shape"], "iters": plan["iters"], "epochs": plan["epochs"], "dropout": plan["dropout"],
            "predicted_val_bpb": plan["predicted_val_bpb"], "parts": bool(plan.get("parts")),
            "measured_val_bpb": results[-1].get("measured_val_bpb") if results else None,
            "revised_val_bpb": revised or (None if plan.get("parts") else halfway_of(found, plan))}


def halfway_of(found, plan):
    """The val bpb a run's halfway revision predicts: as it recorded it, or for a run from before train.py revised,
    as it would have (plan.halfway_revision at its evaluations, with the val bpb of the best val loss so far, the
    end moved as its budget records moved it)."""
    from nanogpt.training.plan import halfway_revision
    recorded = [r for r in found if r.get("kind") == "revision"]
    if recorded:
        return recorded[0].get("revised_val_bpb")
    cfg, end, best = next(r for r in found if r.get("kind") == "config"), plan["iters"], None
    for r in found:
        if r.get("kind") == "budget":
            end = r["max_iters"]
        elif r.get("kind") == "eval" and r.get("val_bpb") is not None:
            if best is None or r["val_loss"] < best["val_loss"]:
                best = r
            revision = halfway_revision(plan, cfg, r["iter"], end, best["val_bpb"])
            if revision is not None:
                return revision[0]
    return None


def rescore(root):
    """--rescore: each planned run under root, its prediction against its own evaluation and against best.pt over the
    whole val split, in windows of the run's own block size. A run that cannot be scored is one line and skipped."""
    from nanogpt.source import Source, load_trained
    rows = []
    with open(os.path.join(root, "rescored.jsonl"), "a") as out:
        for here, _, files in sorted(os.walk(root)):
            if "log.jsonl" not in files or "best.pt" not in files:
                continue
            name = os.path.relpath(here, root)
            try:
                found = latest_run(here)
                if not any(r.get("kind") == "plan" for r in found):
                    continue
                row = plan_of(here, found)
                if not row["measured_val_bpb"]:
                    continue
                model, _, dataset = load_trained(Source(init_from=here, ckpt="best.pt"))
                whole = val_bpb(model, dataset, model.config.block_size)
            except Exception as e:  # noqa: BLE001  (a folder of someone's runs: say which and go on)
                print(f"{name}: not scored: {type(e).__name__}: {str(e)[:200]}", flush=True)
                continue
            rows.append({"run": name, "dataset": dataset, "context": model.config.block_size, **row,
                         "whole_val_bpb": whole})
            out.write(json.dumps(rows[-1]) + "\n")
            out.flush()
            revised = row["revised_val_bpb"]
            print(f"{name:50s} {os.path.basename(dataset):12s} predicted {row['predicted_val_bpb']:.4f}  its eval "
                  f"{row['measured_val_bpb']:.4f} ({(row['predicted_val_bpb'] / row['measured_val_bpb'] - 1) * 100:+.1f}%)"
                  f"  whole val {whole:.4f} ({(row['predicted_val_bpb'] / whole - 1) * 100:+.1f}%)"
                  + (f"  revised {revised:.4f} ({(revised / row['measured_val_bpb'] - 1) * 100:+.1f}%)" if revised
                     else ""), flush=True)
    return rows


def teacher_rows(out, dataset, context):
    """A plan in parts' teachers (out/teacher-a, out/teacher-b), each scored, and their ensemble."""
    from nanogpt.training.plan import TEACHER_DIRS
    dirs = [os.path.join(out, name) for name in TEACHER_DIRS]
    rows = [{"run": f"  its {name}", "seconds": 0.0, "bpb": score(d, dataset, context)}
            for name, d in zip(TEACHER_DIRS, dirs)]
    return rows + [{"run": "  its teachers' mean probability", "seconds": 0.0,
                    "bpb": ensemble_score(dirs, dataset, context)}]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset")
    p.add_argument("--out")
    p.add_argument("--rescore", help="a folder of earlier runs: score each planned run's best.pt over the whole val split")
    p.add_argument("--against", help="a recipe (config file) to retarget and run first; the plan gets its time")
    p.add_argument("--budgets", help="minutes, comma-separated: a plan at each")
    p.add_argument("--distil", type=float, help="minutes: two plans and a third distilled from both, in that time")
    p.add_argument("--one_run", action="store_true", help="plans of one run each (--plan_teachers=False)")
    p.add_argument("--context", type=int, default=64)
    args = p.parse_args()
    if args.rescore:
        if not os.path.isdir(args.rescore):
            p.error(f"--rescore {args.rescore}: no such folder")
        if any((args.dataset, args.out, args.against, args.budgets, args.distil, args.one_run)):
            p.error("--rescore scores runs already made: give it alone")
        rescore(os.path.abspath(args.rescore))
        return
    if not (args.dataset and args.out):
        p.error("--dataset and --out are required (or --rescore DIR)")
    args.out = os.path.abspath(args.out)  # the runs start in the repository, wherever this was started
    os.makedirs(args.out, exist_ok=True)
    dataset = os.path.abspath(args.dataset)
    rows = []
    runs = []
    if args.against:
        base = os.path.join(args.out, "recipe")
        seconds = timed([args.against, f"--dataset={dataset}", f"--out_dir={base}"], base + ".log")
        rows.append({"run": args.against, "seconds": seconds, "bpb": score(base, dataset, args.context)})
        runs.append(seconds / 60)
    runs += [float(b) for b in (args.budgets or "").split(",") if b]
    for minutes in runs:
        out = os.path.join(args.out, f"plan-{minutes:.3f}m" + ("-one" if args.one_run else ""))
        one = ["--plan_teachers=False"] if args.one_run else []
        seconds = timed([f"--dataset={dataset}", f"--out_dir={out}", f"--minutes={minutes:.4f}", *one], out + ".log")
        rows.append({"run": f"--minutes={minutes:.3f} {' '.join(one)}".strip(), "seconds": seconds, "budget": minutes * 60,
                     "bpb": score(out, dataset, args.context), **plan_of(out)})
        if rows[-1]["parts"]:  # the plan ran three: its teachers too
            rows += teacher_rows(out, dataset, args.context)
    if args.distil:
        rows += distilled(args.distil, dataset, args.out, args.context)
    with open(os.path.join(args.out, "results.jsonl"), "a") as f:
        for row in rows:
            f.write(json.dumps({"dataset": dataset, "context": args.context, **row}) + "\n")
    # val bpb: this script's score (the same windows for every run); the prediction is of the run's own evaluation
    # (train.py's windows at its own context), printed beside it: the two differ by the context each scores with
    nan = float("nan")
    print(f"{'run':34s} {'seconds':>8s} {'budget':>7s} {'val bpb':>8s} {'predicted':>9s} {'its eval':>8s} "
          f"{'off':>6s} {'shape':>5s} {'epochs':>7s} {'revised':>7s} {'off':>6s}")
    for r in rows:
        if "predicted_val_bpb" in r:  # a plan's run; the recipe's, the ensemble's and the total have no plan
            measured, revised = r.get("measured_val_bpb") or nan, r.get("revised_val_bpb")
            plan = (f"{r['budget']:7.1f} {r['bpb']:8.4f} {r['predicted_val_bpb']:9.4f} {measured:8.4f} "
                    f"{(r['predicted_val_bpb'] / measured - 1) * 100:+5.1f}% {r['shape']:>5s} {r['epochs']:7.1f}"
                    + (f" {revised:7.4f} {(revised / measured - 1) * 100:+5.1f}%" if revised else ""))
        else:
            plan = f"{'':7s} {r['bpb']:8.4f}"
        print(f"{r['run']:34s} {r['seconds']:8.1f} {plan}")
    if args.against:
        change = 1 - rows[1]["bpb"] / rows[0]["bpb"]
        print(f"the plan against {args.against} at {rows[0]['seconds']:.1f} s: val bpb {rows[1]['bpb']:.4f} against "
              f"{rows[0]['bpb']:.4f} ({abs(change) * 100:.1f}% {'lower' if change >= 0 else 'higher'})")


if __name__ == "__main__":
    main()
