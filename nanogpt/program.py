"""How a program starts and ends: Ctrl-C during the slow imports exits quietly, and a mistake the user can
fix (a UserError), or an OSError from the machine (disk full, no permission), becomes one line on stderr
and exit code 2, never a traceback. Every program at the repository's top ends with
`if __name__ == "__main__": run_main(main)`."""
import errno
import os
import signal
import sys
import threading

from nanogpt import REPOSITORY
from nanogpt.errors import UserError


def exit_quietly_on_ctrl_c():
    """Until run_main starts, Ctrl-C ends the program with one line and exit code 130 instead of a
    KeyboardInterrupt traceback from whatever was importing (torch takes seconds). Scripts call it before
    their slow imports; it acts only where the program run is a script of this repository, so a test or
    a program that imports the scripts keeps Python's KeyboardInterrupt."""
    script = getattr(sys.modules.get("__main__"), "__file__", None)
    if (script and os.path.realpath(script).startswith(os.path.realpath(REPOSITORY) + os.sep)
            and threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGINT) is signal.default_int_handler):
        signal.signal(signal.SIGINT, interrupted_while_starting)


def interrupted_while_starting(signum, frame):
    os.write(2, b"interrupted\n")
    os._exit(130)  # at once: nothing is written yet, and a half-done import has nothing to clean up


def run_main(main, argv=None):
    """Run a script's main(argv): a UserError, or an OSError from the machine (disk full, no permission),
    becomes one line on stderr and exit code 2; a second Ctrl-C one line and exit code 130."""
    if signal.getsignal(signal.SIGINT) is interrupted_while_starting:  # from here on, KeyboardInterrupt
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        main(sys.argv[1:] if argv is None else argv)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except OSError as e:
        print(f"error: {describe_os_error(e)}", file=sys.stderr)
        sys.exit(2)
    except RuntimeError as e:
        if not device_failure(e):
            raise
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        print(f"error: the device failed ({first}); checkpoints already written are intact: check the device "
              f"(nvidia-smi), then resume with --init_from=resume, or use --device=cpu", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt as e:
        print(f"interrupted: {e}" if str(e) else "interrupted", file=sys.stderr)
        sys.exit(130)


DEVICE_FAILURES = ("CUDA error", "CUDA driver", "no CUDA GPUs are available", "MPS backend", "device-side assert",
                   "CUBLAS_STATUS", "CUDNN_STATUS", "NCCL error")


def device_failure(e):
    """Whether a RuntimeError is the device failing (lost, reset, out of memory), not a bug in the program: torch
    raises those as RuntimeError subclasses (AcceleratorError, OutOfMemoryError) or with these words."""
    return (type(e).__name__ in ("AcceleratorError", "OutOfMemoryError")
            or any(words in str(e) for words in DEVICE_FAILURES))


OS_ERROR_HINTS = {
    errno.ENOSPC: "free some disk space, or write elsewhere",
    errno.EDQUOT: "free some disk space, or write elsewhere",
    errno.EACCES: "check the permissions, or write elsewhere",
    errno.EPERM: "check the permissions, or write elsewhere",
    errno.EROFS: "the file system is read-only: write elsewhere",
    errno.ENOTDIR: "a file stands where a directory is expected: choose another path",
    errno.EEXIST: "a file stands where a directory is expected: choose another path",
    errno.EISDIR: "a directory stands where a file is expected: choose another path",
}


def describe_os_error(e):
    """"cannot access out/ckpt.pt: Permission denied; check the permissions, or write elsewhere"; without a file
    name, "No space left on device; free some disk space, or write elsewhere"."""
    what = f"cannot access {e.filename}: {e.strerror or e}" if e.filename else f"{e.strerror or e}"
    hint = OS_ERROR_HINTS.get(e.errno, "")
    return what + (f"; {hint}" if hint else "")
