"""CPU speed code a reader of the model can skip, behind one entry for generation: decoding(model, rows).

Within it the model's linear layers run on the matmul this CPU runs fastest for decoding, measured once per
process (float32_kernel): copies of their weights packed for oneDNN (kernels.py), or their own weights
through PyTorch's default matmul (MKL's on x86: faster on some Intel CPUs, slower on AMD's). It yields the
decode step: the cached step written flat (fused_step.py) where it applies, else the model's own cached
forward. Off the CPU, or where nothing can be packed, the step is the model's forward and nothing is copied.
Training's kernels (kernels.packed_training) are chosen by device.py.
"""
import statistics
import time
import weakref
from contextlib import contextmanager

import torch
import torch.nn as nn
import torch.nn.functional as F

from nanogpt.cpu import native
from nanogpt.cpu.fused_step import FusedStep
from nanogpt.cpu.kernels import (bfloat16_products_supported, pack, packable, packed_inference, packed_product,
                                 patched_forwards)
from nanogpt.cpu.threads import Threads
from nanogpt.quantize import Int8Linear

# bytes of linear weights decoding copies; beyond this (gpt2-large holds 3.1 GB, gpt2-xl 6.2 GB) a second copy
# could exhaust a laptop's memory, and the model decodes on its own weights
PACKED_COPY_LIMIT = 2 << 30
PACK_MIN_ROWS = 16  # the row count packed weights are laid out for, at least: oneDNN's layout for fewer is slower
PROBE_BYTES = 64 << 20  # weights a kernel choice times, at most (the first layers'): a few ms a pass
PACKED_MARGIN = 0.05  # copies are kept only where they are this much faster than what needs none: those cost no memory
_kernels = {}  # what a measurement chose, by what it measured (the weights' shapes, rows, threads)
# set, a kernel's name is the choice instead of the measurement (the tests, bench.py)
FLOAT32_KERNEL = None  # "packed", "plain" (PyTorch's) or "native" (decode.c's)
BFLOAT16_KERNEL = None  # "bfloat16" (PyTorch's oneDNN, packed) or "native"
INT8_KERNEL = None  # "int8" (PyTorch's) or "native", for layers quantized to int8
STEP_PROBES = 4  # steps each candidate decodes in a pass when the whole step is timed


def alternated(runs):
    """{name: median seconds} of runs ({name: run()}), timed in turn, 5 passes each after a warm-up, alternated."""
    seconds = {name: [] for name in runs}
    with torch.inference_mode():
        for _ in range(6):  # the first of each is a warm-up
            for name, run in runs.items():
                t0 = time.perf_counter()
                run()
                seconds[name].append(time.perf_counter() - t0)
    return {name: statistics.median(s[1:]) for name, s in seconds.items()}


def float32_kernel(linears, rows=1, copies=True):
    """"packed" or "plain": PyTorch's float32 matmul that multiplies `rows` rows by these layers' weights faster here,
    timed over the layers in turn (as a decode step reads them, the first PROBE_BYTES of them); packed copies
    only where copies is True and they are PACKED_MARGIN faster (the plain kernel costs no memory). Measured once
    per process for each set of shapes, rows and thread count (FLOAT32_KERNEL, where set, instead)."""
    if FLOAT32_KERNEL in ("packed", "plain"):
        return FLOAT32_KERNEL
    if not copies:
        return "plain"
    weights, nbytes = [], 0
    for m in linears:
        if nbytes >= PROBE_BYTES:
            break
        weights.append(m.weight.detach())
        nbytes += m.weight.numel() * 4
    key = ("float32", tuple(w.shape for w in weights), rows, torch.get_num_threads())
    if key not in _kernels:
        xs = [torch.randn(rows, w.size(1)) for w in weights]
        with torch.inference_mode():
            packed = [pack(w, max(rows, PACK_MIN_ROWS)) for w in weights]
        median = alternated({"packed": lambda: [packed_product(x, p) for x, p in zip(xs, packed)],
                             "plain": lambda: [F.linear(x, w) for x, w in zip(xs, weights)]})
        _kernels[key] = "packed" if median["packed"] < median["plain"] * (1 - PACKED_MARGIN) else "plain"
    return _kernels[key]


