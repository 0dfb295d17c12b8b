"""FSDP2: the model's parameters, gradients and optimizer state sharded over the processes.

    torchrun --standalone --nproc_per_node=8 train.py config/train_gpt2.py --parallel=fsdp

With DDP every process holds the whole model, its gradients and its optimizer
state (AdamW in float32: 16 bytes per parameter). Under fully_shard each
process holds 1/world of each: a Block's whole weights exist only while it
runs (all-gathered before, freed after), and its gradients are
reduce-scattered to the processes that own them. Each Block is one unit and
the root (embeddings, final norm, head) another. With --dtype=bfloat16 (the
default on CUDA) the units compute in bfloat16 and reduce gradients in
float32, in place of autocast.

consolidate.py turns the sharded checkpoints such a run writes into one file.
"""
import functools

import torch
from torch.utils.checkpoint import checkpoint

from nanogpt.training.distributed import all_ranks


def shard(model, device, dtype, compile_blocks=False):
    """fully_shard each Block, then the whole model (in place: parameters become DTensor shards)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    mixed = dtype != torch.float32
    policy = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32) if mixed else MixedPrecisionPolicy()
    for block in model.transformer.h:
        if compile_blocks:
            block.compile()  # per Block, before sharding: the all-gathers stay outside the compiled graph
        fully_shard(block, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    return model


def checkpoint_activations(model):
    """Keep only each Block's input for backward and recompute the rest: activations then take one
    (B, T, C) tensor per Block instead of about 16, for one more forward pass of compute."""
    for block in model.transformer.h:
        # an instance attribute: shadows Block.forward; FSDP's hooks wrap the call around it
        block.forward = functools.partial(checkpoint, block.forward, use_reentrant=False)


def local(t):
    """This process's part of a tensor: a DTensor's shard, or the tensor itself."""
    return t.to_local() if hasattr(t, "to_local") else t


def first_non_finite(model, world):
    """The name of a weight that is not finite on some process ("on another process" where this one's
    shards are all finite), or None when every weight is finite everywhere."""
    bad = next((name for name, p in model.named_parameters() if not torch.isfinite(local(p)).all()), None)
    if not all_ranks(bad is None, world) and bad is None:
        return "on another process"
    return bad


def held_bytes(model, optimizer):
    """Bytes of parameters, gradients and optimizer state this process holds (its shards under FSDP)."""
    def nbytes(t):
        t = local(t)
        return t.numel() * t.element_size()
    params = list(model.parameters())
    return {"params": sum(nbytes(p) for p in params),
            "grads": sum(nbytes(p.grad) for p in params if p.grad is not None),
            "optimizer": sum(nbytes(v) for state in optimizer.state.values() for v in state.values()
                             if isinstance(v, torch.Tensor))}


def load_optimizer_state(model, optimizer, state):
    """Load a single-file checkpoint's optimizer state (nanoGPT's: keyed by parameter index) into the
    optimizer of a sharded model: keyed by name, each process keeps its shards of it."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict
    names = {id(p): name for name, p in model.named_parameters()}
    parts = optimizer.optimizers.items() if hasattr(optimizer, "optimizers") else [(None, optimizer)]
    full = {"state": {}, "param_groups": []}
    for key, opt in parts:
        saved = state[key] if key is not None else state
        order = [names[id(p)] for group in opt.param_groups for p in group["params"]]
        full["state"].update({order[i]: s for i, s in saved["state"].items()})
        full["param_groups"] += [{**g, "params": [order[i] for i in g["params"]]} for g in saved["param_groups"]]
    set_optimizer_state_dict(model, [opt for _, opt in parts], full, options=StateDictOptions(full_state_dict=True))

