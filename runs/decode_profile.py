"""Where one decode step's time goes on this CPU (docs/generation.md): the step as generation runs it, its linear
layers' products timed where they run, the same products back to back, the step with the products' outputs
given (everything else), and torch.profiler's table of its operations.

    python runs/decode_profile.py                       # the GPU recipe's shape, 6 x 384, block 256, 1 thread
    python runs/decode_profile.py --threads 2 --kernel packed --quantize int8

Weights are random (speed does not depend on them); the cache is filled as a 1-token prompt and 250 steps fill it.
"""
import argparse
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def main():
    import torch
    import torch.nn.functional as F

    import nanogpt.cpu
    from model import GPT, GPTConfig
    from nanogpt.cpu import fused_step
    from nanogpt.generate import KVCache
    from nanogpt.quantize import quantize

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n_layer", type=int, default=6)
    p.add_argument("--n_embd", type=int, default=384)
    p.add_argument("--n_head", type=int, default=6)
    p.add_argument("--block_size", type=int, default=256)
    p.add_argument("--vocab_size", type=int, default=65)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--kernel", choices=["measured", "packed", "plain", "native"], default="measured",
                   help="float32 products (--quantize int8: the int8 ones, measured, int8 or native)")
    p.add_argument("--quantize", choices=["", "int8"], default="")
    p.add_argument("--steps", type=int, default=250)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    kernel = None if a.kernel == "measured" else a.kernel
    if a.quantize:
        nanogpt.cpu.INT8_KERNEL = {"packed": "int8", "plain": "int8"}.get(kernel, kernel)
    else:
        nanogpt.cpu.FLOAT32_KERNEL = kernel
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=a.n_layer, n_head=a.n_head, n_embd=a.n_embd, block_size=a.block_size,
                          vocab_size=a.vocab_size, bias=False, dropout=0.0)).eval()
    quantize(model, a.quantize)
    token = torch.zeros(1, dtype=torch.long)
    kinds = []

    def steps(step, cache):
        """Microseconds per step, a median over 5 passes of a.steps steps each from position 1."""
        times = []
        for _ in range(6):
            cache.pos = 1
            t0 = time.perf_counter()
            for _ in range(a.steps):
                step(token, cache)
            times.append((time.perf_counter() - t0) / a.steps * 1e6)
        return statistics.median(times[1:])

    with torch.inference_mode(), nanogpt.cpu.decoding(model, 1) as step:
        cache = KVCache(model.config, 1, "cpu", torch.float32)
        model(token[:, None], kv_cache=cache)
        total = steps(step, cache)
        blocks = native_step_times(a, step, cache, steps)  # decode.c's whole step, where the fused step runs it
        with_timers = products = rest = None  # decode.c's model_step calls its products in C: none to time here
        if not blocks:
            call, add = fused_step.Product.__call__, fused_step.Product.add
            spent = [0.0]

            depth = [0]

            def timed(f):
                def g(self, *args):  # add() may call the product itself: only the outer call counts
                    kinds.append(self.kind)
                    depth[0] += 1
                    t0 = time.perf_counter()
                    y = f(self, *args)
                    depth[0] -= 1
                    if depth[0] == 0:
                        spent[0] += time.perf_counter() - t0
                    return y
                return g
            fused_step.Product.__call__, fused_step.Product.add = timed(call), timed(add)
            spent[0] = 0.0
            with_timers = steps(step, cache)
            products = spent[0] / (6 * a.steps) * 1e6
            outputs = {}

            def given(f, key):
                def g(self, *args):
                    if (id(self), key) not in outputs:
                        outputs[id(self), key] = f(self, *args)
                    return outputs[id(self), key]
                return g
            fused_step.Product.__call__, fused_step.Product.add = given(call, 0), given(add, 1)
            rest = steps(step, cache)
            fused_step.Product.__call__, fused_step.Product.add = call, add

        linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
        xs = [torch.randn(1, m.in_features) for m in linears]

        def products_alone():
            t0 = time.perf_counter()
            for m, x in zip(linears, xs):
                F.linear(x, m.weight)
            return time.perf_counter() - t0
        back_to_back = min(products_alone() for _ in range(20)) * 1e6
        from torch.profiler import profile
        cache.pos = 1
        with profile() as prof:
            for _ in range(100):
                step(token, cache)
    weights = sum(b.numel() * b.element_size() for m in model.modules()
                  for b in list(m.parameters(recurse=False)) + list(m.buffers(recurse=False))
                  if isinstance(m, (torch.nn.Linear,)) or type(m).__name__ == "Int8Linear")
    print(f"model {a.n_layer} x {a.n_embd}, {weights / 1e6:.1f} MB of linear weights, {a.threads} thread(s), "
          f"products: {sorted(set(kinds)) if not blocks else 'decode.c (native), inside its model_step'}")
    print(f"decode step                      {total:8.0f} us  ({1e6 / total:,.0f} tok/s)")
    if blocks:
        inside, alone = blocks
        print(f"  decode.c's model_step           {inside:8.0f} us  (Python around it: {total - inside:.0f} us)")
        print(f"  its products back to back       {alone:8.0f} us  ({weights / alone / 1e3:.1f} GB/s; each a call from "
              f"Python, whose own few microseconds count here, where model_step makes them in C)")
    else:
        print(f"  its products, timed in place   {products:8.0f} us  ({weights / products / 1e3:.1f} GB/s)   "
              f"(the step with timers: {with_timers:.0f} us)")
        print(f"  the step with products given   {rest:8.0f} us  (everything else: norms, attention, cache, Python)")
    if linears:
        print(f"  float32 products back to back  {back_to_back:8.0f} us  (plain matmul, nothing between them)")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))


def native_step_times(a, step, cache, steps):
    """(microseconds a step spends in decode.c's model_step call, its products alone back to back, the head's
    included), or None where the step does not run decode.c's."""
    import time

    import torch

    from nanogpt.cpu import native
    from nanogpt.cpu.fused_step import FusedStep
    fused = []
    real_call = FusedStep.__call__
    FusedStep.__call__ = lambda self, *args: fused.append(self) or real_call(self, *args)
    step(torch.zeros(1, dtype=torch.long), cache)
    FusedStep.__call__ = real_call
    cache.pos -= 1
    if not fused or fused[-1].layers is None:
        return None
    spent, real = [0.0], native.model_step

    def timed(*args):
        t0 = time.perf_counter()
        y = real(*args)
        spent[0] += time.perf_counter() - t0
        return y
    native.model_step = timed
    steps(step, cache)
    native.model_step = real
    inside = spent[0] / (6 * a.steps) * 1e6
    products = [p.weight for b in fused[-1].blocks for p in (b[1], b[2], b[4], b[5])] + [fused[-1].head.weight]
    xs = [torch.randn(1, w.width[0]) for w in products]

    def alone():
        t0 = time.perf_counter()
        for w, x in zip(products, xs):
            w(x)
        return time.perf_counter() - t0
    return inside, min(alone() for _ in range(20)) * 1e6


if __name__ == "__main__":
    main()