def native_faster(model, rows, dtype, linears, theirs, ours, scratch):
    """True where the fused step on decode.c's products (ours: (kernel, int8 kernel)) decodes `rows` rows faster
    than on PyTorch's (theirs), both timed decoding STEP_PROBES positions of scratch() (an empty cache for `rows`
    rows), alternated, medians of 5 passes; False where ours does not apply, True where only ours does. Measured
    once per process for each model shape, dtype, rows and thread count."""
    key = ("step", dtype, tuple(p.shape for p in model.parameters()), rows, torch.get_num_threads())
    if key not in _kernels:
        with copies(linears, rows, dtype, theirs[0]) as theirs_copied, \
                copies(linears, rows, dtype, ours[0]) as ours_copied:
            steps = {"theirs": FusedStep.build(model, theirs_copied, dtype, *theirs),
                     "ours": FusedStep.build(model, ours_copied, dtype, *ours)}
            if None in steps.values():
                _kernels[key] = steps["ours"] is not None and steps["theirs"] is None
            else:
                cache, tokens = scratch(), torch.zeros(rows, dtype=torch.long)

                def decode(step):
                    def run():
                        cache.pos = 0
                        for _ in range(STEP_PROBES):
                            step(tokens, cache)
                    return run
                median = alternated({name: decode(step) for name, step in steps.items()})
                _kernels[key] = median["ours"] < median["theirs"]
    return _kernels[key]


def product_dtype():
    """The dtype generation's linear layers multiply in on CPU: bfloat16 under bfloat16 autocast (--dtype=bfloat16)
    where the CPU multiplies it natively, else float32."""
    if (torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
            and bfloat16_products_supported()):
        return torch.bfloat16
    return torch.float32


@contextmanager
def decoding(model, rows, scratch=None):
    """Within: model decodes `rows` rows per step on the fastest products here; yields step(tokens, cache), the
    logits (B, 1, V) of tokens (B,) after what the cache holds, as model(tokens[:, None], kv_cache=cache)[0].
    scratch(): an empty cache for `rows` rows (generate.KVCache), on which decode.c's step and PyTorch's are timed
    against each other where both apply (native_faster); without it, decode.c's is taken where it loads.
    step.run(tokens, cache, n, temperature, draws): up to n greedy or sampled steps in one call where decode.c
    runs the step (FusedStep.run), else None. step(tokens, cache, look=False) trusts the last look at the fused step's
    validity (35 us a step in place, of a 350 us step): for a caller that has let nothing change the model since.

    The products run in product_dtype() as it is on entry (enter autocast first), on as many threads as cores
    other processes leave idle (threads.py). The step is the fused one
    while it stays valid (no hook added, weights unchanged, eval mode, the same autocast), else the model's
    forward; the packed copies are freed at the end. Layers quantized to int8 (quantize.py) need no copy.
    """
    dtype = product_dtype()
    linears = [m for m in model.modules() if isinstance(m, nn.Linear) and packable(m.weight, dtype)]
    int8s = [m for m in model.modules() if isinstance(m, Int8Linear)]
    too_big = sum(m.weight.numel() * m.weight.element_size() for m in linears) > PACKED_COPY_LIMIT
    if too_big:
        linears = []  # no copies: the model's forward (bfloat16), or products on its own weights (float32)
    chosen, int8 = (FLOAT32_KERNEL if dtype == torch.float32 else BFLOAT16_KERNEL), INT8_KERNEL
    theirs = "bfloat16" if dtype == torch.bfloat16 else "plain" if chosen or not linears else float32_kernel(
        linears, rows, copies=not too_big)  # PyTorch's kernel for the linear layers
    if chosen is None or int8 is None and int8s:
        ours = (chosen or "native", int8 or "native")
        use_native = native.available() and (scratch is None or native_faster(
            model, rows, dtype, linears, (chosen or theirs, int8 or "int8"), ours, scratch))
        chosen, int8 = ours if use_native else (chosen or theirs, int8 or "int8")
    kernel, int8 = ("plain" if too_big and chosen == "packed" else chosen), int8 or "int8"
    threads = Threads()  # the cores other processes leave idle, looked at again as the decode goes on
    try:
        with copies(linears, rows, dtype, kernel) as copied:
            fused = FusedStep.build(model, copied, dtype, kernel, int8)  # None: the model's own forward

            last = [False]  # what the last look found: the fused step still valid

            def valid(look):
                if look or not last[0]:
                    last[0] = fused is not None and fused.valid()
                return last[0]

            def step(tokens, cache, look=True):
                threads.check()
                if valid(look):
                    return fused(tokens, cache)
                return model(tokens[:, None], kv_cache=cache)[0]

            def run(tokens, cache, n, temperature=0.0, draws=None):
                threads.check()
                return fused.run(tokens, cache, n, temperature, draws) if valid(True) else None
            step.run = run
            yield step
    finally:
        threads.restore()


