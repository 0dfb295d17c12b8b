"""nanogpt.cpu's choices for decoding on a CPU: the float32 kernel it measures faster, and the threads it takes
on a loaded machine."""
import time

import pytest
import torch
import torch.nn.functional as F

import nanogpt.cpu
from nanogpt.cpu import native
from nanogpt.cpu import threads as threads_module
from nanogpt.cpu.kernels import onednn_available
from nanogpt.cpu.threads import Threads


@pytest.mark.skipif(not onednn_available(), reason="this PyTorch build has no oneDNN")
@pytest.mark.parametrize("slow", ["packed", "plain"])
def test_the_float32_kernel_is_the_one_measured_faster_and_measured_once(monkeypatch, slow):
    monkeypatch.setattr(nanogpt.cpu, "FLOAT32_KERNEL", None)
    monkeypatch.setattr(nanogpt.cpu, "_kernels", {})
    calls = []
    real_packed, real_linear = nanogpt.cpu.packed_product, F.linear

    def packed(*a):
        calls.append("packed")
        time.sleep(0.002 if slow == "packed" else 0)
        return real_packed(*a)

    def plain(*a):
        calls.append("plain")
        time.sleep(0.002 if slow == "plain" else 0)
        return real_linear(*a)
    monkeypatch.setattr(nanogpt.cpu, "packed_product", packed)
    monkeypatch.setattr(nanogpt.cpu.F, "linear", plain)
    linears = [torch.nn.Linear(32, 48), torch.nn.Linear(48, 32)]
    assert nanogpt.cpu.float32_kernel(linears) == ({"packed", "plain"} - {slow}).pop()
    assert calls.count("packed") == calls.count("plain") == 12  # 6 passes over 2 layers each, alternated
    nanogpt.cpu.float32_kernel(linears)
    assert len(calls) == 24  # measured once for these shapes, rows and threads
    assert nanogpt.cpu.float32_kernel(linears, copies=False) == "plain"  # no copy: not measured
    monkeypatch.setattr(nanogpt.cpu, "FLOAT32_KERNEL", slow)
    assert nanogpt.cpu.float32_kernel(linears) == slow  # set, not measured


@pytest.mark.skipif(not native.available(), reason=f"no native products here: {native.why()}")
@pytest.mark.parametrize("quantized", [False, True])
@pytest.mark.parametrize("slow", ["native", "torch"])
def test_decoding_takes_the_step_measured_faster_native_or_pytorchs(monkeypatch, tiny_config, slow, quantized):
    """With no kernel set, decoding times the fused step on decode.c's products against the step on PyTorch's
    (STEP_PROBES steps a pass, 6 passes each, alternated), keeps the faster for the whole generation, and measures
    once per process; a kernel set is taken as it is."""
    from nanogpt.cpu.fused_step import FusedStep
    from nanogpt.generate import stream
    from nanogpt.quantize import quantize
    for name in ("FLOAT32_KERNEL", "INT8_KERNEL"):
        monkeypatch.setattr(nanogpt.cpu, name, None)
    monkeypatch.setattr(nanogpt.cpu, "_kernels", {})
    from model import GPT
    model = GPT(tiny_config).eval()
    if quantized:
        quantize(model, "int8")
    calls, real = [], FusedStep.__call__

    def timed(self, *a):
        kind = "native" if self.blocks[0][1].kind == "native" else "torch"
        calls.append(kind)
        time.sleep(0.002 if kind == slow else 0)
        return real(self, *a)
    monkeypatch.setattr(FusedStep, "__call__", timed)
    idx = torch.zeros(1, 1, dtype=torch.long)

    def generate(model, idx, n, temperature):  # one step a call (greedy runs would take several in one)
        return list(stream(model, idx, n, temperature=temperature))
    generate(model, idx, 5, temperature=0)
    probes = 2 * 6 * nanogpt.cpu.STEP_PROBES
    assert calls[:probes].count("native") == calls[:probes].count("torch")
    assert calls[probes:] == ["torch" if slow == "native" else "native"] * 4  # the generation's steps
    generate(model, idx, 5, temperature=0)
    assert len(calls) == probes + 8  # not measured again
    monkeypatch.setattr(nanogpt.cpu, "INT8_KERNEL" if quantized else "FLOAT32_KERNEL", slow if slow == "native" else
                        "int8" if quantized else "plain")
    del calls[:]
    generate(model, idx, 5, temperature=0)
    assert calls == [slow] * 4  # set: not measured, taken even where slower


