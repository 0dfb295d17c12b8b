"""FSDP2 through torchrun (gloo on CPU): one process's result, sharded checkpoints, any world size."""
import json
import operator
import os
import pickle
import shutil
import socket
import subprocess
import sys

import pytest
import torch

from configurator import UserError
from conftest import ROOT, run_script
from nanogpt.checkpoint import load_checkpoint, read_sharded
from nanogpt.out_dir import OutDirLock
from test_ddp import TINY
from train import TrainConfig, train

FSDP = dict(TINY, parallel="fsdp", gradient_accumulation_steps=2)


def torchrun(*args, nproc=2, timeout=120):
    launcher = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", "train.py"]
    result = run_script(launcher + [f"--{k}={v}" for k, v in FSDP.items()] + list(args), timeout=timeout)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def one_process(tmp_path, name, **overrides):
    """train() in this process with one thread, as torchrun's workers run: sums in the same order."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return train(TrainConfig(**{**FSDP, **overrides, "out_dir": str(tmp_path / name)}), overrides, log=lambda *a: None)
    finally:
        torch.set_num_threads(threads)


def records(out_dir, kind):
    return [r for r in map(json.loads, open(out_dir / "log.jsonl")) if r["kind"] == kind]


def weights(out_dir):
    return load_checkpoint(str(out_dir / "ckpt.pt"))["model"]  # the sharded form where it is the latest


def assert_same_run(a, b, atol=1e-5):
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys()
    for key, value in wa.items():
        torch.testing.assert_close(wb[key], value, atol=atol, rtol=0, msg=key)
    la, lb = ([(r["iter"], r["loss"]) for r in records(out, "train")] for out in (a, b))
    assert [i for i, _ in la] == [i for i, _ in lb] and la, (la, lb)
    for (i, x), (_, y) in zip(la, lb):
        assert abs(x - y) < atol, (i, x, y)


@pytest.mark.parametrize("options", [
    dict(optimizer="adamw"),
    dict(optimizer="muon", activation_checkpointing=True),  # Muon gathers each sharded matrix
], ids=["adamw", "muon-activation-checkpointing"])
def test_two_sharded_processes_equal_one_process(tmp_path, char_dataset, options):
    args = [f"--{k}={v}" for k, v in options.items()]
    result = torchrun(f"--dataset={char_dataset}", f"--out_dir={tmp_path / 'fsdp'}", *args)
    assert "2 processes" in result.stdout
    assert sorted(os.listdir(tmp_path / "fsdp" / "ckpt.dcp")) == [".metadata", "__0_0.distcp", "__1_0.distcp",
                                                                  "meta.pt"]
    one_process(tmp_path, "one", dataset=str(char_dataset), parallel="ddp", **options)
    assert_same_run(tmp_path / "fsdp", tmp_path / "one")
    sharded, whole = records(tmp_path / "fsdp", "memory")[0], records(tmp_path / "one", "memory")[0]
    for part in ("params", "grads", "optimizer"):  # each process holds about half (the shards are padded)
        assert 0.45 * whole[part] < sharded[part] < 0.6 * whole[part], (part, sharded, whole)


def test_sharded_resume_is_exact_with_the_same_world_size(tmp_path, char_dataset):
    common = [f"--dataset={char_dataset}", "--dropout=0.1", "--optimizer=muon"]
    torchrun(*common, f"--out_dir={tmp_path / 'a'}")
    torchrun(*common, f"--out_dir={tmp_path / 'b'}", "--max_iters=3")
    torchrun(f"--out_dir={tmp_path / 'b'}", "--init_from=resume")
    a, b = weights(tmp_path / "a"), weights(tmp_path / "b")
    for key, value in a.items():
        assert torch.equal(value, b[key]), key
    assert [r["loss"] for r in records(tmp_path / "a", "train")] == [r["loss"] for r in records(tmp_path / "b", "train")]


def test_sharded_resume_crosses_world_sizes(tmp_path, char_dataset):
    """2 processes -> 1 and 1 -> 2 continue the run one process makes straight through (dropout off)."""
    one_process(tmp_path, "straight", dataset=str(char_dataset), parallel="ddp")
    torchrun(f"--dataset={char_dataset}", f"--out_dir={tmp_path / 'two_one'}", "--max_iters=3")
    one_process(tmp_path, "two_one", init_from="resume", max_iters=5)
    assert_same_run(tmp_path / "straight", tmp_path / "two_one")

    one_process(tmp_path, "one_two", dataset=str(char_dataset), max_iters=3)  # fsdp in one process: one shard
    assert os.listdir(tmp_path / "one_two" / "ckpt.dcp").count("__0_0.distcp") == 1
    torchrun(f"--out_dir={tmp_path / 'one_two'}", "--init_from=resume", "--max_iters=5")
    assert_same_run(tmp_path / "straight", tmp_path / "one_two")


def test_a_single_file_checkpoint_resumes_sharded(tmp_path, char_dataset):
    one_process(tmp_path, "straight", dataset=str(char_dataset), parallel="ddp", optimizer="muon")
    one_process(tmp_path, "moved", dataset=str(char_dataset), parallel="ddp", optimizer="muon", max_iters=3)
    torchrun(f"--out_dir={tmp_path / 'moved'}", "--init_from=resume", "--parallel=fsdp")
    assert not os.path.exists(tmp_path / "moved" / "ckpt.pt")  # replaced by its newer, sharded form
    assert_same_run(tmp_path / "straight", tmp_path / "moved")


def test_readers_take_a_sharded_checkpoint_and_fsdp_py_writes_one_file(tmp_path, char_dataset):
    out = tmp_path / "fsdp"
    torchrun(f"--dataset={char_dataset}", f"--out_dir={out}")
    sample = ["sample.py", f"--out_dir={out}", "--temperature=0", "--max_new_tokens=40", "--start=the"]
    sharded_text = run_script(sample)
    assert sharded_text.returncode == 0, sharded_text.stderr
    trace = run_script(["trace.py", f"--out_dir={out}", "--start=the", "--steps=1"])
    assert trace.returncode == 0 and "attention" in trace.stdout, trace.stderr
    pytest.importorskip("transformers")
    export = run_script(["export.py", f"--out_dir={out}", f"--hf_dir={tmp_path / 'hf'}"])
    assert export.returncode == 0 and (tmp_path / "hf" / "model.safetensors").exists(), export.stderr
    eval_only = one_process(tmp_path, "fsdp", init_from="resume", eval_only=True)
    assert eval_only["val_loss"] == pytest.approx(records(out, "eval")[-1]["val_loss"], abs=1e-6)

    sharded = load_checkpoint(str(out / "ckpt.pt"))
    assert sharded["sharded"] == str(out / "ckpt.dcp")
    result = run_script(["consolidate.py", f"--out_dir={out}"])
    assert result.returncode == 0, result.stderr
    ckpt = torch.load(out / "ckpt.pt", weights_only=True)  # nanoGPT's way of reading it
    assert {"model", "optimizer", "model_args", "iter_num", "best_val_loss", "config"} <= set(ckpt)
    assert ckpt["iter_num"] == 5 and len(ckpt["optimizer"]["state"]) == len(list(ckpt["model"])) - 1  # tied head
    assert "sharded" not in load_checkpoint(str(out / "ckpt.pt"))  # the single file is now the latest form
    shutil.rmtree(out / "ckpt.dcp")
    assert run_script(sample).stdout == sharded_text.stdout
    for key, value in ckpt["model"].items():
        assert torch.equal(value, sharded["model"][key])


def test_a_missing_shard_is_one_line_and_nothing_is_lost(tmp_path, char_dataset):
    out = tmp_path / "fsdp"
    one_process(tmp_path, "fsdp", dataset=str(char_dataset), max_iters=2)
    os.remove(out / "ckpt.dcp" / "__0_0.distcp")
    kept = sorted(os.listdir(out / "ckpt.dcp"))
    for args in (["sample.py", f"--out_dir={out}"], ["train.py", f"--out_dir={out}", "--init_from=resume"]):
        result = run_script(args)
        assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
        errors = [line for line in result.stderr.splitlines() if not line.startswith("override:")]
        assert len(errors) == 1 and "a shard is missing or damaged" in errors[0], errors
    assert sorted(os.listdir(out / "ckpt.dcp")) == kept


def test_fsdp_refuses_float16(tmp_path, char_dataset):
    from configurator import UserError
    with pytest.raises(UserError, match="not float16"):
        one_process(tmp_path, "o", dataset=str(char_dataset), dtype="float16")


def test_a_save_interrupted_between_renames_is_repaired_by_the_next_writer(tmp_path):
    """A kill between moving the old checkpoint aside and renaming the new one in leaves .ckpt.dcp.old alone."""
    (tmp_path / ".ckpt.dcp.old").mkdir()
    (tmp_path / ".ckpt.dcp.old" / "meta.pt").write_text("old")
    (tmp_path / ".ckpt.dcp.tmp").mkdir()
    (tmp_path / ".best.dcp.old").mkdir()
    (tmp_path / "best.dcp").mkdir()
    lock = OutDirLock(str(tmp_path)).acquire()
    lock.release()
    assert (tmp_path / "ckpt.dcp" / "meta.pt").read_text() == "old"
    assert sorted(os.listdir(tmp_path)) == [".lock", "best.dcp", "ckpt.dcp"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_nodes_on_localhost_equal_one_process(tmp_path, char_dataset):
    """docs/fsdp.md's multi-node command: one torchrun agent per node, rendezvous over c10d."""
    port = free_port()
    args = [f"--{k}={v}" for k, v in FSDP.items()] + [f"--dataset={char_dataset}", f"--out_dir={tmp_path / 'nodes'}"]
    agents = [subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=1",
                                f"--node_rank={node}", "--rdzv_backend=c10d", f"--rdzv_endpoint=127.0.0.1:{port}",
                                "--rdzv_id=test", "train.py", *args], cwd=ROOT, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True) for node in (0, 1)]
    outputs = [agent.communicate(timeout=180) for agent in agents]
    assert all(agent.returncode == 0 for agent in agents), [err[-2000:] for _, err in outputs]
    assert sum("2 processes" in out for out, _ in outputs) == 1  # the global rank 0 alone reports
    one_process(tmp_path, "one", dataset=str(char_dataset), parallel="ddp")
    assert_same_run(tmp_path / "nodes", tmp_path / "one")


