"""Processes under torchrun: joining them, and what they agree on, share and split.

    torchrun --standalone --nproc_per_node=2 train.py config/shakespeare_char_cpu.py

Every function takes world (the number of processes) and does nothing collective where it is 1, so a
plain `python train.py` never initialises torch.distributed. Where world > 1 every process calls each
function together, in the same order: each is one collective operation.
"""
import os
from contextlib import contextmanager, nullcontext

import torch
import torch.distributed as dist

from nanogpt.checkpoint import rng_state
from nanogpt.errors import UserError


def setup_distributed(device, backend="auto"):
    """(rank, local_rank, world_size) from torchrun's environment; (0, 0, 1) when run plainly. Each process on
    a GPU takes its local rank's; backend "auto" is NCCL there, gloo on CPUs."""
    if "RANK" not in os.environ:
        return 0, 0, 1
    rank, local_rank, world = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"]), int(os.environ["WORLD_SIZE"])
    use_cuda = device in ("auto", "cuda") and torch.cuda.is_available() or device.startswith("cuda")
    backend = backend if backend != "auto" else ("nccl" if use_cuda else "gloo")
    if use_cuda:
        torch.cuda.set_device(local_rank)
    dist.init_process_group(backend=backend)
    return rank, local_rank, world


def launcher(world):
    """How to start a program again as it runs now: python for one process, torchrun for several on this machine
    (a run over several machines restarts as it was started there)."""
    return "python" if world == 1 else f"torchrun --standalone --nproc_per_node={world}"


def teardown(world):
    if world > 1:
        dist.destroy_process_group()


def barrier(world):
    if world > 1:
        dist.barrier()


def collective_device():
    """Where a tensor must live to be reduced: NCCL reduces only CUDA tensors, gloo CPU ones."""
    return "cuda" if dist.get_backend() == "nccl" else "cpu"


def all_ranks(flag, world):
    """True where flag is true on every process."""
    if world == 1:
        return flag
    failed = torch.tensor([int(not flag)], device=collective_device())
    dist.all_reduce(failed)
    return failed.item() == 0


def any_rank(flag, world):
    """True where flag is true on some process."""
    return not all_ranks(not flag, world)


def mean_over_ranks(tensor, world):
    """tensor averaged over the processes, in place (a scalar loss: the whole global batch's)."""
    if world > 1:
        dist.all_reduce(tensor)
        tensor /= world
    return tensor


def sum_over_ranks(tensor, world):
    """tensor summed over the processes, in place (on collective_device() where world > 1)."""
    if world > 1:
        dist.all_reduce(tensor)
    return tensor


def record_mean_over_ranks(record, world):
    """A log record's numbers averaged over the processes (every rank holds the same keys)."""
    if world == 1:
        return record
    keys = sorted(record)
    values = torch.tensor([float(record[k]) for k in keys], dtype=torch.float64, device=collective_device())
    return dict(zip(keys, mean_over_ranks(values, world).tolist()))


def from_rank0(value, world):
    """Rank 0's value of a picklable object, on every process."""
    if world == 1:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def gather_rng(world):
    """Every rank's RNG state (rank 0 saves them all), so each resumes its own dropout stream."""
    state = rng_state()
    if world == 1:
        return [state]
    states = [None] * world
    dist.all_gather_object(states, state)
    return states


def micro_batches(gradient_accumulation_steps, world, source=""):
    """Micro-batches each process runs per iter: gradient_accumulation_steps counts them over all processes,
    so it must split evenly; source says where the value came from (a checkpoint's config)."""
    if gradient_accumulation_steps % world:
        up = -(-gradient_accumulation_steps // world) * world
        raise UserError(f"gradient_accumulation_steps ({gradient_accumulation_steps}{source}) must be divisible by "
                        f"the number of processes ({world}): it counts micro-batches over all of them; run a number "
                        f"of processes that divides it, or pass --gradient_accumulation_steps=N with N a multiple "
                        f"of {world} (e.g. {up}, a global batch of N x batch_size)")
    return gradient_accumulation_steps // world


def local_gradients(model, sync, sharded):
    """Where gradients stay on this process (sync=False: every micro-step but the last of an iteration):
    DDP's no_sync, or for an FSDP-sharded model its gradient reduction turned off until the next sync."""
    if sync:
        return nullcontext()
    return no_gradient_sync(model) if sharded else model.no_sync()


@contextmanager
def no_gradient_sync(model):
    """Accumulate an FSDP model's gradients locally (unsharded) until a micro-batch outside this context
    reduces them."""
    model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)
