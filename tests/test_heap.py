"""heap.py: after keep_freed_memory, a large tensor made and freed again and again is found in the heap, not mapped
and faulted in afresh each time; a CPU training run sets it before its probe."""
import os
import subprocess
import sys

import pytest
import torch

from conftest import ROOT, on_glibc

# Makes and frees a 64 MiB tensor six times, counting the minor page faults (pages the kernel mapped and zeroed
# for it), then the same after keep_freed_memory: "faults before after applied"
SCRIPT = """
import resource, sys, torch
sys.path.insert(0, sys.argv[1])
from nanogpt.cpu.heap import keep_freed_memory

def faults():
    start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(6):
        t = torch.empty(1 << 24)
        t.fill_(1.0)
        del t
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - start

before = faults()
applied = keep_freed_memory()
print(before, faults(), applied)
"""
PAGES = (64 << 20) // os.sysconf("SC_PAGE_SIZE")  # the tensor's pages

glibc = pytest.mark.skipif(not on_glibc(), reason="glibc's malloc")


def faults(env=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "THP_"))} | (env or {})
    out = subprocess.run([sys.executable, "-c", SCRIPT, ROOT], capture_output=True, text=True, env=env, check=True)
    before, after, applied = out.stdout.split()
    return int(before), int(after), applied == "True"


@glibc
def test_a_large_tensor_freed_is_reused_without_faulting_its_pages_in_again():
    before, after, applied = faults()
    if before < 3 * PAGES:  # huge pages for every mapping (THP "always"): the kernel faults 2 MiB at a time
        pytest.skip(f"this kernel faulted {before} pages for six 64 MiB tensors: nothing to save")
    assert applied
    assert after < 3 * PAGES  # the first tensor or two grow the heap; the others reuse it (mapped afresh: 6 x PAGES)


@glibc
def test_the_users_own_malloc_settings_are_kept():
    before, after, applied = faults({"MALLOC_MMAP_THRESHOLD_": "131072"})
    assert not applied
    assert after > 3 * PAGES  # glibc's own behaviour, at the user's threshold: each tensor mapped afresh


# Six 64 MiB tensors at once from the kept heap, then freed: the process's resident memory above where it began
# (MiB) with them kept, after trim_freed_memory, kept again by the same tensors made and freed (the heap still keeps),
# and after release_freed_memory: "kept trimmed again released"
RELEASE = """
import re, sys, torch
sys.path.insert(0, sys.argv[1])
from nanogpt.cpu.heap import keep_freed_memory, release_freed_memory, trim_freed_memory

def resident():
    return int(re.search(r"VmRSS:\\s+(\\d+) kB", open("/proc/self/status").read()).group(1)) // 1024

def kept():
    tensors = [torch.ones(1 << 24) for _ in range(6)]
    del tensors
    return resident() - start

assert keep_freed_memory()
start = resident()
first = kept()
trim_freed_memory()
trimmed = resident() - start
again = kept()
release_freed_memory()
print(first, trimmed, again, resident() - start)
"""


@glibc
def test_the_heaps_free_memory_goes_back_trimmed_and_released():
    """Before the memory free is read (memory.settle_heap) the heap hands back what a probe freed,
    and goes on keeping; a run that fits only without the kept heap gives it up, and what it held."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "THP_"))}
    out = subprocess.run([sys.executable, "-c", RELEASE, ROOT], capture_output=True, text=True, env=env, check=True)
    kept, trimmed, again, released = map(int, out.stdout.split())
    assert kept > 5 * 64 and again > 5 * 64  # freed, and held by the heap
    assert trimmed < 64 and released < 64  # handed back to the kernel


def test_a_cpu_training_run_keeps_freed_memory_before_its_first_iteration(tmp_path, char_dataset, monkeypatch):
    from nanogpt.training import startup
    from train import TrainConfig, train
    calls = []
    monkeypatch.setattr(startup, "keep_freed_memory", lambda: calls.append("heap"))
    build = startup.build_model
    monkeypatch.setattr(startup, "build_model", lambda *a, **k: calls.append("model") or build(*a, **k))
    train(TrainConfig(n_layer=1, n_head=2, n_embd=16, block_size=16, batch_size=2, eval_iters=1, max_iters=1,
                      eval_interval=100, device="cpu", dataset=str(char_dataset), out_dir=str(tmp_path / "out")),
          log=lambda *a: None)
    assert calls == ["heap", "model"]


@pytest.mark.parametrize("room", ["kept", "released", "neither"])
def test_a_run_that_fits_only_without_the_kept_heap_gives_it_up(monkeypatch, room):
    """Over GPT-2's vocabulary the plan's smallest model keeps 13 float32 copies of its logits where 5 are live at
    once: with memory free between the two, the run hands freed blocks back (slower) instead of swapping; with less
    than the live, it stops before allocating anything, and says the least it needs."""
    import nanogpt.memory
    from nanogpt.errors import UserError
    from nanogpt.memory import fmt_bytes, training_bytes
    from nanogpt.training import startup
    from nanogpt.training.plan import LADDER
    from nanogpt.training.train_config import TrainConfig
    config = TrainConfig(**LADDER["S0"]).model_config(vocab_size=50257)
    live, kept = training_bytes(config, 12), training_bytes(config, 12, kept=True)
    assert kept > 2 * live  # the logits (1,536 tokens x 50,257 floats) are most of it
    free = {"kept": kept, "released": (live + kept) // 2, "neither": live - 1}[room]
    monkeypatch.setattr(nanogpt.memory, "available_bytes", lambda device: free)
    heap = ["kept"]
    monkeypatch.setattr(nanogpt.memory, "trim_freed_memory", lambda: heap[-1] == "kept")
    monkeypatch.setattr(nanogpt.memory, "release_freed_memory", lambda: heap.append("released"))
    lines = []
    if room == "neither":
        with pytest.raises(UserError, match=rf"needs about {fmt_bytes(live)}, more than the .* free on cpu; lower"):
            startup.check_memory(config, 12, torch.device("cpu"), log=lines.append)
    else:
        startup.check_memory(config, 12, torch.device("cpu"), log=lines.append)
    assert heap[-1] == ("kept" if room == "kept" else "released")
    assert bool(lines) == (room == "released")
    assert all("they go back to the kernel" in line for line in lines)