def test_a_rank_failing_keeps_the_last_sharded_checkpoint(tmp_path, char_dataset):
    out = tmp_path / "o"
    launcher = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "tests/ddp_fail_rank.py"]
    result = run_script(launcher + [f"--{k}={v}" for k, v in FSDP.items()]
                        + [f"--dataset={char_dataset}", f"--out_dir={out}", "--max_iters=1000", "--eval_interval=2"],
                        timeout=120)
    assert result.returncode != 0 and "rank 1 failed on purpose" in result.stderr + result.stdout
    assert load_checkpoint(str(out / "ckpt.pt"))["iter_num"] == 2


def test_fsdp_in_one_process_says_there_is_nothing_to_shard(tmp_path, char_dataset):
    lines = []
    train(TrainConfig(**{**FSDP, "max_iters": 1}, dataset=str(char_dataset), out_dir=str(tmp_path / "o")),
          log=lines.append)
    assert any("nothing to shard" in line for line in lines), lines
    assert os.path.isdir(tmp_path / "o" / "ckpt.dcp") and not os.path.exists(tmp_path / "o" / "ckpt.pt")


def test_activation_checkpointing_without_fsdp_follows_the_plain_run(tmp_path, char_dataset, monkeypatch):
    """Recomputing each Block in backward (dropout included: its RNG state is replayed) changes nothing."""
    from nanogpt.training import sharding
    calls, real = [], sharding.checkpoint
    monkeypatch.setattr(sharding, "checkpoint", lambda *a, **k: calls.append(1) or real(*a, **k))
    for name, on in (("plain", False), ("recomputed", True)):
        one_process(tmp_path, name, dataset=str(char_dataset), parallel="ddp", dropout=0.1, activation_checkpointing=on)
    assert len(calls) >= 2 * 5 * 2  # 2 Blocks x 5 iters x 2 micro-batches went through torch.utils.checkpoint
    assert_same_run(tmp_path / "plain", tmp_path / "recomputed", atol=1e-6)