@contextmanager
def copies(linears, rows, dtype, kernel):
    """Within: {linear: its weight as kernel reads it}: packed for oneDNN (kernels.packed_inference, which also
    sends the layers' own forward through them), in bfloat16 for native products, or none."""
    if kernel in ("packed", "bfloat16"):
        with packed_inference(linears, max(rows, PACK_MIN_ROWS), dtype) as packed:
            yield packed
    elif kernel == "native" and dtype == torch.bfloat16:
        with patched_forwards({m: bfloat16_forward(m) for m in linears}):  # the prompt's products read them too
            yield {m: bfloat16_copy(m.weight) for m in linears}
    else:
        yield {}


def bfloat16_forward(linear):
    """linear's forward in inference mode under bfloat16 autocast on its kept bfloat16 copy (bfloat16_copy): what
    autocast computes (input, weight and bias rounded to bfloat16, a bfloat16 product), the same numbers, without
    rounding the weight again at every call (6 ms of a one-token prompt's 8.8 ms on the 6 x 384 model); elsewhere
    (autograd, torch.compile, no autocast) as before."""
    def forward(x):
        if (not torch.compiler.is_compiling() and torch.is_inference_mode_enabled() and x.device.type == "cpu"
                and torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16):
            return F.linear(x, bfloat16_copy(linear.weight), linear.bias)
        return F.linear(x, linear.weight, linear.bias)
    return forward


_bfloat16_copies = {}  # id(weight): (a weak reference to it, its address and version when copied, the copy)


def bfloat16_copy(weight):
    """weight in bfloat16, for decode.c's products and a bfloat16 prompt's: made once and kept while the weight lives
    unchanged (the same tensor at the same address and version: `.data =` and in-place changes of the weight both
    make it again; a change made in place through `.data`, as `w.data.mul_(2)`, moves no version and is not seen,
    as autograd does not see it: change weights under torch.no_grad() instead), as llama.cpp
    keeps its weights in the format it reads. Copying anew for each generate() cost 6.5 ms on the 6 x 384 model's
    42.6 MB, a twentieth of a 250-token generation on two threads. The copies hold half the weights' bytes again,
    freed with the weights (PACKED_COPY_LIMIT bounds them as it bounds every copy)."""
    key, now = id(weight), (weight.data_ptr(), weight._version)
    held = _bfloat16_copies.get(key)
    if held is not None and held[0]() is weight and held[1] == now:
        return held[2]
    with torch.no_grad():
        copy = weight.detach().bfloat16()
    if held is None or held[0]() is not weight:  # a new weight: its entry goes with it
        weakref.finalize(weight, _bfloat16_copies.pop, key, None)
    _bfloat16_copies[key] = (weakref.ref(weight), now, copy)
    return copy
