"""What int8 weights (--quantize=int8) and bfloat16 products (--dtype=bfloat16) cost a trained model, against float32:
val bpb over the whole val split, and greedy agreement (docs/generation.md).

    python runs/quantize_quality.py --out_dir out-shakespeare-char-cpu --dataset data/shakespeare_char
    python runs/quantize_quality.py --out_dir out-tangshi-cpu --dataset data/tangshi --json q.json

"int8" is the int8 layers' own forward (PyTorch's int8 product: inputs rounded to bfloat16); "int8, decode.c" the
same rows multiplied by decode.c's product (inputs rounded to 16-bit integers), as decoding runs them where it
measures that faster (docs/generation.md).

val bpb: every model scores the same consecutive windows of the val split (--context tokens, each token predicted
from the window before it), in bits per byte. Greedy agreement: from --prompts windows of val (their first
--prompt_tokens tokens), --new_tokens greedy tokens each; the share of tokens equal to float32's at the same place,
and the mean run of tokens before the first difference (one differing token changes the rest of the text).
"""
import argparse
import contextlib
import copy
import json
import os
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def main():
    import numpy as np
    import torch

    from minutes_bench import val_bpb  # beside this script: the one val bpb of the runs' benchmarks
    from nanogpt.cpu import native
    from nanogpt.cpu.kernels import bfloat16_products_supported
    from nanogpt.generate import generate
    from nanogpt.quantize import quantize
    from nanogpt.source import Source, load_model
    from nanogpt.tokenizer import read_meta

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out_dir", required=True)
    p.add_argument("--ckpt", default="ckpt.pt")
    p.add_argument("--dataset", required=True)
    p.add_argument("--context", type=int, default=0, help="val windows' length (default: the model's block_size)")
    p.add_argument("--prompts", type=int, default=20)
    p.add_argument("--prompt_tokens", type=int, default=16)
    p.add_argument("--new_tokens", type=int, default=200)
    p.add_argument("--json", default=None)
    a = p.parse_args()

    model, _ = load_model(Source(init_from=a.out_dir, ckpt=a.ckpt))
    meta = read_meta(a.dataset)
    val = np.fromfile(os.path.join(a.dataset, "val.bin"), dtype=np.dtype(meta.get("dtype", "uint16"))).astype(np.int64)
    context = a.context or model.config.block_size
    variants = {"float32": (model, contextlib.nullcontext)}
    if bfloat16_products_supported():
        variants["bfloat16"] = (model, lambda: torch.autocast("cpu", torch.bfloat16))
    variants["int8"] = (quantize(copy.deepcopy(model), "int8"), contextlib.nullcontext)
    if native.available():  # the int8 rows as decoding multiplies them on this CPU: every product decode.c's
        variants["int8, decode.c"] = (native_int8(quantize(copy.deepcopy(model), "int8")), contextlib.nullcontext)

    starts = np.linspace(0, len(val) - a.prompt_tokens - 1, a.prompts).astype(int)
    prompts = torch.from_numpy(np.stack([val[s:s + a.prompt_tokens] for s in starts]))

    def greedy(m, ctx):
        with torch.inference_mode(), ctx():
            return generate(m, prompts, a.new_tokens, temperature=0)[:, a.prompt_tokens:]

    results, reference = {}, greedy(*variants["float32"])
    for name, (m, ctx) in variants.items():
        tokens = greedy(m, ctx)
        same = (tokens == reference).float().mean().item()
        runs = [int((row != ref).nonzero()[0]) if (row != ref).any() else a.new_tokens
                for row, ref in zip(tokens, reference)]
        results[name] = {"val_bpb": val_bpb(m, a.dataset, context, ctx), "greedy_same": same, "greedy_run": statistics.mean(runs)}
        print(f"{name:14s} val bpb {results[name]['val_bpb']:.4f}  greedy tokens as float32's: {same:6.1%}, "
              f"first difference after {results[name]['greedy_run']:.0f} of {a.new_tokens} (mean of {a.prompts})",
              flush=True)
    base = results["float32"]["val_bpb"]
    for name, r in results.items():
        r["val_bpb_change"] = r["val_bpb"] / base - 1
    print("val bpb against float32: " + ", ".join(f"{n} {r['val_bpb_change']:+.2%}" for n, r in results.items()))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"out_dir": a.out_dir, "dataset": a.dataset, "context": context, **results}, f, indent=2)


def native_int8(model):
    """model (quantized) with each int8 layer's forward on decode.c's product (nanogpt/cpu/native.py), for every
    row: the numbers decoding computes where it runs decode.c's step, for the val bpb of the whole split."""
    from nanogpt.cpu import native
    from nanogpt.quantize import Int8Linear
    for m in model.modules():
        if isinstance(m, Int8Linear):
            weight = native.Weight(m.qweight, m.scale.float(), m.bias, m.in_features)
            m.forward = (lambda w, m: lambda x: w(x.reshape(-1, m.in_features)).view(*x.shape[:-1], m.out_features)
                         )(weight, m)
    return model


if __name__ == "__main__":
    main()