class RunsCodeThenReturns:
    """Unpickling this creates the directory marker, then returns obj: what a hostile .metadata would do."""

    def __init__(self, marker, obj):
        self.marker, self.obj = marker, obj

    def __reduce__(self):
        return operator.itemgetter(1), ((MakesDirectory(self.marker), self.obj),)


class MakesDirectory:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.makedirs, (self.marker, 0o777, True)


def poison_metadata(directory, marker):
    """directory/.metadata, rewritten to run code and then give the genuine metadata."""
    genuine = pickle.loads((directory / ".metadata").read_bytes())  # trusted: this test wrote it
    (directory / ".metadata").write_bytes(pickle.dumps(RunsCodeThenReturns(str(marker), genuine)))


READERS = {
    "sample.py": ["sample.py", "--max_new_tokens=5", "--num_samples=1"],
    "serve.py": ["serve.py", "--port=0"],
    "trace.py": ["trace.py", "--start=the", "--steps=1"],
    "export.py": ["export.py", "--hf_dir={tmp}/hf"],
    "consolidate.py": ["consolidate.py"],
    "train.py resume": ["train.py", "--init_from=resume", "--max_iters=4"],
}


@pytest.mark.parametrize("reader", READERS)
def test_a_sharded_checkpoint_whose_metadata_runs_code_is_refused_by_every_reader(tmp_path, char_dataset, reader):
    out, marker = tmp_path / "o", tmp_path / "pwned"
    one_process(tmp_path, "o", dataset=str(char_dataset), max_iters=2)
    poison_metadata(out / "ckpt.dcp", marker)
    before = sorted(os.listdir(out))
    args = [a.format(tmp=tmp_path) for a in READERS[reader]] + [f"--out_dir={out}"]
    result = run_script(args, timeout=120)
    assert not marker.exists()
    errors = [line for line in result.stderr.splitlines() if not line.startswith("override:")]
    assert result.returncode == 2 and len(errors) == 1, result.stderr[-3000:]
    assert f"refusing to load {out / 'ckpt.dcp' / '.metadata'}: it holds objects other than checkpoint metadata" \
           f" (operator.itemgetter)" in errors[0]
    assert sorted(os.listdir(out)) == before and not (tmp_path / "hf").exists()


