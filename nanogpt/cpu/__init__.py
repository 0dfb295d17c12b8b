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
from contextlib import contextmanager

import torch
import torch.nn as nn
import torch.nn.functional as F

from nanogpt.cpu.fused_step import FusedStep
from nanogpt.cpu.kernels import bfloat16_products_supported, pack, packable, packed_inference, packed_product
from nanogpt.cpu.threads import Threads

# bytes of linear weights decoding copies; beyond this (gpt2-large holds 3.1 GB, gpt2-xl 6.2 GB) a second copy
# could exhaust a laptop's memory, and the model decodes on its own weights
PACKED_COPY_LIMIT = 2 << 30
PACK_MIN_ROWS = 16  # the row count packed weights are laid out for, at least: oneDNN's layout for fewer is slower
PROBE_BYTES = 64 << 20  # float32 weights float32_kernel times, at most (the first layers'): a few ms a pass
PACKED_MARGIN = 0.05  # packed copies are kept only where they are this much faster: the plain ones cost no memory
_kernels = {}  # (weight shapes, threads) -> "packed" or "plain", as float32_kernel measured it
FLOAT32_KERNEL = None  # "packed" or "plain" sets the choice instead of measuring it (the tests, bench.py)


def float32_kernel(linears):
    """"packed" or "plain": the float32 matmul that multiplies one row by these layers' weights faster here,
    timed over the layers in turn (as a decode step reads them), medians of 5 passes each, alternated;
    measured once per process for each set of shapes and thread count (FLOAT32_KERNEL, where set, instead)."""
    if FLOAT32_KERNEL is not None:
        return FLOAT32_KERNEL
    weights, nbytes = [], 0
    for m in linears:
        if nbytes >= PROBE_BYTES:
            break
        weights.append(m.weight.detach())
        nbytes += m.weight.numel() * 4
    key = (tuple(w.shape for w in weights), torch.get_num_threads())
    if key not in _kernels:
        with torch.inference_mode():
            xs = [torch.randn(1, w.size(1)) for w in weights]
            packed = [pack(w, PACK_MIN_ROWS) for w in weights]
            runs = {"packed": lambda: [packed_product(x, p) for x, p in zip(xs, packed)],
                    "plain": lambda: [F.linear(x, w) for x, w in zip(xs, weights)]}
            seconds = {name: [] for name in runs}
            for _ in range(6):  # the first of each is a warm-up
                for name, run in runs.items():
                    t0 = time.perf_counter()
                    run()
                    seconds[name].append(time.perf_counter() - t0)
        packed_s, plain_s = (statistics.median(seconds[name][1:]) for name in ("packed", "plain"))
        _kernels[key] = "packed" if packed_s < plain_s * (1 - PACKED_MARGIN) else "plain"
    return _kernels[key]


def product_dtype():
    """The dtype generation's linear layers multiply in on CPU: bfloat16 under bfloat16 autocast (--dtype=bfloat16)
    where the CPU multiplies it natively, else float32."""
    if (torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
            and bfloat16_products_supported()):
        return torch.bfloat16
    return torch.float32


@contextmanager
def decoding(model, rows):
    """Within: model decodes `rows` rows per step on packed weights where it can; yields step(tokens, cache),
    the logits (B, 1, V) of tokens (B,) after what the cache holds, as model(tokens[:, None], kv_cache=cache)[0].

    The products run in product_dtype() as it is on entry (enter autocast first), on as many threads as cores
    other processes leave idle (threads.py). The step is the fused one
    while it stays valid (no hook added, weights unchanged, eval mode, the same autocast), else the model's
    forward; the packed copies are freed at the end. Layers quantized to int8 (quantize.py) need no copy.
    """
    dtype = product_dtype()
    linears = [m for m in model.modules() if isinstance(m, nn.Linear) and packable(m.weight, dtype)]
    too_big = sum(m.weight.numel() * m.weight.element_size() for m in linears) > PACKED_COPY_LIMIT
    plain = dtype == torch.float32 and bool(linears) and (too_big or float32_kernel(linears) == "plain")
    if too_big:
        linears = []
    threads = Threads()  # the cores other processes leave idle, looked at again as the decode goes on
    try:
        with packed_inference([] if plain else linears, max(rows, PACK_MIN_ROWS), dtype) as packed:
            fused = FusedStep.build(model, packed, dtype, plain)  # None: the model's own forward

            def step(tokens, cache):
                threads.check()
                if fused is not None and fused.valid():
                    return fused(tokens, cache)
                return model(tokens[:, None], kv_cache=cache)[0]
            yield step
    finally:
        threads.restore()
