"""Stopping a run on SIGINT/SIGTERM: the first signal within moments, the second at once."""
import signal
from contextlib import contextmanager

from nanogpt.training.distributed import any_rank


class Interrupted(Exception):
    """Raised by the first SIGINT/SIGTERM in work that can be abandoned."""


class StopFlag:
    """SIGINT/SIGTERM: the first stops the run within moments, the second at once.

    The first abandons what is in flight (start-up, a compile, an evaluation,
    the forward and backward of an iteration, whose weights are untouched until
    the optimizer step) by raising Interrupted; inside a `finishing()` section
    (the optimizer step, a save) it waits for the section's end. Under DDP
    (abandon=False) ranks must stop together, so it only sets the flag and the
    ranks agree at a log iteration (agreed). A second signal raises
    KeyboardInterrupt wherever the run is: nothing more is saved.
    """

    def __init__(self):
        self.set, self.abandon, self.finishing_depth = False, True, 0
        self.previous = {s: signal.signal(s, self.handle) for s in (signal.SIGINT, signal.SIGTERM)}

    def handle(self, signum, frame):
        if self.set:
            raise KeyboardInterrupt(f"stopped at once by a second {signal.Signals(signum).name}; nothing more saved")
        self.set = True
        if self.abandon and not self.finishing_depth:
            raise Interrupted()

    @contextmanager
    def finishing(self):
        """A section a first signal lets finish."""
        self.finishing_depth += 1
        try:
            yield
        finally:
            self.finishing_depth -= 1

    def agreed(self, world, iter_num, log_interval):
        """True when a signal asked to stop; under DDP every rank must agree at the same iteration."""
        if world == 1:
            return self.set
        if iter_num % log_interval:  # an all-reduce costs a sync: agree only on log iterations
            return False
        return self.agree(world)

    def final(self, world):
        """After the loop: whether a signal stopped the run, agreed by every rank once more (a signal that landed
        after the last agreement, in a run that then ended at max_iters, was one rank's alone: it saved, and the
        others never joined its save's collectives)."""
        return self.set if world == 1 else self.agree(world)

    def agree(self, world):
        """Every rank's flag, all-reduced: what each rank acts on. It never clears the flag: a signal that lands
        while the all-reduce is in flight runs its handler before the result is stored, and storing a False over it
        lost the signal (the run trained on until torchrun killed it); such a flag is agreed on the next time."""
        agreed = any_rank(self.set, world)
        if agreed:  # a rank that saw no signal stops with the rest
            self.set = True
        return agreed

    def restore(self):
        for s, handler in self.previous.items():
            signal.signal(s, handler)