def test_sharded_processes_refuse_metadata_that_runs_code(tmp_path, char_dataset):
    out, marker = tmp_path / "o", tmp_path / "pwned"
    one_process(tmp_path, "o", dataset=str(char_dataset), max_iters=2)
    poison_metadata(out / "ckpt.dcp", marker)
    launcher = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "train.py"]
    result = run_script(launcher + [f"--out_dir={out}", "--init_from=resume", "--max_iters=4"], timeout=120)
    assert result.returncode != 0 and not marker.exists()
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]  # one line per process
    assert errors and all("refusing to load" in line for line in errors), result.stderr[-3000:]
    assert "checkpoint.py" not in result.stderr  # torchrun's traceback alone: none from a process


def test_the_metadata_reader_refuses_code_even_where_dcp_load_reads_it(tmp_path, char_dataset):
    """dcp.load reads .metadata itself: through the allow-listed reader, one swapped in after the check runs nothing."""
    from nanogpt.dcp import dcp_load
    out, marker = tmp_path / "o", tmp_path / "pwned"
    one_process(tmp_path, "o", dataset=str(char_dataset), max_iters=2)
    ckpt = read_sharded(str(out / "ckpt.dcp"), weights=True)
    poison_metadata(out / "ckpt.dcp", marker)
    with pytest.raises(UserError, match="refusing to load .*metadata: it holds objects other than checkpoint metadata"):
        dcp_load({"model": ckpt["model"]}, str(out / "ckpt.dcp"))
    assert not marker.exists()


def test_readers_and_fsdp_py_take_the_visible_checkpoint_not_one_moved_aside(tmp_path, char_dataset):
    """A newer .ckpt.dcp.old beside ckpt.pt (what a save interrupted between its renames leaves) is not what
    the user sees: sample.py and consolidate.py take ckpt.pt, which stays as it is."""
    out = tmp_path / "o"
    one_process(tmp_path, "o", dataset=str(char_dataset), parallel="ddp", max_iters=2)
    sample = ["sample.py", f"--out_dir={out}", "--temperature=0", "--max_new_tokens=20", "--start=the"]
    visible = run_script(sample)
    one_process(tmp_path, "other", dataset=str(char_dataset), max_iters=4, learning_rate=0.05)  # other weights
    os.replace(tmp_path / "other" / "ckpt.dcp", out / ".ckpt.dcp.old")  # its meta.pt is newer than ckpt.pt
    before = (out / "ckpt.pt").read_bytes()
    ckpt = load_checkpoint(str(out / "ckpt.pt"))
    assert "sharded" not in ckpt and ckpt["iter_num"] == 2
    assert run_script(sample).stdout == visible.stdout
    result = run_script(["consolidate.py", f"--out_dir={out}"])
    assert result.returncode == 2 and "is already a single file" in result.stderr, result.stderr
    assert (out / "ckpt.pt").read_bytes() == before and (out / ".ckpt.dcp.old" / "meta.pt").exists()


