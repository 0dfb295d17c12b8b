"""generate()'s microseconds a token in two checkouts of this repository, alternated (docs/results.md): 250 greedy
(or seeded sampled) tokens from one token (--tokens 1: what a call costs before its steps) on the GPU recipe's
shape (6 x 384, block 256), random weights, each checkout in its own
process so that each loads its own code and its own decode.c.

    git worktree add /tmp/before HEAD~1
    python runs/generate_ab.py /tmp/before . --threads 1 --precision int8

Prints each round's two figures and the medians; the last tokens of each, to show they are the same.
"""
import argparse
import os
import statistics
import subprocess
import sys

ONE = """
import contextlib, statistics, sys, time
sys.path.insert(0, {repo!r})
import torch
from model import GPT, GPTConfig
from nanogpt.generate import generate
from nanogpt.quantize import quantize
torch.set_num_threads({threads})
torch.manual_seed(0)
model = GPT(GPTConfig(n_layer=6, n_head=6, n_embd=384, block_size=256, vocab_size=65, bias=False, dropout=0.0)).eval()
if {precision!r} == "int8":
    model = quantize(model, "int8")
ctx = torch.autocast("cpu", torch.bfloat16) if {precision!r} == "bfloat16" else contextlib.nullcontext()
times = []
with ctx:
    generate(model, torch.zeros(1, 1, dtype=torch.long), {tokens}, temperature={temperature},
                   generator=torch.Generator().manual_seed(0))
    for _ in range({repeats}):
        t0 = time.perf_counter()
        out = generate(model, torch.zeros(1, 1, dtype=torch.long), {tokens}, temperature={temperature},
                   generator=torch.Generator().manual_seed(0))
        times.append(time.perf_counter() - t0)
print(statistics.median(times) / {tokens} * 1e6, out[0, -5:].tolist())
"""


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("before", help="a checkout of this repository (git worktree add DIR COMMIT)")
    p.add_argument("after", help="another")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--precision", choices=("float32", "bfloat16", "int8"), default="float32")
    p.add_argument("--temperature", type=float, default=0.0, help="0: greedy; else sampled, seeded")
    p.add_argument("--rounds", type=int, default=2, help="before then after, this many times")
    p.add_argument("--repeats", type=int, default=7, help="timed generations a process (its median)")
    p.add_argument("--tokens", type=int, default=250, help="new tokens a generation")
    args = p.parse_args()
    for repo in (args.before, args.after):
        if not os.path.isfile(os.path.join(repo, "model.py")):
            print(f"error: {repo} holds no model.py; give two checkouts of this repository", file=sys.stderr)
            sys.exit(2)
    figures = {"before": [], "after": []}
    for i in range(args.rounds):
        for name, repo in (("before", args.before), ("after", args.after)):
            code = ONE.format(repo=os.path.abspath(repo), threads=args.threads, precision=args.precision,
                              repeats=args.repeats, temperature=args.temperature, tokens=args.tokens)
            line = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
            us, tokens = line.split(" ", 1)
            figures[name].append(float(us))
            print(f"round {i + 1} {name:6} {float(us):8,.1f} us a token, last tokens {tokens.strip()}")
    print(f"medians: before {statistics.median(figures['before']):,.1f} us, "
          f"after {statistics.median(figures['after']):,.1f} us ({args.precision}, {args.threads} thread(s))")


if __name__ == "__main__":
    main()
