"""heap.py: after keep_freed_memory, a large tensor made and freed again and again is found in the heap, not mapped
and faulted in afresh each time; a CPU training run sets it before its probe."""
import os
import subprocess
import sys

import pytest

from conftest import ROOT

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

glibc = pytest.mark.skipif(sys.platform != "linux" or not os.confstr("CS_GNU_LIBC_VERSION"), reason="glibc's malloc")


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
