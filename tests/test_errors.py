"""Bad input through the real scripts: one line on stderr, exit code 2, no traceback, out_dir untouched."""
import base64
import hashlib
import json
import os

import numpy as np
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
    "consolidate without a sharded checkpoint": (["consolidate.py", "--out_dir={root}/empty"], "no sharded checkpoint at {root}/empty/ckpt.dcp; train one first"),
    "sample without a checkpoint": (["sample.py", "--out_dir={root}/empty"], "no checkpoint at"),
    "truncated checkpoint": (["sample.py", "--out_dir={root}/truncated"], "is not a readable checkpoint"),
    "corrupted checkpoint": (["train.py", "--init_from=resume", "--out_dir={root}/garbage"], "is not a readable checkpoint"),
    "vocabulary mismatch": (["train.py", "--init_from=resume", "--out_dir={root}/out", "--dataset={root}/other"], "vocabulary of"),
    "negative max_new_tokens": (["sample.py", "--out_dir={root}/out", "--max_new_tokens=-5"], "max_new_tokens must be >= 0, got -5"),
    "top_k below 1": (["sample.py", "--out_dir={root}/out", "--top_k=0"], "top_k must be >= 1"),
    "top_p outside (0, 1]": (["sample.py", "--out_dir={root}/out", "--top_p=1.5"], "top_p must be in (0, 1], got 1.5"),
    "more than 4 stops": (["sample.py", "--out_dir={root}/out", "--stop=['a', 'b', 'c', 'd', 'e']"], "stop has 5 sequences; at most 4 are taken"),
    "a stop over 1,000 characters": (["sample.py", "--out_dir={root}/out", "--stop=" + "x" * 1001], "stop has a sequence of 1,001 characters; at most 1,000"),
    "negative temperature": (["sample.py", "--out_dir={root}/out", "--temperature=-1"], "temperature must be a finite number >= 0"),
    "device=cuda without CUDA": (["train.py", "--init_from=resume", "--out_dir={root}/out", "--device=cuda"], "CUDA is not available"),
    "a device torch knows but the scripts do not run on": (["sample.py", "--out_dir={root}/out", "--device=meta"], "device 'meta' is not supported; valid devices are cpu, cuda[:N], mps, auto"),
    "sample with the dataset's metadata gone": (["sample.py", "--out_dir={root}/nometa"], "meta.json"),
    # bad dataset files
    "token ids beyond the vocabulary": (["train.py", *TINY, "--dataset={root}/bigids", "--out_dir={root}/o1"], "holds token id 1000"),
    "empty train.bin": (["train.py", *TINY, "--dataset={root}/emptybin", "--out_dir={root}/o1"], "has 0 bytes, not a whole number of uint16 tokens"),
    "odd-length train.bin": (["train.py", *TINY, "--dataset={root}/oddbin", "--out_dir={root}/o1"], "has 3 bytes, not a whole number"),
    "meta.json of wrong types": (["train.py", *TINY, "--dataset={root}/badmeta", "--out_dir={root}/o1"], "vocab_size is '3', expected a whole number"),
    "meta.json without chars": (["train.py", *TINY, "--dataset={root}/nochars", "--out_dir={root}/o1"], "a char tokenizer needs its chars"),
    "meta.json not an object": (["train.py", *TINY, "--dataset={root}/listmeta", "--out_dir={root}/o1"], "holds a list, expected an object"),
    # the environment
    "out_dir is a file": (["train.py", *TINY, "--dataset={root}/data", "--out_dir={root}/afile", "--max_iters=1"], "cannot write to out_dir"),
    "export over a file": (["export.py", "--out_dir={root}/out", "--hf_dir={root}/afile"], "afile is a file, not a directory"),
    "config file not UTF-8": (["train.py", "{root}/latin1.py"], "is not UTF-8 text (bad byte at offset 20)"),
    "prompt file not UTF-8": (["sample.py", "--out_dir={root}/out", "--start=FILE:{root}/latin1.py"], "is not UTF-8 text"),
    # numeric ranges
    "beta2 of 1.5": (["train.py", "--beta2=1.5"], "beta2 must be in [0, 1), got 1.5"),
    "nan learning rate": (["train.py", "--learning_rate=nan"], "learning_rate expects float, got 'nan'"),
    "infinite learning rate": (["train.py", "--learning_rate=1e999"], "learning_rate expects a finite float, got inf"),
    "seed beyond 64 bits": (["train.py", "--seed=1180591620717411303424"], "seed must be in [0, 2^64)"),
    "dropout of 1": (["train.py", "--dropout=1"], "dropout must be in [0, 1), got 1.0"),
    "norm_eps of 0": (["train.py", "--norm_eps=0"], "norm_eps (0.0) and rope_base (10000.0) must be > 0"),
    "nan temperature": (["sample.py", "--out_dir={root}/out", "--temperature=nan"], "temperature expects float, got 'nan'"),
    "empty stop": (["sample.py", "--out_dir={root}/out", "--stop="], "--stop has an empty string"),
    "more samples than memory holds": (["sample.py", "--out_dir={root}/out", "--num_samples=100000000"], "decoding 100,000,000 samples together needs about"),
    "a model larger than memory": (["train.py", *TINY, "--n_layer=100000", "--n_embd=4096", "--n_head=32", "--dataset={root}/data", "--out_dir={root}/o1"], "lower batch_size"),
    # damaged checkpoints
    "iter_num of the wrong type": (["train.py", "--init_from=resume", "--out_dir={root}/wrongtype"], "iter_num is a str, expected int or Tensor"),
    "saved config of the wrong type": (["train.py", "--init_from=resume", "--out_dir={root}/wrongconfig"], "config: batch_size expects int, got 'big'"),
    "model_args claiming 10^6 layers": (["sample.py", "--out_dir={root}/hugeclaim"], "claims n_layer=1000000 but the weights hold 2 blocks"),
    "model_args claiming a huge width": (["sample.py", "--out_dir={root}/wideclaim"], "model_args make it"),
    "non-finite weights": (["sample.py", "--out_dir={root}/nanweights"], "holds non-finite weights"),
    # damaged or hostile tokenizers (a trained BPE's tokenizer.bpe and meta.json)
    "BPE rank of 10^8": (["train.py", *TINY, "--dataset={root}/bpe_hugerank", "--out_dir={root}/o1"], "tokenizer.bpe:257: rank 100000000, outside 0 to 256 (the file has 257 lines)"),
    "negative BPE rank": (["train.py", *TINY, "--dataset={root}/bpe_negrank", "--out_dir={root}/o1"], "tokenizer.bpe:257: rank -1, outside 0 to 256"),
    "repeated BPE rank": (["train.py", *TINY, "--dataset={root}/bpe_duprank", "--out_dir={root}/o1"], "tokenizer.bpe:257: a rank repeated"),
    "special token id of 10^8": (["train.py", *TINY, "--dataset={root}/bpe_hugespecial", "--out_dir={root}/o1"], "special token ids [100000000] should be [256]"),
    "tokenizer.bpe a FIFO": (["train.py", *TINY, "--dataset={root}/bpe_fifo", "--out_dir={root}/o1"], "is not a regular file"),
    "tokenizer.bpe linking outside the dataset": (["train.py", *TINY, "--max_iters=0", "--dataset={root}/bpe_outside", "--out_dir={root}/o1"], "outside the dataset; copy the file into"),
    "meta.json nested 100,000 deep": (["train.py", *TINY, "--dataset={root}/deepmeta", "--out_dir={root}/o1"], "is not valid JSON (nested too deep)"),
    "checkpoint's tokenizer with a rank of 10^8": (["sample.py", "--out_dir={root}/hugerankckpt"], "tokenizer.bpe:257: rank 100000000"),
    "checkpoint's char tokenizer smaller than its model": (["sample.py", "--out_dir={root}/fewchars"], "but its tokenizer has 8; sample with the tokenizer"),
}

