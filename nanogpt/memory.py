"""What a model and a run need in memory, worked out before anything is allocated.

Untrusted sizes (a checkpoint's model_args, --num_samples, --max_new_tokens,
a config's n_layer) are checked here against the memory the device has, so a
mistake is a one-line error instead of a machine that swaps or dies.
"""
import os
from dataclasses import replace

import torch

from model import GPT
from nanogpt.cpu.heap import MMAP_BYTES, release_freed_memory, trim_freed_memory
from nanogpt.errors import UserError

# AdamW training in float32: weights, gradients and two moments, 4 bytes each
TRAIN_BYTES_PER_PARAM = 16
# The logits of a training step in float32 copies of batch x block x vocabulary: the head's output, the soft-cap's
# tanh, the log-softmax and their gradients. The most live at once measured 4.8 (train.py's peak memory against its
# batch over GPT-2's vocabulary, two runs); with glibc's heap keeping what each step frees (nanogpt/cpu/heap.py),
# which reuses its pieces less tightly, the process held 9.7 to 14.7 (which pieces it reuses is chance: 37 runs of
# tests/test_memory.py's steps; no more after 20 steps than after 3): the most counts (docs/results.md).
LOGITS_COPIES = 5
KEPT_LOGITS_COPIES = 15
# What a --teacher run's step holds besides: each teacher's logits, and at most this many copies more (their mean
# probability, the cross-entropy to it). Beyond the counts above, one teacher added 2.1 copies and two 3.0 to 3.4 at
# three batches; with the kept heap, 1.8 and 2.8. On a chat dataset, whose loss keeps the positions with a target,
# a copy more with one prompt token a sequence (the most kept): all 2 (tests/test_memory.py's steps, docs/results.md)
TAUGHT_LOGITS_COPIES = 2


def param_count(config):
    """Parameters of GPT(config), each shared tensor once: counted on GPT itself, built on the meta device (shapes
    only, no memory). Once the first and last value_embeds layers are there, each further layer adds one plain
    Block: two shallow models give the count at any depth, without building the blocks of an untrusted n_layer."""
    def count(n_layer):
        with torch.device("meta"):
            return sum(p.numel() for p in GPT(replace(config, n_layer=n_layer)).parameters())
    base = max(2 * config.value_embeds, 1)
    shallow = count(base)
    return shallow + (config.n_layer - base) * (count(base + 1) - shallow)


def training_bytes(config, batch_size, kept=False, teachers=(), on_cpu=True):
    """Memory of a float32 AdamW training step: 16 bytes per parameter, the activations kept for the backward
    pass, about (34 C + 5 nh T) x 4 bytes per token and layer (Korthikanti et al., 2022, in float32), and the
    logits (logits_bytes). kept: freed blocks stay in the process's heap (heap.keep_freed_memory). teachers: the
    GPTConfigs of the models a --teacher run learns from (teaching_bytes), on_cpu: whether they run where they were
    read."""
    activations = config.n_layer * batch_size * config.block_size * (34 * config.n_embd + 5 * config.n_head * config.block_size) * 4
    return (TRAIN_BYTES_PER_PARAM * param_count(config) + activations + logits_bytes(config, batch_size, kept)
            + teaching_bytes(teachers, config, batch_size, on_cpu))


def teaching_bytes(teachers, config, batch_size, on_cpu=True):
    """What teachers (GPTConfigs) add to a training step of config: the logits of distill.Teachers.loss, each
    teacher's and TAUGHT_LOGITS_COPIES more, in float32 copies as logits_bytes counts them; and off a CPU their
    float32 weights, which go to the device after the check. On a CPU they are not counted: read from their files
    before any check (distill.read_teachers), they are in memory already, and the models use them where they lie."""
    if not teachers:
        return 0
    weights = 0 if on_cpu else sum(4 * param_count(t) for t in teachers)
    return weights + (len(teachers) + TAUGHT_LOGITS_COPIES) * (logits_bytes(config, batch_size) // LOGITS_COPIES)


def logits_bytes(config, batch_size, kept=False):
    """The logits of a training step on micro-batches of batch_size and their gradients: LOGITS_COPIES float32
    copies, or KEPT_LOGITS_COPIES where the heap keeps freed blocks of their size (heap.MMAP_BYTES at most)."""
    one = batch_size * config.block_size * config.vocab_size * 4
    return (KEPT_LOGITS_COPIES if kept and one <= MMAP_BYTES else LOGITS_COPIES) * one


def kv_cache_bytes(config, batch, element_size=4):
    """The KV cache of `batch` sequences of block_size positions: keys and values of every layer."""
    return 2 * config.n_layer * batch * config.kv_heads * config.block_size * config.head_dim * element_size


def available_bytes(device):
    """Memory free for new tensors on device: the GPU's free memory, else the machine's available RAM."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo") as f:  # Linux: MemAvailable counts reclaimable cache too
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None  # unknown (e.g. Windows): nothing is refused


def settle_heap(device, kept_need):
    """(free, kept, given_up): the bytes free on device for training, and whether glibc's heap keeps what each step
    frees (nanogpt/cpu/heap.py), settled before training allocates anything. The heap first hands back what it holds
    free (a probe's tensors would read as taken); where kept_need, what training needs with the heap kept, does not
    fit, it stops keeping (given_up): slower, where the other way the run would swap."""
    kept = torch.device(device).type == "cpu" and trim_freed_memory()
    free = available_bytes(device)
    if not kept or free is None or kept_need <= free:
        return free, kept, False
    release_freed_memory()
    return available_bytes(device), False, True


def check_fits(needed, device, what, hint):
    """A UserError when `needed` bytes cannot fit in what the device has free."""
    free = available_bytes(device)
    if free is not None and needed > free:
        raise UserError(f"{what} needs about {fmt_bytes(needed)}, more than the {fmt_bytes(free)} free on "
                        f"{torch.device(device).type}; {hint}")


def fmt_bytes(n):
    for unit in ("B", "KB", "MB", "GB", "TB", "PB"):
        if n < 1000 or unit == "PB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
