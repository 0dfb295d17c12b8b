"""CPU speed code a reader of the model can skip, behind one entry for generation: decoding(model, rows).

Within it the model's linear layers run on copies of their weights packed for oneDNN (kernels.py), and
it yields the decode step: the cached step written flat (fused_step.py) where it applies, else the
model's own cached forward. Off the CPU, or where nothing can be packed, the step is the model's
forward and nothing is copied. Training's kernels (kernels.packed_training) are chosen by device.py.
"""
from contextlib import contextmanager

import torch.nn as nn

from nanogpt.cpu.fused_step import FusedStep
from nanogpt.cpu.kernels import packed_inference

# bytes of linear weights decoding copies; beyond this (gpt2-large holds 3.1 GB, gpt2-xl 6.2 GB) a second copy
# could exhaust a laptop's memory, and the model decodes on its own weights
PACKED_COPY_LIMIT = 2 << 30
PACK_MIN_ROWS = 16  # the row count packed weights are laid out for, at least: oneDNN's layout for fewer is slower


@contextmanager
def decoding(model, rows):
    """Within: model decodes `rows` rows per step on packed weights where it can; yields step(tokens, cache),
    the logits (B, 1, V) of tokens (B,) after what the cache holds, as model(tokens[:, None], kv_cache=cache)[0].

    The step is the fused one while it stays valid (no hook added, weights unchanged, eval mode), else the
    model's forward; the packed copies are freed at the end.
    """
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    if sum(m.weight.numel() * m.weight.element_size() for m in linears) > PACKED_COPY_LIMIT:
        linears = []
    with packed_inference(linears, max(rows, PACK_MIN_ROWS)) as packed:
        fused = FusedStep.build(model, packed)  # None: the model's own forward

        def step(tokens, cache):
            if fused is not None and fused.valid():
                return fused(tokens, cache)
            return model(tokens[:, None], kv_cache=cache)[0]
        yield step
