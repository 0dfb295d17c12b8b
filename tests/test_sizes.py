"""Sizes a file declares are checked against what it holds before anything is allocated from them: pickles
(memo slots, lengths, frames) and the records of a checkpoint's zip.

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

