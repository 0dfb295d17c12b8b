"""train.py with and without keep_freed_memory (nanogpt/cpu/heap.py), alternated: each run's median ms an iteration,
its CPU seconds in the kernel and its peak memory.

    python runs/heap_ab.py --pairs 3 -- --dataset=shakespeare --device=cpu --compile=False --n_layer=2 --n_head=2 \\
        --n_embd=64 --block_size=256 --batch_size=6 --gradient_accumulation_steps=1 --max_iters=20 --eval_iters=1 \\
        --eval_interval=1000 --log_interval=1

Each run is its own process (the setting is the process's), its out_dir a temporary one. "glibc" runs train.py
with keep_freed_memory made a no-op: glibc's malloc as it comes.
"""
import argparse
import os
import re
import resource
import runpy
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def child(mode, args):
    """Run train.py with args in this process; the last line on stderr is its rusage."""
    sys.path.insert(0, ROOT)
    os.chdir(ROOT)
    if mode == "glibc":
        import nanogpt.training.startup as startup
        startup.keep_freed_memory = lambda: False
    sys.argv = ["train.py", *args]
    try:
        runpy.run_path(os.path.join(ROOT, "train.py"), run_name="__main__")
    finally:
        r = resource.getrusage(resource.RUSAGE_SELF)
        print(f"rusage: sys {r.ru_stime:.1f} s, peak {r.ru_maxrss / 1024:.0f} MB", file=sys.stderr)


def run(mode, args):
    with tempfile.TemporaryDirectory() as out:
        p = subprocess.run([sys.executable, __file__, "--child", mode, "--", *args, f"--out_dir={out}"],
                           capture_output=True, text=True)
    if p.returncode:
        sys.exit(f"train.py failed ({mode}):\n{p.stderr[-2000:]}")
    ms = [float(m) for m in re.findall(r"([0-9.]+) ms/iter", p.stdout)][2:]  # the first lines include warm-up
    return statistics.median(ms), p.stderr.strip().splitlines()[-1]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--child", choices=["glibc", "kept"])
    ap.add_argument("args", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    args = a.args[1:] if a.args[:1] == ["--"] else a.args
    if a.child:
        return child(a.child, args)
    medians = {"glibc": [], "kept": []}
    for i in range(a.pairs):
        for mode in medians:
            ms, usage = run(mode, args)
            medians[mode].append(ms)
            print(f"pair {i + 1} {mode}: median {ms:.1f} ms an iteration; {usage}", flush=True)
    glibc, kept = (statistics.median(medians[m]) for m in medians)
    print(f"median of medians: glibc {glibc:.1f} ms, kept {kept:.1f} ms ({glibc / kept:.2f}x)")


if __name__ == "__main__":
    main()
