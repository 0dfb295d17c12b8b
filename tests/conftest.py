import os
import signal
import subprocess
import sys
import tempfile

import pytest

# pytest-xdist runs one worker per core (pytest.ini): each worker's torch, and every program it starts, then
# computes on one thread, as torchrun's workers do; two threads each on shared cores wait for each other
if "PYTEST_XDIST_WORKER" in os.environ:
    os.environ.setdefault("OMP_NUM_THREADS", "1")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def on_glibc():
    """True under glibc's malloc (Linux), whose mallopt nanogpt/cpu/heap.py sets."""
    try:
        return sys.platform == "linux" and bool(os.confstr("CS_GNU_LIBC_VERSION"))
    except (ValueError, OSError):  # no such name (musl, macOS)
        return False


# a suite started in the background by a shell without job control inherits SIGINT ignored, and so would every
# program it starts: the Ctrl-C tests need the signal delivered, as it is in a terminal
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
sys.path.insert(0, ROOT)
SHARED = os.path.join(os.path.dirname(ROOT), "shared")
SHAKESPEARE = os.path.join(SHARED, "data", "tinyshakespeare", "input.txt")
TIKTOKEN_CACHE = os.path.join(SHARED, "tiktoken_cache")
if "TIKTOKEN_CACHE_DIR" not in os.environ and os.path.isdir(TIKTOKEN_CACHE):
    os.environ["TIKTOKEN_CACHE_DIR"] = TIKTOKEN_CACHE
# hypothesis keeps a .hypothesis directory: tests write only to temporary directories
os.environ.setdefault("HYPOTHESIS_STORAGE_DIRECTORY", os.path.join(tempfile.gettempdir(), "nanogpt-tests-hypothesis"))
# and decoding's compiled products (nanogpt/cpu/native.py), in process and in every program a test starts
os.environ.setdefault("NANOGPT_CACHE", os.path.join(tempfile.gettempdir(), f"nanogpt-tests-cache-{os.getuid()}"))

from model import GPTConfig  # noqa: E402

CORPUS = ("First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n\n"
          "First Citizen:\nYou are all resolved rather to die than to famish?\n\nAll:\nResolved. resolved.\n\n") * 40


@pytest.fixture(autouse=True)
def packed_float32_kernel(monkeypatch):
    """Decoding's kernels are measured on each machine (nanogpt.cpu.float32_kernel and the others); in process
    the tests set them, PyTorch's (oneDNN's packed float32 and bfloat16, its int8 product), so that a test means
    the same everywhere. Tests of the other kernels and of the measurement set their own."""
    import nanogpt.cpu
    monkeypatch.setattr(nanogpt.cpu, "FLOAT32_KERNEL", "packed")
    monkeypatch.setattr(nanogpt.cpu, "BFLOAT16_KERNEL", "bfloat16")
    monkeypatch.setattr(nanogpt.cpu, "INT8_KERNEL", "int8")


@pytest.fixture
def tiny_config():
    """2 layers, 32 wide: the suite's workhorse."""
    return GPTConfig(block_size=16, vocab_size=64, n_layer=2, n_head=4, n_embd=32, dropout=0.0, bias=True)


@pytest.fixture
def char_dataset(tmp_path):
    """A char-level dataset of a few KB prepared by data/prepare.py, in tmp_path/data."""
    from data.prepare import prepare
    src = tmp_path / "input.txt"
    src.write_text(CORPUS, encoding="utf-8")
    out = tmp_path / "data"
    prepare(str(src), "char", str(out), 0.1, log=lambda *a: None)
    return out


def optimizer_settings(**changes):
    """The OptimizerSettings train.py builds for TrainConfig(**changes)."""
    from nanogpt.training.optim import OptimizerSettings
    from train import TrainConfig
    return OptimizerSettings.of(TrainConfig(**changes))


# What Python, torch and the libraries beneath them read as they start (a forked child has started already): a run
# that sets any of these otherwise than the fork server's own environment gets a new interpreter
STARTUP_VARIABLES = ("PYTHON", "OMP_", "KMP_", "GOMP_", "MKL_", "OPENBLAS_", "DNNL_", "ONEDNN_", "TORCH", "PYTORCH",
                     "CUDA_", "NCCL_", "LD_", "LANG", "LC_", "MALLOC_", "TMPDIR", "TMP", "TEMP")


