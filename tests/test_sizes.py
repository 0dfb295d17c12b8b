"""Sizes a file declares are checked against what it holds before anything is allocated from them: pickles
(memo slots, lengths, frames), the records of a checkpoint's zip, a Llama or Qwen3 config.json.

The hostile files run through the programs as a user runs them, in a process allowed 4 GiB of address
space and 2 minutes of CPU (a regression fails, it does not exhaust the machine), whose peak memory is read
from the kernel."""
import os
import pickle
import resource
import shutil
import struct
import subprocess
import sys
import warnings
import zipfile
import zlib

import pytest
import torch

from conftest import CORPUS, ROOT
from model import GPT, GPTConfig
from nanogpt import checkpoint
from nanogpt.errors import UserError
from nanogpt.pickles import load_pickle

PEAK_MIB = 1024  # a refusal: torch and the program, never the claimed sizes (2 GiB and more)


def run_measured(args, tmp_path):
    """(exit code, stderr, peak resident MiB) of a repository script run as a user would."""
    def limit_memory():
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
        resource.setrlimit(resource.RLIMIT_CPU, (120, 120))  # a regression that computes from a claim ends too
    with open(tmp_path / "stderr.txt", "w+") as err:
        proc = subprocess.Popen([sys.executable, *args], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err,
                                preexec_fn=limit_memory, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        return proc.returncode, err.read(), usage.ru_maxrss / 1024  # ru_maxrss: KiB on Linux


def refused_in_one_line(result, expected):
    code, stderr, peak = result
    errors = [line for line in stderr.splitlines() if not line.startswith(("override:", "note:"))]
    assert code == 2 and len(errors) == 1 and "Traceback" not in stderr, stderr[-3000:]
    assert expected in errors[0], errors[0]
    assert peak < PEAK_MIB, f"peak {peak:.0f} MiB"


# --- pickles ----------------------------------------------------------------------------------------------

def memo_slot(slot):
    """9 bytes: protocol 4, an empty dict, LONG_BINPUT at slot, STOP. Python's unpickler grows its memo table
    past slot (2**27: 2.4 GB) before it reads the next opcode."""
    return b"\x80\x04}r" + struct.pack("<I", slot) + b"."


TINY = GPTConfig(block_size=16, vocab_size=64, n_layer=2, n_head=4, n_embd=32, bias=True)


def sampled_dataset(tmp_path, meta_pkl):
    """out/ckpt.pt of a model that reads its tokenizer from data/meta.pkl (nanoGPT's layout), which holds meta_pkl."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "meta.pkl").write_bytes(meta_pkl)
    (data / "train.bin").write_bytes(b"\0" * 64)
    (tmp_path / "out").mkdir()
    torch.save({"model": GPT(TINY).state_dict(), "model_args": checkpoint.model_args(TINY),
                "config": {"dataset": str(data)}}, tmp_path / "out" / "ckpt.pt")
    return tmp_path / "out"


def sharded_metadata(tmp_path, metadata):
    """out/ckpt.dcp whose .metadata holds metadata (its meta.pt as a sharded save writes it)."""
    directory = tmp_path / "out" / "ckpt.dcp"
    directory.mkdir(parents=True)
    torch.save({"model_args": checkpoint.model_args(TINY), "iter_num": 2}, directory / "meta.pt")
    (directory / ".metadata").write_bytes(metadata)
    return tmp_path / "out"


@pytest.mark.parametrize("slot", [1 << 27, 1 << 30])
def test_a_memo_slot_past_the_file_is_refused_before_unpickling(slot):
    with pytest.raises(UserError, match=f"memo slot {slot} at byte 3, after 2 opcodes"):
        load_pickle(memo_slot(slot), "meta.pkl", "re-run prepare.py")


@pytest.mark.parametrize("data, why", [
    (b"\x80\x04\x95" + struct.pack("<Q", 1 << 52) + b"}.", "a frame of 4,503,599,627,370,496 bytes at byte 2"),
    (b"\x80\x04\x8e" + struct.pack("<Q", 1 << 40) + b".", "expected 1099511627776 bytes in a bytes8, but only 1"),
    (b"\x80\x04X" + struct.pack("<I", 1 << 31) + b"ab.", "expected 2147483648 bytes in a unicodestring4"),
    (b"(p99\n.", "memo slot 99 at byte 1, after 1 opcodes")], ids=["frame", "bytes8", "unicode", "protocol 0 PUT"])
def test_a_length_past_the_file_is_refused_before_unpickling(data, why):
    with pytest.raises(UserError, match="its sizes are not backed by its bytes") as refusal:
        load_pickle(data, "x.pkl", "re-run prepare.py")
    assert why in str(refusal.value) and "\n" not in str(refusal.value)


def test_every_pickle_this_project_writes_reads_back():
    """The scan accepts what pickle writes, memo and frames included, in every protocol (independent: pickle
    itself made the bytes)."""
    chars = list("abc\n ")
    meta = {"vocab_size": 5, "itos": dict(enumerate(chars)), "stoi": {c: i for i, c in enumerate(chars)},
            "shared": [chars, chars], "big": "x" * 100_000}
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        assert load_pickle(pickle.dumps(meta, protocol), "meta.pkl", "") == meta


def test_a_hostile_meta_pkl_is_one_line_in_little_memory(tmp_path):
    out = sampled_dataset(tmp_path, memo_slot(1 << 27))
    refused_in_one_line(run_measured(["sample.py", f"--out_dir={out}", "--max_new_tokens=2"], tmp_path),
                        "meta.pkl: its sizes are not backed by its bytes (memo slot 134217728 at byte 3")


@pytest.mark.parametrize("program", ["sample.py", "consolidate.py"])
@pytest.mark.parametrize("slot", [1 << 27, 1 << 30])
def test_a_hostile_dcp_metadata_is_one_line_in_little_memory(tmp_path, program, slot):
    out = sharded_metadata(tmp_path, memo_slot(slot))
    refused_in_one_line(run_measured([program, f"--out_dir={out}"], tmp_path),
                        f".metadata: its sizes are not backed by its bytes (memo slot {slot} at byte 3")


# --- the zip of a torch checkpoint -----------------------------------------------------------------------

def zeros_deflated(nbytes):
    """(raw deflate stream, crc32) of nbytes zeros, made in little memory: after a full flush the compressor
    starts afresh, so each MiB of zeros is the same block."""
    mib = bytes(1 << 20)
    compressor = zlib.compressobj(9, zlib.DEFLATED, -15)
    compressor.compress(mib)
    compressor.flush(zlib.Z_FULL_FLUSH)
    block = compressor.compress(mib) + compressor.flush(zlib.Z_FULL_FLUSH)
    crc = 0
    for _ in range(nbytes >> 20):
        crc = zlib.crc32(mib, crc)
    return block * (nbytes >> 20) + compressor.flush(), crc


def write_zip(path, records):
    """A zip of (name, method, bytes written, size declared, crc) records, as a plain writer lays it out."""
    with open(path, "wb") as f:
        directory = []
        for name, method, data, size, crc in records:
            offset = f.tell()
            head = struct.pack("<IHHHHHIIIHH", 0x04034B50, 20, 0, method, 0, 0, crc, len(data), size, len(name), 0)
            f.write(head + name.encode() + data)
            directory.append(struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 20, 20, 0, method, 0, 0, crc, len(data),
                                         size, len(name), 0, 0, 0, 0, 0, offset) + name.encode())
        start = f.tell()
        f.write(b"".join(directory))
        f.write(struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, len(records), len(records), f.tell() - start, start, 0))


def with_inflating_record(path, nbytes):
    """Rewrite the checkpoint at path with one more key holding nbytes of zeros (a float tensor), deflated:
    torch.load inflates it whole before anything checks its tensors."""
    state = torch.load(path, weights_only=True)
    extra = torch.empty(nbytes // 4, device="meta")
    with torch.serialization.skip_data(), warnings.catch_warnings():  # the new checkpoint's layout and pickle
        warnings.simplefilter("ignore")  # "serializing tensors on the meta device ... is a no-op": the point
        torch.save({**state, "extra": extra}, path.with_suffix(".skip"))
    real, layout = zipfile.ZipFile(path), zipfile.ZipFile(path.with_suffix(".skip"))
    prefix = layout.namelist()[0].split("/")[0]
    key = len([n for n in real.namelist() if "/data/" in n])  # the new tensor's storage comes last
    records = []
    for info in layout.infolist():
        name = info.filename.split("/", 1)[1]
        data = real.read(f"{real.namelist()[0].split('/')[0]}/{name}") if name.startswith("data/") else \
            layout.read(info)
        records.append((info.filename, 0, data, len(data), zlib.crc32(data)))
    deflated, crc = zeros_deflated(nbytes)
    records.append((f"{prefix}/data/{key}", 8, deflated, nbytes, crc))
    write_zip(path, records)
    os.remove(path.with_suffix(".skip"))


@pytest.fixture(scope="module")
def trained_out(tmp_path_factory):
    """out_dir of a 2-iteration run on a small char dataset."""
    from data.prepare import prepare
    from train import TrainConfig, train
    root = tmp_path_factory.mktemp("sizes")
    (root / "input.txt").write_text(CORPUS, encoding="utf-8")
    prepare(str(root / "input.txt"), "char", str(root / "data"), 0.1, log=lambda *a: None)
    cfg = TrainConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, batch_size=4, gradient_accumulation_steps=1,
                      eval_iters=2, device="cpu", max_iters=2, eval_interval=2, dataset=str(root / "data"),
                      out_dir=str(root / "out"))
    train(cfg, log=lambda *a: None)
    return root


@pytest.mark.parametrize("program", [["sample.py", "--max_new_tokens=2"], ["train.py", "--init_from=resume",
                                                                          "--max_iters=3"]], ids=["sample", "resume"])
def test_a_record_inflating_past_the_file_is_one_line_in_little_memory(trained_out, tmp_path, program):
    """A 2.4 MB checkpoint holding 2 GiB of zeros under an extra key, deflated."""
    out = tmp_path / "out"
    shutil.copytree(trained_out / "out", out)
    with_inflating_record(out / "ckpt.pt", 2 << 30)
    assert os.path.getsize(out / "ckpt.pt") < 3 << 20
    refused_in_one_line(run_measured([*program, f"--out_dir={out}"], tmp_path),
                        f"refusing to load {out / 'ckpt.pt'}: its zip records inflate to 2,147,")


def test_the_zip_check_passes_every_checkpoint_torch_writes(trained_out, tmp_path):
    """Independent of the check: torch.save's own files, big records and small, stored as torch writes them."""
    from nanogpt.checkpoint import read_tensors
    state = torch.load(trained_out / "out" / "ckpt.pt", weights_only=True)
    assert read_tensors(str(trained_out / "out" / "ckpt.pt")).keys() == state.keys()
    torch.save({"big": torch.randn(1 << 18), "empty": torch.zeros(0), "n": 3}, tmp_path / "x.pt")
    assert read_tensors(str(tmp_path / "x.pt"))["big"].shape == (1 << 18,)


@pytest.mark.parametrize("damage, why", [
    (lambda records: [(n, m, d, s + 1 if n.endswith("data/0") else s, c) for n, m, d, s, c in records],
     "is stored uncompressed in"),
    (lambda records: records + [("archive/data/9", 8, b"\x03\x00", 1 << 31, 0)], "inflate to 2,147,"),
], ids=["stored record longer than its bytes", "deflated record"])
def test_a_record_declaring_more_than_its_bytes_is_refused(tmp_path, damage, why):
    from nanogpt.checkpoint import read_tensors
    torch.save({"w": torch.randn(64)}, tmp_path / "ok.pt")
    real = zipfile.ZipFile(tmp_path / "ok.pt")
    records = [(i.filename, 0, real.read(i), i.file_size, i.CRC) for i in real.infolist()]
    write_zip(tmp_path / "rebuilt.pt", records)
    assert torch.equal(read_tensors(str(tmp_path / "rebuilt.pt"))["w"], torch.load(tmp_path / "ok.pt")["w"])
    write_zip(tmp_path / "bad.pt", damage(records))
    with pytest.raises(UserError, match="refusing to load .*bad.pt: its zip record") as refusal:
        read_tensors(str(tmp_path / "bad.pt"))
    assert why in str(refusal.value)


# --- a Llama or Qwen3 directory's config.json --------------------------------------------------------------

@pytest.fixture(scope="module", params=["llama", "qwen3"])
def llama_dir(request, tmp_path_factory):
    """A small LlamaForCausalLM or Qwen3ForCausalLM, every parameter random (Qwen3's q/k gains stay ones: ours
    has none), saved as a Hugging Face directory."""
    transformers = pytest.importorskip("transformers")
    common = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=8, max_position_embeddings=64, rms_norm_eps=1e-5,
                  tie_word_embeddings=False)
    if request.param == "llama":
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**common))
    else:
        model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**common))
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not name.endswith(("q_norm.weight", "k_norm.weight")):
                p.copy_(torch.randn(p.shape, generator=g) * (0.1 if p.dim() == 1 else 0.3) + (p.dim() == 1))
    path = tmp_path_factory.mktemp("hf") / request.param
    model.save_pretrained(path)
    return path, model.eval()


