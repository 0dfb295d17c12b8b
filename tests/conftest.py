import os
import signal
import sys
import tempfile

import pytest

# pytest-xdist runs one worker per core (pytest.ini): each worker's torch, and every program it starts, then
# computes on one thread, as torchrun's workers do; two threads each on shared cores wait for each other
if "PYTEST_XDIST_WORKER" in os.environ:
    os.environ.setdefault("OMP_NUM_THREADS", "1")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
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


def run_script(args, cwd=ROOT, timeout=300, env=None):
    """Run a repository script as a user would; returns the CompletedProcess."""
    import subprocess
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env=full_env)
