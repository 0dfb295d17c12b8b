"""Bad input through the real scripts: one line on stderr, exit code 2, no traceback, out_dir untouched."""
import base64
import hashlib
import json
import os
import pickle
import random
import shutil

import numpy as np
import pytest
import torch

from conftest import run_script
from nanogpt.tokenizer import KNOWN_PATTERNS
from train import TrainConfig, train

TINY = ["--n_layer=2", "--n_head=2", "--n_embd=32", "--block_size=16", "--batch_size=4",
        "--gradient_accumulation_steps=1", "--eval_iters=2", "--device=cpu"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A char dataset, a second dataset with another vocabulary, and a trained checkpoint."""
    from conftest import CORPUS
    from data.prepare import prepare
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
    "wrong value type": (["train.py", "--batch_size=big"], "batch_size expects an integer, got 'big'"),
    "config file missing": (["train.py", "config/nope.py"], "config file config/nope.py not found"),
    "config file does not parse": (["train.py", "{root}/bad.py"], "bad.py:1: syntax error"),
    "a dataset that is not there": (["train.py", "--dataset={root}/nothing", "--out_dir={root}/out"], "--dataset={root}/nothing: no prepared dataset there or under data/; prepare one: python data/prepare.py --input YOUR_TEXT --out {root}/nothing"),
    "a dataset one letter off": (["train.py", "--dataset={root}/dta", "--out_dir={root}/out"], "did you mean --dataset={root}/data? Or prepare one"),
    "a text file for a dataset": (["train.py", "--dataset={root}/in.txt", "--minutes=1"], "--dataset={root}/in.txt is a text file, not a prepared dataset; prepare it first: python data/prepare.py --input {root}/in.txt --out data/in, then train with --dataset=data/in"),
    "a folder without train.bin": (["train.py", "--dataset={root}/empty", "--minutes=1"], "{root}/empty holds no train.bin; prepare it"),
    "data shorter than block_size + 1": (["train.py", *TINY, "--dataset={root}/short", "--block_size=64", "--out_dir={root}/o3"], "fewer than block_size + 1 (65)"),
    "n_embd not divisible by n_head": (["train.py", "--n_embd=100", "--n_head=6"], "n_embd (100) must be divisible by n_head (6)"),
    "resume without a checkpoint": (["train.py", "--init_from=resume", "--out_dir={root}/empty"], "no checkpoint at"),
    "consolidate without a sharded checkpoint": (["consolidate.py", "--out_dir={root}/empty"], "no sharded checkpoint at {root}/empty/ckpt.dcp; train one first"),
    "sample without a checkpoint": (["sample.py", "--out_dir={root}/empty"], "no checkpoint at"),
    "a new model too large for memory": (["train.py", "--dataset={root}/data", "--n_layer=48", "--n_embd=4096", "--n_head=32", "--block_size=16", "--device=cpu", "--out_dir={root}/o2"], "n_layer or n_embd, or leave them unset and let --minutes=N choose a model this machine trains in N minutes"),
    "a checkpoint named without its ending": (["sample.py", "--out_dir={root}/out", "--ckpt=ckpt"], "no checkpoint at {root}/out/ckpt; {root}/out holds ckpt.pt: name the file with its ending (ckpt.pt)"),
    "quantize to an unknown kind": (["sample.py", "--out_dir={root}/out", "--quantize=int4"], "quantize must be int8 (weight-only int8 linear layers) or empty, got 'int4'"),
    "quantize an export to a Hugging Face directory": (["export.py", "--out_dir={root}/out", "--quantize=int8", "--hf_dir={root}/hf_q"], "--quantize=int8 writes GGUF's Q8_0 (--format=gguf)"),
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
    "an out_dir where a file stands": (["train.py", *TINY, "--dataset={root}/data", "--out_dir={root}/data/train.bin/out", "--minutes=0.5"], "cannot write to out_dir {root}/data/train.bin/out: {root}/data/train.bin is a file, where a directory would be; choose another --out_dir"),
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
    "nan learning rate": (["train.py", "--learning_rate=nan"], "learning_rate expects a number, got 'nan'"),
    "infinite learning rate": (["train.py", "--learning_rate=1e999"], "learning_rate expects a finite number, got inf"),
    "seed beyond 64 bits": (["train.py", "--seed=1180591620717411303424"], "seed must be in [0, 2^64)"),
    "dropout of 1": (["train.py", "--dropout=1"], "dropout must be in [0, 1), got 1.0"),
    # --minutes (the plan)
    "a budget of 0 minutes": (["train.py", "--minutes=0"], "minutes must be a positive number of minutes, got 0.0"),
    "a negative budget": (["train.py", "--minutes=-3"], "minutes must be a positive number of minutes, got -3.0"),
    "a budget that is no number": (["train.py", "--minutes=soon"], "minutes expects a number, got 'soon'"),
    "a budget of nan": (["train.py", "--minutes=nan"], "minutes expects a number, got 'nan'"),
    "a learning rate with a decimal comma": (["train.py", "--learning_rate=0,0006"], "learning_rate expects a number, got '0,0006' (a decimal is written with a point: 0.0006)"),
    "a budget with a decimal comma": (["train.py", "--minutes=1,5"],
                                      "minutes expects a number, got (1, 5) (a decimal is written with a point: 1.5)"),
    "a budget too short to train": (["train.py", "--minutes=0.001", "--device=cpu", "--dataset={root}/data", "--out_dir={root}/o1"], "the shortest budget this machine allows for it is --minutes="),
    "a corpus too small for a val split": (["train.py", "--minutes=1", "--device=cpu", "--dataset={root}/short", "--out_dir={root}/o1"], "too few for a val split"),
    "--minutes resuming a run without a plan": (["train.py", "--init_from=resume", "--out_dir={root}/out", "--minutes=1"], "is not from a planned run (--minutes), so there is no plan to keep"),
    "--minutes fine-tuning a checkpoint": (["train.py", "--minutes=1", "--device=cpu", "--init_from={root}/out", "--dataset={root}/data", "--out_dir={root}/o1"], "--minutes plans a new model from scratch"),
    "norm_eps of 0": (["train.py", "--norm_eps=0"], "norm_eps (0.0) and rope_base (10000.0) must be > 0"),
    "nan temperature": (["sample.py", "--out_dir={root}/out", "--temperature=nan"], "temperature expects a number, got 'nan'"),
    "empty stop": (["sample.py", "--out_dir={root}/out", "--stop="], "--stop has an empty string"),
    "more samples than memory holds": (["sample.py", "--out_dir={root}/out", "--num_samples=100000000"], "decoding 100,000,000 samples together needs about"),
    "a model larger than memory": (["train.py", *TINY, "--n_layer=100000", "--n_embd=4096", "--n_head=32", "--dataset={root}/data", "--out_dir={root}/o1"], "lower batch_size"),
    # damaged checkpoints
    "iter_num of the wrong type": (["train.py", "--init_from=resume", "--out_dir={root}/wrongtype"], "iter_num is a str, expected int or Tensor"),
    "saved config of the wrong type": (["train.py", "--init_from=resume", "--out_dir={root}/wrongconfig"], "config: batch_size expects an integer, got 'big'"),
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
    "checkpoint's BPE pattern that backtracks": (["sample.py", "--out_dir={root}/badpattern", "--start=" + "a" * 40], "refusing the trained BPE's split pattern '(?:a|aa)+(?=b)|.'"),
    # a vocabulary UTF-8 cannot write, special tokens that text could hold: refused wherever a tokenizer is read
    "a vocabulary with a lone surrogate (sample)": (["sample.py", "--out_dir={root}/surrogate"], "its tokenizer: chars holds '\\ud800', a lone surrogate"),
    "a vocabulary with a lone surrogate (HF export)": (["export.py", "--out_dir={root}/surrogate", "--hf_dir={root}/hf_out"], "chars holds '\\ud800', a lone surrogate"),
    "a vocabulary with a lone surrogate (GGUF export)": (["export.py", "--out_dir={root}/surrogate", "--format=gguf", "--gguf_file={root}/out.gguf"], "chars holds '\\ud800', a lone surrogate"),
    "a dataset's meta.json with a lone surrogate": (["train.py", *TINY, "--dataset={root}/surrogate_data", "--out_dir={root}/o1"], "meta.json: chars holds '\\ud800', a lone surrogate"),
    "BPE special token '' (sample)": (["sample.py", "--out_dir={root}/special_empty"], "special token '' is not written <|name|>"),
    "BPE special token '' (HF export)": (["export.py", "--out_dir={root}/special_empty", "--hf_dir={root}/hf_out"], "special token '' is not written <|name|>"),
    "BPE special token ' ' (sample)": (["sample.py", "--out_dir={root}/special_space", "--start=a b"], "special token ' ' is not written <|name|>"),
    "BPE special token ' ' (HF export)": (["export.py", "--out_dir={root}/special_space", "--hf_dir={root}/hf_out"], "special token ' ' is not written <|name|>"),
    "BPE special token 'the' (sample)": (["sample.py", "--out_dir={root}/special_the", "--start=the cat"], "special token 'the' is not written <|name|>"),
    "BPE special token 'the' (HF export)": (["export.py", "--out_dir={root}/special_the", "--hf_dir={root}/hf_out"], "special token 'the' is not written <|name|>"),
    "a bare pickle as ckpt.pt": (["sample.py", "--out_dir={root}/barepickle"], "barepickle/ckpt.pt is not a readable checkpoint (truncated or corrupted?): UnpicklingError: Unsupported operand 149"),
    "meta.pkl with a persistent id": (["train.py", *TINY, "--dataset={root}/persid", "--out_dir={root}/o1"], "is not plain data (A load persistent id instruction was encountered, but no persistent_load"),
    # files that are not regular: a FIFO's open or read would wait for a writer forever
    "ckpt.pt a FIFO": (["sample.py", "--out_dir={root}/fifo_ckpt"], "fifo_ckpt/ckpt.pt is not a regular file (it is a FIFO)"),
    ".metadata a FIFO": (["sample.py", "--out_dir={root}/fifo_metadata"], "ckpt.dcp/.metadata is not a regular file (it is a FIFO)"),
    "meta.pt a FIFO": (["sample.py", "--out_dir={root}/fifo_metapt"], "ckpt.dcp/meta.pt is not a regular file (it is a FIFO)"),
    "a .distcp shard a FIFO": (["sample.py", "--out_dir={root}/fifo_distcp"], "ckpt.dcp/__0_0.distcp is not a regular file (it is a FIFO)"),
    "a .distcp shard a FIFO on resume": (["train.py", "--init_from=resume", "--out_dir={root}/fifo_distcp"], "ckpt.dcp/__0_0.distcp is not a regular file (it is a FIFO)"),
    "model.safetensors a FIFO": (["sample.py", "--init_from={root}/hf_fifo"], "hf_fifo/model.safetensors is not a regular file (it is a FIFO)"),
    "config.json a FIFO": (["sample.py", "--init_from={root}/hf_fifoconfig"], "hf_fifoconfig/config.json is not a regular file (it is a FIFO)"),
    # files a user names: read only where they are regular files (/dev/zero never ends, a FIFO waits for a writer)
    "prompt file /dev/zero": (["sample.py", "--out_dir={root}/out", "--start=FILE:/dev/zero"], "--start=FILE:/dev/zero: /dev/zero is not a regular file (it is a character device)"),
    "prompt file a FIFO": (["sample.py", "--out_dir={root}/out", "--start=FILE:{root}/fifo_named"], "fifo_named is not a regular file (it is a FIFO)"),
    "config file a FIFO": (["train.py", "{root}/fifo_named"], "fifo_named is not a regular file (it is a FIFO)"),
    "reward file a FIFO": (["rl.py", "--init_from={root}/out", "--reward_file={root}/fifo_named"], "fifo_named is not a regular file (it is a FIFO)"),
    "reward file with a syntax error": (["rl.py", "--init_from={root}/out", "--reward_file={root}/syntax_reward.py"], "syntax_reward.py: line 2: syntax error"),
    "reward file whose import fails": (["rl.py", "--init_from={root}/out", "--reward_file={root}/import_reward.py"], "running it raised ModuleNotFoundError: No module named 'no_such_module_here'"),
    "rl.py device=cuda without CUDA": (["rl.py", "--init_from={root}/out", "--device=cuda"], "device=cuda but CUDA is not available on this machine"),
    ".lock a FIFO": (["train.py", *TINY, "--dataset={root}/data", "--out_dir={root}/fifo_lock", "--max_iters=1"], "refusing to write {root}/fifo_lock/.lock: it is not a regular file (it is a FIFO)"),
    # Hugging Face directories
    "config.json with a string n_embd": (["sample.py", "--init_from={root}/hf_strembd"], "config.json: n_embd is '32', expected int"),
    "config.json nested 100,000 deep": (["sample.py", "--init_from={root}/hf_deep"], "config.json is not valid JSON (nested too deep)"),
    # eval.py
    "eval with a negative num_fewshot": (["eval.py", "--out_dir={root}/out", "--tasks=x", "--num_fewshot=-1"], "num_fewshot must be >= 0"),
    "eval with more few-shot examples than the context": (["eval.py", "--out_dir={root}/out", "--tasks=x", "--num_fewshot=100000", "--device=cpu"], "--num_fewshot=100000: the model's context holds 16 tokens"),
    "eval writing its results to a directory": (["eval.py", "--out_dir={root}/out", "--tasks=x", "--output_path={root}/adir"], "--output_path={root}/adir is a directory"),
    # the chat prepare never replaces its base, nor any directory that is not a chat dataset
    "chat prepare into its base": (["data/chat/prepare.py", "--input", "{root}/conv.jsonl", "--base", "{root}/data", "--out", "{root}/data"], "--out {root}/data is the base dataset"),
    "chat prepare over another dataset": (["data/chat/prepare.py", "--input", "{root}/conv.jsonl", "--base", "{root}/data", "--out", "{root}/other"], "--out {root}/other exists and is not a chat dataset"),
    "chat prepare over an out_dir": (["data/chat/prepare.py", "--input", "{root}/conv.jsonl", "--base", "{root}/data", "--out", "{root}/out"], "--out {root}/out exists and is not a chat dataset"),
    "chat prepare on a chat dataset as its base": (["data/chat/prepare.py", "--input", "{root}/conv.jsonl", "--base", "{root}/chatdata", "--out", "{root}/chat2"], "--base {root}/chatdata is a chat dataset (made from data): its role tokens would be added twice; pass --base data"),
    "chat prepare with block_size 0": (["data/chat/prepare.py", "--input", "{root}/conv.jsonl", "--base", "{root}/data", "--out", "{root}/chat2", "--block_size", "0"], "--block_size must be at least 2, got 0"),
    "chat prepare with block_size 0 and init_from": (["data/chat/prepare.py", "--input", "{root}/conv.jsonl", "--init_from", "{root}/out", "--out", "{root}/chat2", "--block_size", "0"], "--block_size must be at least 2, got 0"),
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
    garbage = random.Random(0).randbytes(4096)  # seeded: what any random file does is test_fuzz.py's
    for name, data in (("truncated", ckpt[:len(ckpt) // 2]), ("garbage", garbage)):
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
    for split in ("train.bin", "val.bin"):  # a prepared dataset but for its meta.json
        shutil.copy(root / "data" / split, root / "deepmeta" / split)
    (root / "hugerankckpt").mkdir()
    hostile = {**write_bpe_dataset(root / "bpe_forckpt", None), "ranks_text": BYTE_RANKS + f"{ab} {10 ** 8}\n"}
    torch.save({**state, "tokenizer": hostile}, root / "hugerankckpt" / "ckpt.pt")
    (root / "fewchars").mkdir()  # the model emits ids the 8 characters cannot decode
    torch.save({**state, "tokenizer": {"tokenizer": "char", "chars": state["tokenizer"]["chars"][:8]}},
               root / "fewchars" / "ckpt.pt")
    make_unreadable_runs(root, state)
    nometa = root / "nometa"
    if not nometa.exists():
        nometa.mkdir()
        state = torch.load(root / "out" / "ckpt.pt", weights_only=True)
        state["config"]["dataset"] = str(root / "gone")
        del state["tokenizer"]  # as an older or nanoGPT checkpoint: only the dataset knows the tokenizer
        torch.save(state, nometa / "ckpt.pt")


HF_CONFIG = {"model_type": "gpt2", "n_positions": 16, "vocab_size": 34, "n_layer": 2, "n_head": 2, "n_embd": 32,
             "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5, "tie_word_embeddings": True,
             "bos_token_id": 0, "eos_token_id": 0}


def make_unreadable_runs(root, state):
    """FIFOs where files are read, hostile tokenizers and Hugging Face configs, a base dataset to keep."""
    from train import TrainConfig, train
    sharded = root / "sharded"
    train(TrainConfig(out_dir=str(sharded), dataset=str(root / "data"), n_layer=2, n_head=2, n_embd=32, block_size=16,
                      batch_size=4, gradient_accumulation_steps=1, eval_iters=2, max_iters=2, eval_interval=2,
                      device="cpu", parallel="fsdp"), log=lambda *a: None)
    for name, file in (("fifo_metadata", ".metadata"), ("fifo_metapt", "meta.pt"), ("fifo_distcp", "__0_0.distcp")):
        shutil.copytree(sharded, root / name)
        os.remove(root / name / "ckpt.dcp" / file)
        os.mkfifo(root / name / "ckpt.dcp" / file)
    (root / "fifo_ckpt").mkdir()
    os.mkfifo(root / "fifo_ckpt" / "ckpt.pt")
    (root / "fifo_lock").mkdir()
    os.mkfifo(root / "fifo_lock" / ".lock")
    os.mkfifo(root / "fifo_named")
    (root / "syntax_reward.py").write_text("from nanogpt.rewards import reward\ndef thou(request, answer:\n")
    (root / "import_reward.py").write_text("import no_such_module_here\n")
    for name, config in (("hf_fifo", json.dumps(HF_CONFIG)), ("hf_fifoconfig", None),
                         ("hf_strembd", json.dumps({**HF_CONFIG, "n_embd": "32"})),
                         ("hf_deep", '{"n_embd": ' + "[" * 100_000 + "]" * 100_000 + "}")):
        (root / name).mkdir()
        if config is None:
            os.mkfifo(root / name / "config.json")
        else:
            (root / name / "config.json").write_text(config)
        if name == "hf_fifo":
            os.mkfifo(root / name / "model.safetensors")
        else:
            (root / name / "model.safetensors").write_bytes(b"")
    (root / "badpattern").mkdir()
    evil = {"tokenizer": "bpe", "pattern": "(?:a|aa)+(?=b)|.", "ranks": "tokenizer.bpe", "vocab_size": 257,
            "special_tokens": {"<|endoftext|>": 256}, "ranks_text": BYTE_RANKS}
    torch.save({**state, "tokenizer": evil}, root / "badpattern" / "ckpt.pt")
    make_hostile_vocabularies(root, state)
    (root / "barepickle").mkdir()
    (root / "barepickle" / "ckpt.pt").write_bytes(pickle.dumps({"model": {}, "model_args": {}}, protocol=4))
    (root / "persid").mkdir()
    (root / "persid" / "meta.pkl").write_bytes(b"P1\n.")  # a persistent id: pickle's error is two lines
    for split in ("train", "val"):
        shutil.copyfile(root / "data" / f"{split}.bin", root / "persid" / f"{split}.bin")
    (root / "adir").mkdir()
    from test_eval import write_task
    write_task(root / "tasks", "tiny_two", [{"context": "First", "label": 0, "choices": [" C", "ll"]},
                                            {"context": "All:", "label": 1, "choices": ["e", "\n"]}])
    (root / "conv.jsonl").write_text(json.dumps({"messages": [{"role": "user", "content": "All"},
                                                              {"role": "assistant", "content": "Speak"}]}) + "\n")
    from nanogpt.chat_dataset import prepare_chat
    (root / "conv4.jsonl").write_text((root / "conv.jsonl").read_text() * 4)
    prepare_chat(str(root / "conv4.jsonl"), str(root / "data"), str(root / "chatdata"), block_size=16, log=lambda *a: None)


def make_hostile_vocabularies(root, state):
    """A char vocabulary holding a lone surrogate (in a checkpoint and in a dataset's meta.json), and trained BPEs
    of 258 tokens (the model's too) whose second special token is "", " " or "the"."""
    (root / "surrogate").mkdir()
    chars = state["tokenizer"]["chars"]
    torch.save({**state, "tokenizer": {**state["tokenizer"], "chars": chars[:-1] + ["\ud800"]}},
               root / "surrogate" / "ckpt.pt")
    shutil.copytree(root / "data", root / "surrogate_data")
    (root / "surrogate_data" / "meta.json").write_text(json.dumps({"tokenizer": "char", "chars": chars[:-1] + ["\ud800"],
                                                                   "vocab_size": len(chars)}))  # ASCII: "\\ud800"
    wider = {k: v.repeat(8, 1)[:258].clone() if v.shape[:1] == (len(chars),) else v for k, v in state["model"].items()}
    for name, special in (("special_empty", ""), ("special_space", " "), ("special_the", "the")):
        tokenizer = {"tokenizer": "bpe", "pattern": KNOWN_PATTERNS["GPT-2's"], "ranks": "tokenizer.bpe",
                     "vocab_size": 258, "special_tokens": {"<|endoftext|>": 256, special: 257}, "ranks_text": BYTE_RANKS}
        (root / name).mkdir()
        torch.save({**state, "model_args": {**state["model_args"], "vocab_size": 258}, "model": wider,
                    "tokenizer": tokenizer}, root / name / "ckpt.pt")


NEEDS_NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="this case needs a machine without CUDA")


@pytest.mark.parametrize("case", [pytest.param(c, marks=NEEDS_NO_CUDA) if "CUDA is not available" in CASES[c][1] else c
                                  for c in CASES])
def test_bad_input_is_one_line_exit_2_and_touches_nothing(run, case):
    make_broken_runs(run)
    args, message = CASES[case]
    args, message = [a.format(root=run) for a in args], message.format(root=run)
    watched = [d for d in ("out", "truncated", "garbage", "empty", "nometa", "wrongtype", "wrongconfig", "hugeclaim",
                           "nanweights", "bigids", "data", "other", "barepickle", "adir", "chatdata") if (run / d).exists()]
    before = {d: snapshot(run / d) for d in watched}
    names = sorted(os.listdir(run))
    result = run_script(args, timeout=120)
    assert result.returncode == 2, (result.stdout, result.stderr)
    errors = [line for line in result.stderr.splitlines() if not line.startswith("override: ")]
    assert len(errors) == 1 and errors[0].startswith("error: "), result.stderr  # sample.py notes overrides on stderr
    assert "Traceback" not in result.stderr and message in errors[0]
    assert "weights_only" not in result.stderr  # torch's advice to load with full pickle never reaches the user
    assert {d: snapshot(run / d) for d in watched} == before
    new = set(os.listdir(run)) - set(names)  # nothing written beside them (an eval's .tmp, a chat prepare's)
    # (train.py makes its out_dir and takes its .lock before it reads a batch: a new out_dir may hold that alone)
    assert all((run / n).is_dir() and set(os.listdir(run / n)) <= {".lock"} for n in new), new



SCRIPTS = ["train.py", "rl.py", "sample.py", "serve.py", "trace.py", "export.py", "bench.py", "consolidate.py", "data/prepare.py",
           "data/shakespeare_char/prepare.py", "data/shakespeare/prepare.py", "data/tangshi/prepare.py",
           "data/openwebtext/prepare.py"]  # plot.py imports nothing slow before main
SLOW_IMPORT = "import os, time\nopen(os.environ['IMPORTING'], 'w').close()\ntime.sleep(180)\n"


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
    # the script starts with Ctrl-C's default disposition, as from a terminal, whatever this worker has set (an
    # ignored SIGINT is inherited through exec, and then the script rightly ignores it: once, CI timed out so)
    proc = subprocess.Popen([sys.executable, script], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    # generous waits: under the whole suite on 2 cores a script took more than 30 s to start and answer (a lost
    # Ctrl-C still fails: the stand-in sleeps longer than both waits together)
    deadline = time.time() + 60
    while not (tmp_path / "importing").exists() and time.time() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=90)
    assert (proc.returncode, out, err) == (130, "", "interrupted\n")


LINKED = {  # the file planted as a link in out_dir: the command that writes it
    ".lock": ["train.py", *TINY, "--dataset={root}/data", "--out_dir={out}", "--max_iters=1"],
    "log.jsonl": ["train.py", *TINY, "--dataset={root}/data", "--out_dir={out}", "--max_iters=1"],
    "eval_results.json.tmp": ["eval.py", "--out_dir={out}", "--tasks=tiny_known", "--include_path={root}/tasks",
                              "--device=cpu"],
    "trace.html": ["trace.py", "--out_dir={out}", "--start=All", "--steps=1", "--html=trace.html", "--device=cpu"],
    "trace.json": ["trace.py", "--out_dir={out}", "--start=All", "--steps=1", "--json=trace.json", "--device=cpu"],
}


@pytest.mark.parametrize("name", LINKED)
def test_a_link_planted_in_an_out_dir_is_refused_and_its_target_untouched(run, tmp_path, name):
    """A run directory taken from someone else may hold links: no write follows one out of out_dir."""
    out, victim = tmp_path / "out", tmp_path / "victim.txt"
    shutil.copytree(run / "out", out) if name != ".lock" and name != "log.jsonl" else out.mkdir()
    (out / name).unlink(missing_ok=True)
    victim.write_text("precious\n")
    os.symlink(victim, out / name)
    if name.startswith("eval"):
        pytest.importorskip("lm_eval")
        from test_eval import write_task
        write_task(run / "tasks", "tiny_known", [{"context": "First", "label": 0, "choices": [" C", "ll"]}])
    result = run_script([a.format(root=run, out=out) for a in LINKED[name]], timeout=120)
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.returncode == 2 and len(errors) == 1, result.stderr[-3000:]
    assert f"refusing to write {out / name}: it is a symbolic link (to {victim})" in errors[0]
    assert victim.read_text() == "precious\n" and os.path.islink(out / name)


def test_export_replaces_links_planted_in_its_directory_and_leaves_their_targets(run, tmp_path):
    pytest.importorskip("transformers")
    hf, victim = tmp_path / "hf", tmp_path / "victim.txt"
    hf.mkdir()
    victim.write_text("precious\n")
    for name in ("model.safetensors", "config.json", "meta.json"):
        os.symlink(victim, hf / name)
    result = run_script(["export.py", f"--out_dir={run / 'out'}", f"--hf_dir={hf}"])
    assert result.returncode == 0, result.stderr[-3000:]
    assert victim.read_text() == "precious\n"
    assert all(not os.path.islink(hf / name) and (hf / name).stat().st_size > 0
               for name in ("model.safetensors", "config.json", "meta.json"))
    assert not [n for n in os.listdir(hf) if n.startswith(".")]  # its temporary directory is gone


@pytest.mark.parametrize("named", ["/dev/zero", "a FIFO"])
def test_an_rl_prompts_file_that_never_ends_is_one_line(tmp_path, named):
    """--prompts=FILE: is read only where it is a regular file: /dev/zero would fill memory, a FIFO wait forever."""
    path = "/dev/zero" if named == "/dev/zero" else str(tmp_path / "fifo")
    if named == "a FIFO":
        os.mkfifo(path)
    code = ("import sys, rl; from nanogpt.program import run_main; "
            "run_main(lambda argv: rl.read_requests(rl.RLConfig(prompts=sys.argv[1])))")
    result = run_script(["-c", code, f"FILE:{path}"], timeout=60)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.splitlines() == [f"error: --prompts=FILE:{path}: {path} is not a regular file (it is "
                                          f"{'a character device' if named == '/dev/zero' else 'a FIFO'}): refusing "
                                          f"to read it; put the file itself there"]