def runs_module(name):
    """A script of runs/ (runs/NAME.py), imported as a module: runs/ is not a package."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "runs", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_script(args, cwd=ROOT, timeout=300, env=None):
    """Run a repository script as a user would: `python args...` in cwd; returns the CompletedProcess. A script run
    is a child of the fork server (tests/forkserver.py), which has imported torch once for all of them."""
    full_env = {**_own_env(), **(env or {})}
    forked = _forkserver.run(args, cwd, full_env, timeout) if _forkserver.takes(args, full_env) else None
    return forked or subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env=full_env)


def _own_env():
    """The environment a script starts with unless a test sets more: this process's, output unbuffered."""
    return {**os.environ, "PYTHONUNBUFFERED": "1"}


class _ForkServer:
    """The test's side of tests/forkserver.py: started on the first run it takes, one per pytest worker, one run at
    a time (run() gives None for a run asked for while another is under way: it gets a new interpreter)."""

    def __init__(self):
        import threading
        self.lock = threading.Lock()
        self.sock = self.process = self.env = None

    def takes(self, args, env):
        if os.environ.get("NANOGPT_TEST_FRESH_PROCESSES") or sys.platform != "linux" or not args:
            return False
        if not (args[0].endswith(".py") and not args[0].startswith("-") or args[0] == "-m" and len(args) > 1):
            return False
        base = _own_env()
        if self.env is not None and self.startup(self.env) != self.startup(base):
            self.stop()  # this process's own environment changed (imports write some: torch._dynamo, lm_eval)
        return self.startup(env) == self.startup(base)  # and this run sets none otherwise

    @staticmethod
    def startup(env):
        return {k: v for k, v in env.items() if k.startswith(STARTUP_VARIABLES)}

    def start(self):
        import atexit
        import socket
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.env = _own_env()
        self.process = subprocess.Popen([sys.executable, os.path.join(ROOT, "tests", "forkserver.py"),
                                         str(theirs.fileno())], pass_fds=[theirs.fileno()], env=self.env,
                                        stdin=subprocess.DEVNULL)
        theirs.close()
        self.sock = ours
        atexit.register(self.stop)

    def stop(self):
        """Close the server (it exits when its socket does); the next run starts another."""
        self.env = None
        if self.sock is not None:
            self.sock.close()
            self.sock = None
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()

    def run(self, args, cwd, env, timeout):
        import json
        import socket
        if not self.lock.acquire(blocking=False):
            return None
        try:
            if self.sock is None:
                self.start()
            with open(os.devnull, "rb") as stdin, tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
                request = json.dumps({"argv": list(args), "cwd": os.path.abspath(cwd), "env": env}).encode()
                try:
                    socket.send_fds(self.sock, [request], [stdin.fileno(), out.fileno(), err.fileno()])
                    pid = json.loads(self.sock.recv(1 << 16))["pid"]
                    self.sock.settimeout(timeout)
                    try:
                        answer = self.sock.recv(1 << 16)
                    except TimeoutError:
                        answer = None
                    self.sock.settimeout(None)
                    if answer is None:
                        try:  # it may have ended as the time ran out: then it was reaped and its pid is free
                            answer = self.sock.recv(1 << 16, socket.MSG_DONTWAIT)
                        except BlockingIOError:
                            os.kill(pid, signal.SIGKILL)  # not reaped before the server answers: still the child
                            self.sock.recv(1 << 16)
                            out.seek(0), err.seek(0)  # subprocess.run's gives what it read as bytes, even as text
                            raise subprocess.TimeoutExpired([sys.executable, *args], timeout, out.read() or None,
                                                            err.read() or None) from None
                    returncode = json.loads(answer)["returncode"]
                except subprocess.TimeoutExpired:
                    raise
                except BaseException:  # a server gone or a conversation cut short: the next run starts another
                    self.stop()
                    raise
                return subprocess.CompletedProcess([sys.executable, *args], returncode, self._text(out),
                                                   self._text(err))
        finally:
            self.lock.release()

    @staticmethod
    def _text(file):
        """What subprocess.run(text=True) gives for a stream: the locale's decoding, newlines made \\n."""
        import locale
        file.seek(0)
        text = file.read().decode(locale.getpreferredencoding(False))
        return text.replace("\r\n", "\n").replace("\r", "\n")


_forkserver = _ForkServer()
