"""The one-row int8 products a decode step could run, timed on this CPU (docs/generation.md, "int8 weights"): the
25 products of one step of the GPU recipe's shape (6 x 384, output layer of 65), back to back, medians of 200.

    python runs/int8_kernels.py --threads 1

- float32: torch's own product on the float weights (the reference);
- PyTorch's int8: torch.ops.aten._weight_int8pack_mm, what nanogpt/quantize.py's layers run;
- torchao's int8: torchao's Int8WeightOnlyConfig on the same layers, where torchao is installed (it is not a
  requirement: pip install torchao);
- decode.c's int8: native.py's product on the same int8 rows.
Each kind's outputs are held to float32's (the largest difference over the largest output), so a kernel that
computes something else cannot look fast.
"""
import argparse
import copy
import os
import statistics
import sys
import time

import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def shapes(n_embd=384, n_layer=6, vocab=65):
    """(out, in) of each product of one decode step, in the order the step runs them."""
    block = [(3 * n_embd, n_embd), (n_embd, n_embd), (4 * n_embd, n_embd), (n_embd, 4 * n_embd)]
    return block * n_layer + [(vocab, n_embd)]


def timed(products, x_of, passes):
    """Median microseconds of one pass over products (callables of their input), and the last outputs."""
    times, outs = [], None
    for _ in range(passes):
        t0 = time.perf_counter()
        outs = [f(x_of(i)) for i, f in enumerate(products)]
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6, outs


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--passes", type=int, default=200)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    from nanogpt.cpu import native
    from nanogpt.quantize import Int8Linear
    layers = [nn.Linear(k, n, bias=False).eval() for n, k in shapes()]
    xs = [torch.randn(1, layer.in_features) for layer in layers]
    x_of = xs.__getitem__
    ours = [Int8Linear(layer) for layer in layers]
    weights = sum(layer.weight.numel() for layer in layers)
    kinds = {}
    with torch.inference_mode():
        kinds["float32 (torch)"] = [layer for layer in layers]
        kinds["int8, PyTorch's _weight_int8pack_mm"] = ours
        try:
            from torchao.quantization import Int8WeightOnlyConfig, quantize_
            theirs = [copy.deepcopy(layer) for layer in layers]
            for layer in theirs:
                quantize_(layer, Int8WeightOnlyConfig())
            kinds["int8, torchao " + __import__("torchao").__version__] = theirs
        except ImportError:
            print("torchao: not installed, not timed (pip install torchao)")
        if native.available():
            # the same rows (padding included: the product reads the layer's own width)
            kinds["int8, decode.c"] = [native.Weight(m.qweight, m.scale.float(), width=m.in_features) for m in ours]
        else:
            print(f"decode.c: not available here ({native.why()})")
        reference = None
        print(f"{len(layers)} one-row products, {weights / 1e6:.1f}M weights, {a.threads} thread(s), "
              f"medians of {a.passes}")
        for name, products in kinds.items():
            timed(products, x_of, 5)
            us, outs = timed(products, x_of, a.passes)
            if reference is None:
                reference = outs
            err = max(float((o.float() - r).abs().max() / r.abs().max()) for o, r in zip(outs, reference))
            print(f"{name:40s} {us:8.0f} us  ({weights * (4 if name.startswith('float32') else 1) / us / 1e3:5.1f} "
                  f"GB/s of its weights)  largest difference from float32: {err:.1e}")


if __name__ == "__main__":
    main()
