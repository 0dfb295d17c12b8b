"""Bad input through the real scripts: one line on stderr, exit code 2, no traceback, out_dir untouched."""
import hashlib
import os

import pytest
import torch

from conftest import run_script
from train import TrainConfig, train

TINY = ["--n_layer=2", "--n_head=2", "--n_embd=32", "--block_size=16", "--batch_size=4",
        "--gradient_accumulation_steps=1", "--eval_iters=2", "--device=cpu"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A char dataset, a second dataset with another vocabulary, and a trained checkpoint."""
    from data.prepare import prepare
    from conftest import CORPUS
    root = tmp_path_factory.mktemp("errors")
    (root / "in.txt").write_text(CORPUS)
    prepare(str(root / "in.txt"), "char", str(root / "data"), log=lambda *a: None)
    (root / "other.txt").write_text("abcdefg hijkl\n" * 200)
    prepare(str(root / "other.txt"), "char", str(root / "other"), log=lambda *a: None)
    (root / "short.txt").write_text("tiny text, too short\n")
    prepare(str(root / "short.txt"), "char", str(root / "short"), log=lambda *a: None)
    cfg = TrainConfig(out_dir=str(root / "out"), dataset=str(root / "data"), n_layer=2, n_head=2, n_embd=32,
                      block_size=16, batch_size=4, gradient_accumulation_steps=1, eval_iters=2, max_iters=2,
                      eval_interval=2, device="cpu")
    train(cfg, log=lambda *a: None)
    (root / "bad.py").write_text("batch_size = = 2\n")
    (root / "typo.py").write_text("learning_rat = 1e-3\n")
    return root


def snapshot(directory):
    return {name: hashlib.sha256(open(os.path.join(directory, name), "rb").read()).hexdigest()
            for name in sorted(os.listdir(directory))}


CASES = {
    "unknown config key in a file": (["train.py", "{root}/typo.py"], "unknown key 'learning_rat' (did you mean 'learning_rate'?)"),
    "unknown key on the CLI": (["train.py", "--learning_rat=1"], "did you mean 'learning_rate'?"),
    "wrong value type": (["train.py", "--batch_size=big"], "batch_size expects int, got 'big'"),
    "config file missing": (["train.py", "config/nope.py"], "config file config/nope.py not found"),
    "config file does not parse": (["train.py", "{root}/bad.py"], "bad.py:1: syntax error"),
    "missing train.bin": (["train.py", "--dataset={root}/nothing", "--out_dir={root}/out"], "train.bin not found; run python data/nothing/prepare.py"),
    "data shorter than block_size + 1": (["train.py", *TINY, "--dataset={root}/short", "--block_size=64", "--out_dir={root}/out"], "fewer than block_size + 1 (65)"),
    "n_embd not divisible by n_head": (["train.py", "--n_embd=100", "--n_head=6"], "n_embd (100) must be divisible by n_head (6)"),
    "resume without a checkpoint": (["train.py", "--init_from=resume", "--out_dir={root}/empty"], "no checkpoint at"),
    "sample without a checkpoint": (["sample.py", "--out_dir={root}/empty"], "no checkpoint at"),
    "truncated checkpoint": (["sample.py", "--out_dir={root}/truncated"], "is not a readable checkpoint"),
    "corrupted checkpoint": (["train.py", "--init_from=resume", "--out_dir={root}/garbage"], "is not a readable checkpoint"),
    "vocabulary mismatch": (["train.py", "--init_from=resume", "--out_dir={root}/out", "--dataset={root}/other"], "vocabulary of"),
    "prompt outside the vocabulary": (["sample.py", "--out_dir={root}/out", "--start=Zebra@#"], "4 character(s) outside the vocabulary: '#' '@' 'Z' 'b'"),
    "negative max_new_tokens": (["sample.py", "--out_dir={root}/out", "--max_new_tokens=-5"], "max_new_tokens must be >= 0, got -5"),
    "top_k below 1": (["sample.py", "--out_dir={root}/out", "--top_k=0"], "top_k must be >= 1"),
    "top_p outside (0, 1]": (["sample.py", "--out_dir={root}/out", "--top_p=1.5"], "top_p must be in (0, 1], got 1.5"),
    "negative temperature": (["sample.py", "--out_dir={root}/out", "--temperature=-1"], "temperature must be >= 0"),
    "device=cuda without CUDA": (["train.py", "--init_from=resume", "--out_dir={root}/out", "--device=cuda"], "CUDA is not available"),
    "sample with the dataset's metadata gone": (["sample.py", "--out_dir={root}/nometa"], "meta.json"),
}


def make_broken_runs(root):
    ckpt = (root / "out" / "ckpt.pt").read_bytes()
    for name, data in (("truncated", ckpt[:len(ckpt) // 2]), ("garbage", os.urandom(4096))):
        (root / name).mkdir(exist_ok=True)
        (root / name / "ckpt.pt").write_bytes(data)
    (root / "empty").mkdir(exist_ok=True)
    nometa = root / "nometa"
    if not nometa.exists():
        nometa.mkdir()
        state = torch.load(root / "out" / "ckpt.pt", weights_only=True)
        state["config"]["dataset"] = str(root / "gone")
        torch.save(state, nometa / "ckpt.pt")


@pytest.mark.skipif(torch.cuda.is_available(), reason="the device=cuda case needs a machine without CUDA")
@pytest.mark.parametrize("case", CASES)
def test_bad_input_is_one_line_exit_2_and_touches_nothing(run, case):
    make_broken_runs(run)
    args, message = CASES[case]
    args = [a.format(root=run) for a in args]
    watched = [d for d in ("out", "truncated", "garbage", "empty", "nometa") if (run / d).exists()]
    before = {d: snapshot(run / d) for d in watched}
    result = run_script(args, timeout=120)
    assert result.returncode == 2, (result.stdout, result.stderr)
    errors = [line for line in result.stderr.splitlines() if not line.startswith("override: ")]
    assert len(errors) == 1 and errors[0].startswith("error: "), result.stderr  # sample.py notes overrides on stderr
    assert "Traceback" not in result.stderr and message in errors[0]
    assert {d: snapshot(run / d) for d in watched} == before
