"""The thread count on a shared CPU: the cores other processes leave idle (decoding, and a planned run's training).

A decode step is some 25 products of a few microseconds to a fraction of a millisecond, each split across
PyTorch's threads, which wait for each other at its end. When another process holds one of those cores,
every product waits for the thread that lost its core: measured on 2 cores with one busy process, 2 threads
decode 4.7x slower than with the machine to themselves, 1 thread about as fast (docs/generation.md). So
while decoding, the threads are the cores not busy with other processes' work (at least 1, at most what
PyTorch was given: OMP_NUM_THREADS or torch.set_num_threads), read from Linux's /proc/stat over the last
interval and looked at again every CHECK_SECONDS. Elsewhere (no /proc/stat) PyTorch's count stays. Training
loses the same way (a probe of 2 x 64 took 2.1 s an iteration on 2 threads beside a busy process, 27 ms on 1), so
a run bound by a clock (--minutes, one process) fits its threads too: once before its probe, then every
CHECK_SECONDS as it trains. Other runs keep theirs, whose sums are reproducible.
"""
import os
import time

import torch

CHECK_SECONDS = 0.5  # how often a running decode (or planned training) looks at the load again
MIN_INTERVAL = 0.02  # a look this soon after the last one keeps the count: too short a time to tell the load


def cpu_seconds(path="/proc/stat", cpus=None):
    """Seconds the CPUs this process may run on (cpus: their numbers; None: sched_getaffinity's) spent busy since
    boot, as /proc/stat's cpuN lines count them (idle and iowait left out): in a container that sees the host's
    CPUs, the others' load does not count. None where there is no /proc/stat."""
    if cpus is None:
        cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    busy = 0
    try:
        with open(path) as f:
            for line in f:
                name, *values = line.split()
                if not (name.startswith("cpu") and name[3:].isdigit()):
                    continue
                if cpus is not None and int(name[3:]) not in cpus:
                    continue
                fields = [int(v) for v in values[:8]]
                busy += sum(fields) - fields[3] - fields[4]
    except (OSError, ValueError, IndexError):
        return None
    return busy / os.sysconf("SC_CLK_TCK")


def reading():
    """(machine busy seconds, this process's CPU seconds, the clock), or None without /proc/stat."""
    machine = cpu_seconds()
    return None if machine is None else (machine, time.process_time(), time.monotonic())


_last = reading()  # the process's last look: the first decode compares with the load since this module's import


def others_busy(then, now):
    """Cores busy with other processes' work between two readings (this process's own threads left out)."""
    (busy0, ours0, t0), (busy1, ours1, t1) = then, now
    return max(0.0, (busy1 - busy0) - (ours1 - ours0)) / (t1 - t0)


class Threads:
    """Within a decode or a planned run: set() sets PyTorch's thread count to the cores other processes left idle
    since the last look; restore() gives back the count it found."""

    def __init__(self):
        self.given = torch.get_num_threads()
        self.cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        self.checked = time.monotonic()
        self.set()

    def set(self):
        """Look at the load and set the thread count for it (where /proc/stat tells it)."""
        global _last
        now = reading()
        self.checked = time.monotonic()
        if now is None or _last is None or self.given == 1 or now[2] - _last[2] < MIN_INTERVAL:
            return
        idle = self.cores - others_busy(_last, now)
        _last = now
        threads = max(1, min(self.given, int(idle + 0.5)))
        if threads != torch.get_num_threads():
            torch.set_num_threads(threads)

    def check(self):
        """set() once CHECK_SECONDS have passed since the last look: called every step or iteration, costs a clock
        read."""
        if time.monotonic() - self.checked >= CHECK_SECONDS:
            self.set()

    def restore(self):
        if torch.get_num_threads() != self.given:
            torch.set_num_threads(self.given)
