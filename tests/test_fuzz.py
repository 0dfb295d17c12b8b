"""Property-based: whatever a user or a file holds, the result is a value or the one-line error, never a traceback.

Each property feeds random input to the code that reads it (config values, token files, dataset metadata,
checkpoint fields) and accepts exactly two outcomes: it works, or it raises UserError with one line.
"""
import json
import os

import numpy as np
import pytest
import torch

hypothesis = pytest.importorskip("hypothesis")
from trace import TraceConfig  # noqa: E402

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from configurator import UserError, parse_args  # noqa: E402
from sample import SampleConfig  # noqa: E402
from train import TrainConfig  # noqa: E402


def fuzz(examples):
    """Bounded and reproducible: the same examples on every run (CI stays deterministic), no example database."""
    return settings(max_examples=examples, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                    max_leaves=12)
VALUES = (st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12)
          | st.lists(st.integers() | st.text(max_size=3), max_size=3))


def one_line(error):
    assert "\n" not in str(error) and str(error), repr(str(error))


def outcome(call, *args, **kwargs):
    """Call it; a UserError must be one line. Anything else propagates and fails the test."""
    try:
        return call(*args, **kwargs)
    except UserError as e:
        one_line(e)
        return None


@pytest.mark.parametrize("cls", [TrainConfig, SampleConfig, TraceConfig], ids=lambda c: c.__name__)
@fuzz(150)
@given(data=st.data())
def test_any_text_for_any_key_on_the_command_line(cls, data):
    key = data.draw(st.sampled_from(sorted(cls.__dataclass_fields__)))
    text = data.draw(st.text(max_size=24) | st.from_regex(r"-?[0-9]{1,30}(\.[0-9]*)?(e-?[0-9]{1,4})?", fullmatch=True))
    outcome(parse_args, cls, [f"--{key}={text}"])


@fuzz(60)
@given(data=st.data())
def test_any_value_for_any_key_in_a_config_file(tmp_path_factory, data):
    key = data.draw(st.sampled_from(sorted(TrainConfig.__dataclass_fields__)))
    value = data.draw(VALUES)
    path = tmp_path_factory.mktemp("cfg") / "c.py"
    path.write_text(f"{key} = {value!r}\n", encoding="utf-8")
    outcome(parse_args, TrainConfig, [str(path)])


def make_dataset(root, meta_text, train_bytes, val_bytes):
    root.mkdir(parents=True, exist_ok=True)
    (root / "meta.json").write_text(meta_text, encoding="utf-8")
    (root / "train.bin").write_bytes(train_bytes)
    (root / "val.bin").write_bytes(val_bytes)
    return root


def read_dataset(root, vocab_size=65):
    """What train.py does with a dataset before training: metadata, tokenizer, a batch of each split."""
    from nanogpt.training.batches import Batches
    from nanogpt.tokenizer import read_meta, tokenizer_from_meta
    meta = read_meta(str(root))
    if meta is not None and meta.get("tokenizer", "char") == "char":
        tokenizer_from_meta(meta)
    batches = Batches(str(root), 4, 2, torch.device("cpu"), 0, meta, vocab_size=vocab_size)
    return batches.get("train", (0, 0, 0)), next(batches.windows("val", 2))


CHAR_META = json.dumps({"tokenizer": "char", "chars": [chr(97 + i) for i in range(26)], "vocab_size": 26,
                        "dtype": "uint16"})


@fuzz(80)
@given(train=st.binary(max_size=64), val=st.binary(max_size=64))
def test_any_bytes_as_token_files(tmp_path_factory, train, val):
    root = make_dataset(tmp_path_factory.mktemp("bin") / "d", CHAR_META, train, val)
    outcome(read_dataset, root, vocab_size=26)


META_FIELDS = st.fixed_dictionaries({}, optional={
    "tokenizer": st.sampled_from(["char", "gpt2", "bpe", ""]) | JSON, "vocab_size": st.integers(-2, 70) | JSON,
    "dtype": st.sampled_from(["uint16", "uint32", "int8", "float32"]) | JSON,
    "chars": st.lists(st.characters(), max_size=30) | JSON, "itos": JSON})


