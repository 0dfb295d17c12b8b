"""A Python that imports torch once and forks a fresh child to run each script conftest.run_script asks for.

Starting Python and importing torch takes 1.5 to 2 seconds of a core, and torch._dynamo, which any optimizer imports,
1.3 more; the suite runs about 400 scripts, and on 2 cores a third of its time went to those imports. A child forked
from here is a new process in what the tests read of it: its own pid, argv, working directory, environment, stdout,
stderr and exit code, its own random seeds (Python's, numpy's and torch's), `__file__` absolute, and for an exception
a traceback from the script's own frames and exit 1, as `python script.py` gives. It differs where a fork cannot
help it:
- torch, torch._dynamo and numpy, and the 2,000 modules they import (sympy, torch.distributed.fsdp, inductor), are
  in sys.modules already: a script that uses one of them unimported would pass here and fail for real;
- its string hash seed is the server's, the same for every child (a fresh Python draws one): a test comparing two runs
  whose output could depend on a set's order must set PYTHONHASHSEED, which gives it new interpreters;
- stdin is /dev/null (subprocess.run's child inherits pytest's);
- the server's objects are frozen out of the collector (gc.freeze, below): an object a script hangs only on one of
  them (a class attribute of a preloaded class, a cache in torch) is never finalized at its exit, where a fresh Python's
  last collection would run its __del__ (and print what that raises). atexit and weakref.finalize run as usual.
So run_script sends here only the runs where the rest cannot matter: a script path, or -m and a module (not -c), and
no variable that Python, torch or the C libraries beneath them read when they start (conftest.STARTUP_VARIABLES) set
otherwise than in this process.

Protocol, over the packet socket on the file descriptor given as argv[1] (each message one packet): the test's side
sends a request (a JSON object: argv, cwd, env) with its stdin, stdout and stderr as three file descriptors; this side
answers with the child's pid, then, once it has exited, its exit code. An empty read means the test's side has closed.
The test's side may kill the child (its pid cannot be reused before this side has reaped it and answered).
"""
import gc
import json
import os
import socket
import sys

import numpy
import torch  # noqa: F401  (the imports every child is spared)
import torch._dynamo  # noqa: F401  (any optimizer's first param group imports it: 1.3 s more of every training run)


def serve(sock):
    """Fork a child for each request; return (request, fds) in the child, None when the other side has closed."""
    while True:
        message, fds, _, _ = socket.recv_fds(sock, 1 << 20, 3)
        if not message:
            return None
        request = json.loads(message)
        pid = os.fork()
        if pid == 0:
            sock.close()
            return request, fds
        for fd in fds:
            os.close(fd)
        sock.send(json.dumps({"pid": pid}).encode())
        _, status = os.waitpid(pid, 0)
        sock.send(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}).encode())


def become(request, fds):
    """Turn this forked child into `python argv[0] argv[1:]` started in cwd with env."""
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    numpy.random.seed()  # a fresh interpreter seeds numpy's and torch's global generators from the OS (Python's
    torch.seed()  # random reseeds itself in a forked child)
    if request["argv"][0] == "-m":  # python -m module: the module's file as argv[0] (run_module sets it), cwd first
        sys.argv = request["argv"][1:]
        sys.path[0] = os.getcwd()
    else:
        sys.argv = request["argv"]
        sys.path[0] = os.path.dirname(os.path.abspath(sys.argv[0]))


def run_script(path):
    """Run the file at path as Python runs a script: a new __main__ module whose __file__ is absolute, and a traceback
    that starts at the script's own frames."""
    import types
    path = os.path.abspath(path)
    with open(path, "rb") as f:
        code = compile(f.read(), path, "exec")
    main = types.ModuleType("__main__")
    main.__file__, main.__builtins__ = path, __builtins__
    sys.modules["__main__"] = main
    sys.excepthook = script_frames_only
    exec(code, main.__dict__)


def script_frames_only(kind, value, tb, here=os.path.abspath(__file__)):
    """Print an uncaught exception as Python would for the script: without this file's frames above it."""
    while tb is not None and tb.tb_frame.f_code.co_filename == here:
        tb = tb.tb_next
    sys.__excepthook__(kind, value.with_traceback(tb), tb)  # the default prints the exception's own


if __name__ == "__main__":
    # every object the collector tracks now (torch's, numpy's, this file's) goes to its permanent generation: a child
    # that walked them (in a collection, or as its Python exits) would write to every page it shares with this process,
    # and copy it. A child's own objects are collected as before, unless only a frozen one holds them (the docstring).
    # A child running train.py to its first argument's error took 1.2 s, 1.0 of them exiting; frozen, 0.5 s in all
    gc.collect()
    gc.freeze()
    served = serve(socket.socket(fileno=int(sys.argv[1])))
    if served is None:
        sys.exit(0)
    become(*served)
    if served[0]["argv"][0] == "-m":  # its exit, exception or traceback is this process's
        import runpy
        runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
    elif not os.path.isfile(sys.argv[0]):  # as Python says it
        print(f"{sys.executable}: can't open file {os.path.abspath(sys.argv[0])!r}: [Errno 2] No such file or "
              f"directory", file=sys.stderr)
        sys.exit(2)
    else:
        run_script(sys.argv[0])