class Load:
    """Scripted /proc/stat readings: each look, others keep `busy` cores busy for a second."""

    def __init__(self, monkeypatch, busy):
        self.busy, self.t = busy, 0.0
        monkeypatch.setattr(threads_module, "_last", (0.0, 0.0, 0.0))
        monkeypatch.setattr(threads_module, "reading", self.reading)
        monkeypatch.setattr(threads_module.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
        self.machine = 0.0

    def reading(self):
        self.t += 1.0
        self.machine += self.busy + 1.5  # this process's own 1.5 core-seconds do not count against it
        return self.machine, 1.5 * self.t, self.t


@pytest.mark.parametrize("busy,expected", [(0.0, 4), (1.0, 3), (2.6, 1), (3.9, 1)])
def test_decoding_takes_the_cores_other_processes_leave_idle(monkeypatch, busy, expected):
    given = torch.get_num_threads()
    try:
        torch.set_num_threads(4)
        load = Load(monkeypatch, busy)
        threads = Threads()
        assert torch.get_num_threads() == expected
        load.busy = 0.0  # the other process ended: the next look takes every core back
        threads.checked -= threads_module.CHECK_SECONDS
        threads.check()
        assert torch.get_num_threads() == 4
        load.busy = 3.0
        threads.check()  # too soon after the last look: unchanged
        assert torch.get_num_threads() == 4
        threads.restore()
        assert torch.get_num_threads() == 4
    finally:
        torch.set_num_threads(given)


def test_one_thread_given_or_no_proc_stat_leaves_the_count_alone(monkeypatch):
    given = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        Load(monkeypatch, 0.0)
        Threads()
        assert torch.get_num_threads() == 1  # OMP_NUM_THREADS=1 is a ceiling
        torch.set_num_threads(3)
        monkeypatch.setattr(threads_module, "reading", lambda: None)
        Threads().set()
        assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(given)


def test_generation_gives_back_the_thread_count_it_found(monkeypatch, tiny_config):
    from model import GPT
    from nanogpt.generate import generate
    given = torch.get_num_threads()
    try:
        torch.set_num_threads(4)
        Load(monkeypatch, 2.0)
        seen = []
        real = nanogpt.cpu.FusedStep.__call__
        monkeypatch.setattr(nanogpt.cpu.FusedStep, "__call__",
                            lambda self, *a: seen.append(torch.get_num_threads()) or real(self, *a))
        generate(GPT(tiny_config).eval(), torch.zeros(1, 2, dtype=torch.long), 5, temperature=0)
        assert seen and set(seen) == {2} and torch.get_num_threads() == 4
    finally:
        torch.set_num_threads(given)


def test_the_load_counts_only_the_cpus_this_process_may_run_on(tmp_path):
    """/proc/stat's cpuN lines of the process's own CPUs: a container that sees 64 busy host CPUs but runs on two
    idle ones must not drop to one thread."""
    import os
    stat = tmp_path / "stat"
    stat.write_text("cpu  900 0 900 100 0 0 0 0 0 0\n"
                    "cpu0 100 0 100 50 0 0 0 0 0 0\n"
                    "cpu1 200 0 0 50 7 0 0 0 0 0\n"
                    "cpu2 300 0 300 0 0 0 0 0 0 0\n"
                    "intr 12345\n")
    ticks = os.sysconf("SC_CLK_TCK")
    assert threads_module.cpu_seconds(str(stat), {0, 1}) == pytest.approx(400 / ticks)  # idle, iowait left out
    assert threads_module.cpu_seconds(str(stat), {2}) == pytest.approx(600 / ticks)
    assert threads_module.cpu_seconds(str(tmp_path / "none"), {0}) is None


def test_bfloat16_copies_are_made_once_and_again_after_a_change(tiny_config):
    """decode.c's bfloat16 copies are kept while the weight lives unchanged: the same copy for the same weight,
    a new one after an in-place change or `.data =`, and the entry gone with the weight."""
    import gc

    from model import GPT
    from nanogpt.cpu import _bfloat16_copies, bfloat16_copy
    model = GPT(tiny_config)
    w = model.transformer.h[0].mlp.c_fc.weight
    first = bfloat16_copy(w)
    assert bfloat16_copy(w) is first and torch.equal(first, w.detach().bfloat16())
    with torch.no_grad():
        w.mul_(2)
    second = bfloat16_copy(w)
    assert second is not first and torch.equal(second, w.detach().bfloat16())
    w.data = torch.randn_like(w)
    third = bfloat16_copy(w)
    assert third is not second and torch.equal(third, w.detach().bfloat16())
    key = id(w)
    del model, w
    gc.collect()
    assert key not in _bfloat16_copies


@pytest.mark.skipif(not native.available(), reason=f"no native products here: {native.why()}")
def test_bfloat16_generation_after_a_weight_changes_reads_the_new_weight(monkeypatch, tiny_config):
    """Two generations under bfloat16 autocast on decode.c's products, the weights changed in place between them:
    the second gives the changed model's greedy tokens, not the kept copy's."""
    import copy

    from nanogpt.cpu.kernels import bfloat16_products_supported
    from nanogpt.generate import generate
    from test_fused_step import sharp32
    from test_model_options import OPTIONS
    if not bfloat16_products_supported():
        pytest.skip("this CPU has no native bfloat16 products")
    from dataclasses import replace
    monkeypatch.setattr(nanogpt.cpu, "BFLOAT16_KERNEL", "native")
    model = sharp32(replace(tiny_config, **OPTIONS["modern"]))
    idx = torch.randint(0, 64, (2, 4), generator=torch.Generator().manual_seed(3))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        before = generate(model, idx, 10, temperature=0)
        with torch.no_grad():
            for block in model.transformer.h:
                block.mlp.c_proj.weight.mul_(-3)
        after = generate(model, idx, 10, temperature=0)
        fresh = generate(copy.deepcopy(model), idx, 10, temperature=0)
    assert torch.equal(after, fresh) and not torch.equal(after, before)


@pytest.mark.skipif(not native.available(), reason=f"no native products here: {native.why()}")
def test_a_bfloat16_prompt_reads_the_kept_copies_and_gives_autocasts_numbers(monkeypatch, tiny_config):
    """Under bfloat16 autocast on decode.c's products, the prompt's linear layers read the kept bfloat16 copies
    (rounding each weight again at every call cost 6 ms of a one-token prompt on the 6 x 384 model) and give
    autocast's own logits bit for bit; with autograd they read the weights themselves, and gradients flow."""
    from nanogpt.cpu.kernels import bfloat16_products_supported
    from test_fused_step import sharp32
    if not bfloat16_products_supported():
        pytest.skip("this CPU has no native bfloat16 products")
    monkeypatch.setattr(nanogpt.cpu, "BFLOAT16_KERNEL", "native")
    model = sharp32(tiny_config)  # biases too: autocast rounds them
    linears = sum(isinstance(m, torch.nn.Linear) for m in model.modules())
    idx = torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(5))
    read, real = [], nanogpt.cpu.bfloat16_copy
    monkeypatch.setattr(nanogpt.cpu, "bfloat16_copy", lambda w: read.append(w) or real(w))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with torch.inference_mode():
            plain, _ = model(idx)
            with nanogpt.cpu.decoding(model, 2):
                made = len(read)
                copied, _ = model(idx)
                assert len(read) - made == linears  # every product of the prompt read a kept copy
        assert torch.equal(copied, plain)
        with nanogpt.cpu.decoding(model, 2):
            made = len(read)
            logits, _ = model(idx)
            assert len(read) == made
            logits.float().sum().backward()
    assert model.lm_head.weight.grad is not None