@fuzz(80)
@given(meta=META_FIELDS | JSON)
def test_any_json_as_dataset_metadata(tmp_path_factory, meta):
    tokens = np.arange(40, dtype=np.uint16).tobytes()
    root = make_dataset(tmp_path_factory.mktemp("meta") / "d", json.dumps(meta), tokens, tokens)
    outcome(read_dataset, root)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    from conftest import CORPUS
    from data.prepare import prepare
    from train import train
    root = tmp_path_factory.mktemp("fuzzckpt")
    (root / "in.txt").write_text(CORPUS)
    prepare(str(root / "in.txt"), "char", str(root / "data"), log=lambda *a: None)
    cfg = TrainConfig(out_dir=str(root / "out"), dataset=str(root / "data"), n_layer=1, n_head=2, n_embd=16,
                      block_size=8, batch_size=2, gradient_accumulation_steps=1, eval_iters=1, max_iters=1,
                      eval_interval=1, device="cpu", dropout=0.1)
    train(cfg, log=lambda *a: None)
    return root, torch.load(root / "out" / "ckpt.pt", weights_only=True)


FIELDS = ["iter_num", "best_val_loss", "config", "model_args", "optimizer", "scaler", "rng", "model", "tokenizer",
          "train_time"]
NESTED = ["config.batch_size", "config.learning_rate", "config.dataset", "config.optimizer", "model_args.n_layer",
          "model_args.n_embd", "model_args.block_size", "model_args.vocab_size", "model_args.pos_emb",
          "model_args.bias", "rng.0", "optimizer.state", "optimizer.param_groups", "scaler.scale",
          "tokenizer.tokenizer", "tokenizer.chars", "tokenizer.vocab_size"]


@fuzz(40)
@given(field=st.sampled_from(FIELDS + NESTED), value=VALUES | JSON)
def test_any_value_in_a_checkpoint_field(trained, tmp_path_factory, field, value):
    """Sampling and resuming a checkpoint whose one field holds something random."""
    from nanogpt.checkpoint import load_checkpoint, model_from_checkpoint
    from train import train
    root, state = trained
    ckpt = {**state, **{k: dict(v) if isinstance(v, dict) else list(v) if isinstance(v, list) else v
                        for k, v in state.items() if k in ("config", "model_args", "optimizer", "scaler", "rng",
                                                           "tokenizer")}}
    head, _, tail = field.partition(".")
    if tail:
        container = ckpt[head]
        container[int(tail) if isinstance(container, list) else tail] = value
    else:
        ckpt[head] = value
    out = tmp_path_factory.mktemp("ckpt")
    torch.save(ckpt, out / "ckpt.pt")
    path = str(out / "ckpt.pt")

    def sample_then_resume():
        from nanogpt.source import load_model
        from sample import SampleConfig
        model_from_checkpoint(load_checkpoint(path), path)
        load_model(SampleConfig(out_dir=str(out)), torch.device("cpu"))
        cfg, overrides = parse_args(TrainConfig, ["--init_from=resume", f"--out_dir={out}", "--max_iters=2",
                                                  f"--dataset={root / 'data'}"])
        train(cfg, overrides, log=lambda *a: None)
    outcome(sample_then_resume)
    assert not [f for f in os.listdir(out) if f.endswith(".tmp")]


# the starts of files torch reads another way: a zip (torch.save), pickles of each protocol (an old torch.save)
FILE_STARTS = st.sampled_from([b"", b"PK\x03\x04", b"\x80\x02", b"\x80\x04\x95", b"\x80\x05", b"(", b"}"])


@fuzz(200)
@given(start=FILE_STARTS, rest=st.binary(max_size=512))
def test_any_bytes_as_a_checkpoint_file_are_one_line_and_nothing_else(tmp_path_factory, capfd, start, rest):
    """A random file as ckpt.pt: a one-line UserError, no warning, nothing else on stderr, and never torch's
    advice to load it with weights_only=False (the old-pickle route warns about its protocol)."""
    import warnings

    from nanogpt.checkpoint import read_tensors
    path = tmp_path_factory.mktemp("bytes") / "ckpt.pt"
    path.write_bytes(start + rest)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            read_tensors(str(path))
        except UserError as e:
            one_line(e)
            assert "weights_only" not in str(e), str(e)
    assert not caught, [str(w.message) for w in caught]
    assert capfd.readouterr().err == ""
