"""The one exception a user can fix: scripts print it as one line and exit with code 2 (program.run_main);
and the hint a mistyped name carries, written once for every message that names one."""
import difflib


class UserError(Exception):
    """A mistake the user can fix: scripts print it as one line and exit with code 2."""


def nearest(name, choices, cutoff=0.6):
    """" (did you mean 'x'?)" for the choice closest to name, or "" when none is close (difflib's cutoff; 0.0
    always names one): a message appends it, or its own fallback with `nearest(...) or "; the keys are ..."`."""
    close = closest(name, choices, cutoff)
    return f" (did you mean {close!r}?)" if close is not None else ""


def closest(name, choices, cutoff=0.6):
    """The choice closest to name, or None when none is (for a message that words its own suggestion)."""
    close = difflib.get_close_matches(name, choices, n=1, cutoff=cutoff)
    return close[0] if close else None