def test_resume_puts_back_a_checkpoint_an_interrupted_save_moved_aside(tmp_path, char_dataset):
    """Alone, .ckpt.dcp.old is the checkpoint: readers say so and touch nothing; the next writer puts it back."""
    out = tmp_path / "o"
    one_process(tmp_path, "o", dataset=str(char_dataset), max_iters=2)
    os.replace(out / "ckpt.dcp", out / ".ckpt.dcp.old")  # killed between save_sharded's two renames
    result = run_script(["sample.py", f"--out_dir={out}"])
    assert result.returncode == 2 and "a save was interrupted" in result.stderr, result.stderr
    assert "--init_from=resume" in result.stderr
    assert (out / ".ckpt.dcp.old" / "meta.pt").exists() and not (out / "ckpt.dcp").exists()
    one_process(tmp_path, "o", init_from="resume", max_iters=3)
    assert load_checkpoint(str(out / "ckpt.pt"))["iter_num"] == 3
    assert [r["iter"] for r in records(out, "train")] == [1, 2, 3]


def test_fsdp_py_refuses_an_out_dir_another_writer_holds(tmp_path, char_dataset):
    out = tmp_path / "o"
    one_process(tmp_path, "o", dataset=str(char_dataset), max_iters=2)
    before = sorted(os.listdir(out))
    lock = OutDirLock(str(out)).acquire()  # a run training there
    try:
        result = run_script(["consolidate.py", f"--out_dir={out}"])
    finally:
        lock.release()
    errors = [line for line in result.stderr.splitlines()]
    assert result.returncode == 2 and len(errors) == 1, result.stderr
    assert f"{out} is in use by train.py (pid {os.getpid()} on" in errors[0]
    assert sorted(os.listdir(out)) == before  # no ckpt.pt written
    assert run_script(["consolidate.py", f"--out_dir={out}"]).returncode == 0


def by_value(consolidated, source):
    """{parameter name: (optimizer, index)}: each entry of the sharded source's optimizer state (keyed by name)
    matched to the one entry of the single file's (keyed by index) holding the same tensors."""
    parts = [(None, consolidated)] if "state" in consolidated else list(consolidated.items())
    entries = {(part, i): s for part, opt in parts for i, s in opt["state"].items()}
    match = {}
    for name, s in source["state"].items():
        same = [key for key, t in entries.items()
                if t.keys() == s.keys() and all(torch.equal(torch.as_tensor(t[k]), torch.as_tensor(s[k])) for k in s)]
        assert len(same) == 1, (name, same)
        match[name] = same[0]
    assert sorted(match.values(), key=str) == sorted(entries, key=str)  # one to one, nothing left over
    groups = [{**g, "params": {(part, i) for i in g["params"]}} for part, opt in parts for g in opt["param_groups"]]
    return match, groups


@pytest.mark.parametrize("options", [dict(embedding_lr=0.02, value_embeds=1),
                                     dict(optimizer="muon", embedding_lr=0.02, pos_emb="rope")],
                         ids=["adamw-embedding_lr-value_embeds", "muon-embedding_lr-rope"])
def test_fsdp_py_keeps_every_optimizer_value_and_group_and_its_file_resumes_exactly(tmp_path, char_dataset, options):
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    out = tmp_path / "cut"
    torchrun(f"--dataset={char_dataset}", f"--out_dir={out}", "--max_iters=3",
             *(f"--{k}={v}" for k, v in options.items()))
    dcp_to_torch_save(str(out / "ckpt.dcp"), str(tmp_path / "source.pt"))  # DCP's own reading of every shard
    source = torch.load(tmp_path / "source.pt", weights_only=True)["optimizer"]
    assert run_script(["consolidate.py", f"--out_dir={out}"]).returncode == 0
    consolidated = torch.load(out / "ckpt.pt", weights_only=True)["optimizer"]
    match, groups = by_value(consolidated, source)
    # embeddings: their own group; Muon with a tied head and no position table leaves AdamW no decayed matrix
    assert len(groups) == len(source["param_groups"]) == 3
    assert all(g["params"] for g in groups)
    for group in source["param_groups"]:
        twin = [g for g in groups if g["params"] == {match[name] for name in group["params"]}]
        assert len(twin) == 1 and {k: v for k, v in twin[0].items() if k != "params"} == \
            {k: v for k, v in group.items() if k != "params"}, (group, twin)
    shutil.rmtree(out / "ckpt.dcp")  # resume from the single file alone
    one_process(tmp_path, "cut", init_from="resume", parallel="ddp", max_iters=5)
    one_process(tmp_path, "straight", dataset=str(char_dataset), parallel="ddp", **options)
    assert_same_run(tmp_path / "straight", out)


