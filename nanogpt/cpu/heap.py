"""Training's large tensors reused in place: glibc's malloc keeps what a step frees for the next step.

glibc's malloc serves a block larger than its mmap threshold (which it moves between 128 KiB and 32 MiB) from a
fresh mapping and unmaps it when it is freed. A training step makes and frees the same large tensors every
iteration: the logits, batch x block x vocabulary floats, and their gradient, 309 MB each for 6 x 256 tokens over
GPT-2's 50,257. Each iteration the kernel maps them again and faults in and zeroes every 4 KiB page: at that
vocabulary a 2 x 64 model spent as much time in the kernel as in its own arithmetic. keep_freed_memory has blocks
of up to 2 GiB come from the heap and never trims it, so the next iteration finds them there. (A trim threshold of
1 GiB was not enough: a plan's model over that vocabulary frees more than that at once, and ran twice as slow.)

Measured on 2 cores of an AMD EPYC (Zen 4), train.py's median iteration (runs/heap_ab.py; docs/results.md, "The
kernel zeroed the logits every iteration"): a plan's 2 x 64 over GPT-2's vocabulary 2.69x faster, GPT-2's 124M
shape 1.22x, 4 x 192 over a BPE of 2,048 1.21x, and the character recipe within the machine's noise (its tensors
stay under 32 MiB). The price is memory: the heap holds what it freed, and reuses its pieces less tightly than
fresh mappings, so the process's peak grew by 5% (the BPE), 7% (124M) and 85% (the plan's 2 x 64: 2.1 to 3.9 GB).

Each CPU run sets it, before its plan's probe; the setting is the process's, and setting it again changes nothing.
A run that fits in the memory free only with glibc's own behaviour gives it up again (release_freed_memory, from
memory.settle_heap): slower, where the other way it would swap or be killed.
"""
import ctypes
import os

M_TRIM_THRESHOLD = -1  # mallopt's parameters (glibc's malloc.h)
M_MMAP_THRESHOLD = -3
MMAP_BYTES = (1 << 31) - 1  # blocks up to this (the largest int mallopt takes) come from the heap
NEVER_TRIM = -1  # as the trim threshold: freed memory stays in the heap, however much (mallopt(3))
# glibc's own thresholds once its dynamic mmap threshold has grown to its ceiling (32 MiB on 64-bit), where a
# training loop takes it: blocks larger than that mapped afresh, and the heap trimmed past twice as much free
GLIBC_MMAP_BYTES = 32 << 20
GLIBC_TRIM_BYTES = 64 << 20

_kept = False  # keep_freed_memory has set the process's malloc, and release_freed_memory has not undone it


def keep_freed_memory():
    """Have glibc's malloc serve blocks of up to MMAP_BYTES from its heap, and keep what is freed there. True where
    it did; False elsewhere (not glibc: macOS, Windows, musl), or where MALLOC_MMAP_THRESHOLD_ or
    MALLOC_TRIM_THRESHOLD_ in the environment say how the user wants it."""
    if any(name in os.environ for name in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")):
        return False
    try:
        if not os.confstr("CS_GNU_LIBC_VERSION"):
            return False
        mallopt = ctypes.CDLL(None).mallopt
    except (ValueError, OSError, AttributeError):  # no such confstr name (not glibc), no mallopt
        return False
    global _kept
    _kept = bool(mallopt(M_MMAP_THRESHOLD, MMAP_BYTES)) and bool(mallopt(M_TRIM_THRESHOLD, NEVER_TRIM))
    return _kept


def trim_freed_memory():
    """Hand the heap's free memory back to the kernel now, keeping the thresholds: before the memory free is read
    (a probe's or an earlier part's freed tensors would otherwise read as taken). True where there was a kept heap."""
    if _kept:
        ctypes.CDLL(None).malloc_trim(0)
    return _kept


def release_freed_memory():
    """Undo keep_freed_memory: the heap's free memory (what a probe left) handed back to the kernel now, and as
    glibc does by default from then on; a large block the heap has no room for is mapped afresh again. True where
    it had been kept."""
    global _kept
    if not _kept:
        return False
    libc = ctypes.CDLL(None)
    libc.mallopt(M_MMAP_THRESHOLD, GLIBC_MMAP_BYTES)
    libc.mallopt(M_TRIM_THRESHOLD, GLIBC_TRIM_BYTES)
    libc.malloc_trim(0)
    _kept = False
    return True