def edited(llama_dir, tmp_path, **changes):
    import json
    path = tmp_path / "edited"
    shutil.copytree(llama_dir[0], path)
    config = json.loads((path / "config.json").read_text())
    if "num_hidden_layers" in changes:
        config.pop("layer_types", None)  # Qwen3's list of layers, which transformers compares with the claim
    (path / "config.json").write_text(json.dumps({**config, **changes}))
    return str(path)


def test_a_llama_directory_loads_and_computes_transformers_logits(llama_dir):
    """The check passes what transformers writes: the same logits as transformers' own model (independent)."""
    from nanogpt.interop.hf import load_pretrained
    model = load_pretrained(str(llama_dir[0])).eval()
    idx = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(model(idx, targets=idx)[0], llama_dir[1](idx).logits, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("changes, expected", [
    (dict(num_attention_heads=0), "num_attention_heads is 0, expected at least 1"),
    (dict(num_key_value_heads=0), "num_key_value_heads is 0, expected at least 1"),
    (dict(head_dim=0), "head_dim is 0, expected at least 1"),
    (dict(hidden_size="32"), "hidden_size is '32', expected int"),
    (dict(vocab_size=True), "vocab_size is True, expected int"),
    (dict(rms_norm_eps=1), "rms_norm_eps is 1, expected float"),
    (dict(num_attention_heads=3), ("The hidden size (32) is not a multiple of the number of attention heads (3)",
                                   "head_dim=8 with 3 heads of width 32: model.py cannot compute this model")),
    (dict(max_position_embeddings=1 << 24), "max_position_embeddings=16777216, beyond 1048576 positions"),
    (dict(max_position_embeddings=10 ** 15), "max_position_embeddings=1000000000000000, beyond 1048576"),
    (dict(num_hidden_layers=10 ** 9), "config.json claims n_layer=1000000000 but the weights hold 2 blocks"),
    (dict(intermediate_size=4096), "weights do not match its config.json (model.layers.0.mlp.down_proj.weight has "
                                   "shape (32, 48), config.json make it (32, 4096)"),
    (dict(hidden_size=64, head_dim=16), "model.embed_tokens.weight has shape (64, 32), config.json make it (64, 64)"),
], ids=lambda v: str(v) if isinstance(v, dict) else "")
def test_a_llama_config_json_is_checked_before_anything_is_built(llama_dir, tmp_path, monkeypatch, changes, expected):
    """Each in one line, before any model is built (GPT off the meta device) or any weight is read."""
    from nanogpt.interop import llama
    from nanogpt.interop.hf import load_pretrained
    real = llama.GPT

    def guarded(config):
        assert torch.get_default_device().type == "meta", "a model was built from config.json's claims"
        return real(config)
    monkeypatch.setattr(llama, "GPT", guarded)
    monkeypatch.setattr(llama, "safetensors_state", lambda directory: pytest.fail("weights read before the check"))
    with pytest.raises(UserError) as refusal:
        load_pretrained(edited(llama_dir, tmp_path, **changes))
    expected = expected if isinstance(expected, tuple) else (expected,)  # transformers' check or ours
    assert any(e in str(refusal.value) for e in expected) and "\n" not in str(refusal.value), str(refusal.value)


def test_a_llama_config_claiming_a_billion_layers_is_one_line_in_sample_py(llama_dir, tmp_path):
    path = edited(llama_dir, tmp_path, num_hidden_layers=10 ** 9)
    refused_in_one_line(run_measured(["sample.py", f"--init_from={path}", "--max_new_tokens=2"], tmp_path),
                        "config.json claims n_layer=1000000000 but the weights hold 2 blocks")


def test_only_pickles_py_unpickles_or_calls_torch_load():
    """A new reader of a pickle or a checkpoint goes through load_pickle or torch_load, whose size checks
    would otherwise be skipped: any other call of torch.load or subclass of an Unpickler fails here."""
    import ast

    from test_imports import FILES
    found = []
    for module, path in FILES.items():
        if module == "nanogpt.pickles":
            continue
        for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
            names = [ast.unparse(b) for b in node.bases] if isinstance(node, ast.ClassDef) else \
                [ast.unparse(node.func)] if isinstance(node, ast.Call) else []
            found += [f"{module}: {n}" for n in names if n.endswith(("Unpickler", "torch.load", "pickle.load",
                                                                      "pickle.loads"))]
    assert not found, found