BYTE_RANKS = "".join(f"{base64.b64encode(bytes([b])).decode()} {b}\n" for b in range(256))  # a byte-level BPE, no merges


def write_bpe_dataset(directory, ranks_text, special_tokens=None):
    """A trained-BPE dataset made by hand: the 256 bytes, ranks_text's lines, and <|endoftext|>."""
    from conftest import CORPUS
    directory.mkdir()
    meta = {"tokenizer": "bpe", "pattern": r"\S+|\s+", "ranks": "tokenizer.bpe", "vocab_size": 257, "dtype": "uint16",
            "special_tokens": special_tokens or {"<|endoftext|>": 256}}
    (directory / "meta.json").write_text(json.dumps(meta))
    if ranks_text is not None:
        (directory / "tokenizer.bpe").write_text(ranks_text)
    for split in ("train", "val"):
        np.frombuffer(CORPUS.encode(), dtype=np.uint8).astype(np.uint16).tofile(directory / f"{split}.bin")
    return meta


def make_broken_runs(root):
    ckpt = (root / "out" / "ckpt.pt").read_bytes()
    for name, data in (("truncated", ckpt[:len(ckpt) // 2]), ("garbage", os.urandom(4096))):
        (root / name).mkdir(exist_ok=True)
        (root / name / "ckpt.pt").write_bytes(data)
    (root / "empty").mkdir(exist_ok=True)
    if (root / "bigids").exists():
        return
    meta = (root / "data" / "meta.json").read_text()
    for name, tokens in (("bigids", np.full(500, 1000, dtype=np.uint16).tobytes()), ("emptybin", b""), ("oddbin", b"abc")):
        (root / name).mkdir()
        (root / name / "meta.json").write_text(meta)
        (root / name / "train.bin").write_bytes(tokens)
        (root / name / "val.bin").write_bytes(tokens)
    for name, text in (("badmeta", '{"tokenizer": "char", "chars": ["a", "b", "c"], "vocab_size": "3"}'),
                       ("nochars", '{"tokenizer": "char", "vocab_size": 3}'), ("listmeta", "[1, 2]")):
        (root / name).mkdir()
        (root / name / "meta.json").write_text(text)
        for split in ("train", "val"):
            (root / name / f"{split}.bin").write_bytes((root / "data" / f"{split}.bin").read_bytes())
    (root / "afile").write_text("not a directory")
    (root / "latin1.py").write_bytes("batch_size = 3 # caf\xe9\n".encode("latin-1"))
    state = torch.load(root / "out" / "ckpt.pt", weights_only=True)
    damaged = {"wrongtype": {"iter_num": "two"}, "wrongconfig": {"config": {**state["config"], "batch_size": "big"}},
               "hugeclaim": {"model_args": {**state["model_args"], "n_layer": 10 ** 6}},
               "wideclaim": {"model_args": {**state["model_args"], "n_embd": 10 ** 6, "n_head": 1}},
               "nanweights": {"model": {k: v.clone().fill_(float("nan")) if "c_fc.weight" in k else v
                                        for k, v in state["model"].items()}}}
    for name, change in damaged.items():
        (root / name).mkdir()
        torch.save({**state, **change}, root / name / "ckpt.pt")
    ab = base64.b64encode(b"ab").decode()  # a merge: the 257th line
    for name, line in (("hugerank", f"{ab} {10 ** 8}\n"), ("negrank", f"{ab} -1\n"), ("duprank", f"{ab} 5\n")):
        write_bpe_dataset(root / f"bpe_{name}", BYTE_RANKS + line)
    write_bpe_dataset(root / "bpe_hugespecial", BYTE_RANKS, {"<|endoftext|>": 10 ** 8})
    write_bpe_dataset(root / "bpe_fifo", None)
    os.mkfifo(root / "bpe_fifo" / "tokenizer.bpe")  # opening it for reading would wait for a writer forever
    write_bpe_dataset(root / "bpe_outside", None)
    (root / "outside.bpe").write_text(BYTE_RANKS)  # a valid file, but not the dataset's: it would be copied into checkpoints
    os.symlink(root / "outside.bpe", root / "bpe_outside" / "tokenizer.bpe")
    (root / "deepmeta").mkdir()
    (root / "deepmeta" / "meta.json").write_text("[" * 100_000 + "]" * 100_000)
    (root / "hugerankckpt").mkdir()
    hostile = {**write_bpe_dataset(root / "bpe_forckpt", None), "ranks_text": BYTE_RANKS + f"{ab} {10 ** 8}\n"}
    torch.save({**state, "tokenizer": hostile}, root / "hugerankckpt" / "ckpt.pt")
    (root / "fewchars").mkdir()  # the model emits ids the 8 characters cannot decode
    torch.save({**state, "tokenizer": {"tokenizer": "char", "chars": state["tokenizer"]["chars"][:8]}},
               root / "fewchars" / "ckpt.pt")
    nometa = root / "nometa"
    if not nometa.exists():
        nometa.mkdir()
        state = torch.load(root / "out" / "ckpt.pt", weights_only=True)
        state["config"]["dataset"] = str(root / "gone")
        del state["tokenizer"]  # as an older or nanoGPT checkpoint: only the dataset knows the tokenizer
        torch.save(state, nometa / "ckpt.pt")


NEEDS_NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="this case needs a machine without CUDA")


@pytest.mark.parametrize("case", [pytest.param(c, marks=NEEDS_NO_CUDA) if "CUDA is not available" in CASES[c][1] else c
                                  for c in CASES])
def test_bad_input_is_one_line_exit_2_and_touches_nothing(run, case):
    make_broken_runs(run)
    args, message = CASES[case]
    args, message = [a.format(root=run) for a in args], message.format(root=run)
    watched = [d for d in ("out", "truncated", "garbage", "empty", "nometa", "wrongtype", "wrongconfig", "hugeclaim",
                           "nanweights", "bigids") if (run / d).exists()]
    before = {d: snapshot(run / d) for d in watched}
    result = run_script(args, timeout=120)
    assert result.returncode == 2, (result.stdout, result.stderr)
    errors = [line for line in result.stderr.splitlines() if not line.startswith("override: ")]
    assert len(errors) == 1 and errors[0].startswith("error: "), result.stderr  # sample.py notes overrides on stderr
    assert "Traceback" not in result.stderr and message in errors[0]
    assert {d: snapshot(run / d) for d in watched} == before



SCRIPTS = ["train.py", "rl.py", "sample.py", "serve.py", "trace.py", "export.py", "bench.py", "consolidate.py", "data/prepare.py",
           "data/shakespeare_char/prepare.py", "data/shakespeare/prepare.py", "data/tangshi/prepare.py",
           "data/openwebtext/prepare.py"]  # plot.py imports nothing slow before main
SLOW_IMPORT = "import os, time\nopen(os.environ['IMPORTING'], 'w').close()\ntime.sleep(60)\n"


@pytest.mark.parametrize("script", SCRIPTS)
def test_ctrl_c_while_a_script_imports_exits_130_without_a_traceback(tmp_path, script):
    """Ctrl-C in the seconds a script spends importing torch (or numpy) is one line, exit code 130. Stand-ins
    for both, first on the path, say when the import starts and then take a minute."""
    import signal
    import subprocess
    import sys
    import time
    from conftest import ROOT
    for name in ("torch", "numpy"):
        (tmp_path / f"{name}.py").write_text(SLOW_IMPORT)
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "IMPORTING": str(tmp_path / "importing")}
    proc = subprocess.Popen([sys.executable, script], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)
    deadline = time.time() + 30
    while not (tmp_path / "importing").exists() and time.time() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert (proc.returncode, out, err) == (130, "", "interrupted\n")