def test_sharded_sizes_claimed_beyond_the_shard_files_allocate_nothing(tmp_path, char_dataset, monkeypatch):
    """meta.pt's model_args and .metadata's sizes agree on a model 32 times wider than the shards hold."""
    from model import GPT, GPTConfig
    from nanogpt import memory
    out = tmp_path / "o"
    one_process(tmp_path, "o", dataset=str(char_dataset), max_iters=2)
    meta = torch.load(out / "ckpt.dcp" / "meta.pt", weights_only=True)
    meta["model_args"].update(n_embd=1024, n_head=2)
    torch.save(meta, out / "ckpt.dcp" / "meta.pt")
    with torch.device("meta"):
        shapes = {k: v.shape for k, v in GPT(GPTConfig(**meta["model_args"])).state_dict().items()}
    metadata = pickle.loads((out / "ckpt.dcp" / ".metadata").read_bytes())  # trusted: this test wrote it
    for key, entry in metadata.state_dict_metadata.items():
        if key.startswith("model."):
            entry.size = shapes[key[len("model."):]]
    (out / "ckpt.dcp" / ".metadata").write_bytes(pickle.dumps(metadata))

    def must_not_allocate(*args, **kwargs):
        raise AssertionError("about to allocate from claimed sizes")
    monkeypatch.setattr(memory, "check_fits", must_not_allocate)  # called just before the weights are allocated
    with pytest.raises(UserError, match=r"a shard is missing or damaged \(the metadata claims [0-9,]+ bytes of "
                                        r"weights, the shard files hold [0-9,]+\)"):
        read_sharded(str(out / "ckpt.dcp"))


@pytest.mark.parametrize("damage", [dict(optimizer="sgd"), dict(learning_rate=None)], ids=["optimizer-sgd", "no-learning_rate"])
def test_fsdp_py_refuses_a_saved_config_that_describes_no_optimizer(tmp_path, char_dataset, damage):
    """consolidate.py builds the optimizer from the checkpoint's config (train.py's own): a config that cannot build one
    is a one-line error naming the file, and nothing is written."""
    from consolidate import consolidate
    out = tmp_path / "o"
    one_process(tmp_path, "o", dataset=str(char_dataset), max_iters=1)
    meta = torch.load(out / "ckpt.dcp" / "meta.pt", weights_only=True)
    meta["config"].update(damage)
    meta["config"] = {k: v for k, v in meta["config"].items() if v is not None}
    torch.save(meta, out / "ckpt.dcp" / "meta.pt")
    with pytest.raises(UserError, match=r"ckpt.pt: its config does not describe an optimizer \((KeyError|ValueError)"):
        consolidate(str(out / "ckpt.pt"))
    assert not (out / "ckpt.pt").exists()


@pytest.mark.parametrize("damage", ["negative size", "size not a Size", "no dtype", "entries not a dict"])
def test_metadata_of_allowed_classes_with_damaged_values_is_one_line(tmp_path, char_dataset, damage):
    """.metadata builds only DCP's classes, but with whatever values a file gives them: a negative or non-Size
    weight size, properties without a dtype, or entries that are not a dict are refused in one line before
    any tensor is made from them."""
    import pickle

    out = tmp_path / "o"
    one_process(tmp_path, "o", dataset=str(char_dataset), max_iters=2)
    path = out / "ckpt.dcp" / ".metadata"
    metadata = pickle.loads(path.read_bytes())  # trusted: the test's own checkpoint
    entry = metadata.state_dict_metadata["model.transformer.wte.weight"]
    if damage == "negative size":
        entry.size = torch.Size([-64, *entry.size[1:]])
    elif damage == "size not a Size":
        entry.size = (3, 4)
    elif damage == "no dtype":
        entry.properties = None
    else:
        metadata.state_dict_metadata = [1, 2]
    path.write_bytes(pickle.dumps(metadata))
    with pytest.raises(UserError, match=r"\.metadata\) is damaged|missing or damaged"):
        read_sharded(str(out / "ckpt.dcp"), weights=False)
    result = run_script(["sample.py", f"--out_dir={out}", "--max_new_tokens=5", "--num_samples=1"])
    errors = [line for line in result.stderr.splitlines() if not line.startswith("override:")]
    assert result.returncode == 2 and len(errors) == 1 and "damaged" in errors[0], result.stderr[-2000:]
