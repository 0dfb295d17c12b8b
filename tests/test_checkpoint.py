"""Checkpoints survive: atomic writes, kills, interrupts, divergence, untrusted files, nanoGPT's format."""
import errno
import io
import json
import os
import pickle
import signal
import subprocess
import sys
import time

import pytest
import torch

from configurator import UserError, parse_args
from conftest import ROOT, optimizer_settings, run_script
from model import GPT, GPTConfig
from nanogpt import checkpoint, out_dir
from nanogpt.checkpoint import load_checkpoint, save_checkpoint
from nanogpt.tokenizer import read_meta
from nanogpt.training.optim import configure_optimizers
from train import TrainConfig, train

TINY = dict(n_layer=2, n_head=2, n_embd=32, block_size=16, batch_size=4, gradient_accumulation_steps=1,
            eval_iters=2, device="cpu", log_interval=1)


class RunsCode:
    """Unpickling this calls os.mkdir(marker): what a malicious file would do."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


def test_malicious_checkpoint_is_refused_and_runs_nothing(tmp_path):
    marker = str(tmp_path / "pwned")
    state = {"model": {"w": torch.zeros(1)}, "model_args": {}, "payload": RunsCode(marker)}
    (tmp_path / "out").mkdir()
    torch.save(state, tmp_path / "out" / "ckpt.pt")
    with pytest.raises(UserError, match="refusing to load"):
        load_checkpoint(str(tmp_path / "out" / "ckpt.pt"))
    result = run_script(["sample.py", f"--out_dir={tmp_path / 'out'}"])
    assert result.returncode == 2 and "refusing to load" in result.stderr
    assert not os.path.exists(marker)


def test_malicious_meta_pkl_is_refused_and_runs_nothing(tmp_path):
    marker = str(tmp_path / "pwned")
    (tmp_path / "meta.pkl").write_bytes(pickle.dumps({"vocab_size": 3, "itos": RunsCode(marker)}))
    with pytest.raises(UserError, match="not plain data"):
        read_meta(str(tmp_path))
    assert not os.path.exists(marker)


def test_legacy_meta_pkl_with_plain_data_loads(tmp_path):
    chars = ["\n", " ", "a"]
    (tmp_path / "meta.pkl").write_bytes(pickle.dumps(
        {"vocab_size": 3, "itos": dict(enumerate(chars)), "stoi": {c: i for i, c in enumerate(chars)}}))
    assert read_meta(str(tmp_path))["itos"] == {0: "\n", 1: " ", 2: "a"}


def test_failed_save_leaves_the_old_checkpoint(tmp_path, monkeypatch):
    path = str(tmp_path / "ckpt.pt")
    save_checkpoint({"model": {"w": torch.ones(3)}, "model_args": {}}, path)
    before = open(path, "rb").read()

    def broken_save(obj, f):
        f.write(b"half a checkpoint")
        raise OSError("disk full")
    monkeypatch.setattr(checkpoint.torch, "save", broken_save)
    with pytest.raises(UserError, match="saving .*ckpt.pt failed: .*disk full.*; the previous one is intact"):
        save_checkpoint({"model": {"w": torch.zeros(3)}, "model_args": {}}, path)
    assert open(path, "rb").read() == before
    assert os.listdir(tmp_path) == ["ckpt.pt"]


class FillingFile(io.FileIO):
    """A file on a disk that fills after `room` bytes: write raises ENOSPC, as the kernel reports it."""
    room = 4096

    def write(self, data):
        if self.tell() + len(data) > self.room:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return super().write(data)


def test_disk_full_inside_torch_save_is_a_user_error_and_keeps_the_old_checkpoint(tmp_path, monkeypatch):
    """torch's zip writer turns the ENOSPC of a write into a RuntimeError ('unexpected pos'): still one line."""
    path = str(tmp_path / "ckpt.pt")
    save_checkpoint({"model": {"w": torch.ones(3)}, "model_args": {}}, path)
    before = open(path, "rb").read()
    monkeypatch.setattr(checkpoint.os, "fdopen", lambda fd, mode: io.BufferedWriter(FillingFile(fd, "w")))
    with pytest.raises(UserError, match="saving .*ckpt.pt failed: .*No space left on device; free some disk space, "
                                        "or write elsewhere; the previous one is intact"):
        save_checkpoint({"model": {"w": torch.zeros(100_000)}, "model_args": {}}, path)
    assert open(path, "rb").read() == before
    assert os.listdir(tmp_path) == ["ckpt.pt"]


def start_training(tmp_path, dataset, *extra):
    args = [sys.executable, "train.py", *(f"--{k}={v}" for k, v in TINY.items()), f"--dataset={dataset}",
            f"--out_dir={tmp_path / 'out'}", "--max_iters=100000", *extra]
    return subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})


def wait_for_line(proc, prefix, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        line = proc.stdout.readline()
        if line.startswith(prefix):
            return line
    raise AssertionError(f"no line starting {prefix!r}")


@pytest.mark.parametrize("delay", [0.0, 0.13, 0.31])
def test_sigkill_at_any_moment_leaves_a_loadable_checkpoint(tmp_path, char_dataset, delay):
    proc = start_training(tmp_path, char_dataset, "--eval_interval=1")  # a save every iteration
    try:
        wait_for_line(proc, "iter 3:")
        time.sleep(delay)
        proc.kill()
        proc.wait(timeout=30)
    finally:
        proc.kill()
    ckpt = load_checkpoint(str(tmp_path / "out" / "ckpt.pt"))
    assert ckpt["iter_num"] >= 2
    cfg, overrides = parse_args(TrainConfig, ["--init_from=resume", f"--out_dir={tmp_path / 'out'}",
                                              f"--max_iters={ckpt['iter_num'] + 1}"])
    train(cfg, overrides, log=lambda *a: None)
    assert not [f for f in os.listdir(tmp_path / "out") if f.endswith(".tmp")]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupt_saves_the_last_completed_iteration_and_exits_0(tmp_path, char_dataset, sig):
    proc = start_training(tmp_path, char_dataset, "--eval_interval=1000")
    try:
        seen = wait_for_line(proc, "iter 5:")
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert "interrupted: saved" in out and "--init_from=resume" in out
    ckpt = load_checkpoint(str(tmp_path / "out" / "ckpt.pt"))
    # the log file, not stdout: lines read ahead into the pipe's buffer by readline are not in communicate()'s
    logged = [json.loads(line) for line in open(tmp_path / "out" / "log.jsonl")]
    assert seen.startswith("iter 5:") and ckpt["iter_num"] == [r["iter"] for r in logged if r["kind"] == "train"][-1]


def test_interrupt_abandons_an_iteration_of_minutes_within_seconds_and_keeps_the_checkpoint(tmp_path, char_dataset):
    cfg = TrainConfig(**TINY, dataset=str(char_dataset), out_dir=str(tmp_path / "out"), max_iters=2, eval_interval=2)
    train(cfg, log=lambda *a: None)
    before = open(tmp_path / "out" / "ckpt.pt", "rb").read()
    # one iteration of 10^6 micro-batches takes most of an hour: only abandoning it stops in time
    proc = subprocess.Popen([sys.executable, "train.py", "--init_from=resume", f"--out_dir={tmp_path / 'out'}",
                             "--max_iters=4", "--gradient_accumulation_steps=1000000"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        wait_for_line(proc, "resuming from")
        time.sleep(1.0)
        proc.send_signal(signal.SIGTERM)
        start = time.time()
        out, err = proc.communicate(timeout=60)
        took = time.time() - start
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert took < 20, f"took {took:.1f}s to stop"
    assert "before this run completed an iteration: nothing saved" in out
    assert open(tmp_path / "out" / "ckpt.pt", "rb").read() == before


def test_interrupt_in_the_first_evaluation_of_a_scratch_run_replaces_nothing(tmp_path, char_dataset):
    cfg = TrainConfig(**TINY, dataset=str(char_dataset), out_dir=str(tmp_path / "out"), max_iters=2, eval_interval=2)
    train(cfg, log=lambda *a: None)
    before = {name: open(tmp_path / "out" / name, "rb").read() for name in ("ckpt.pt", "best.pt")}
    proc = start_training(tmp_path, char_dataset, "--eval_iters=10000000")  # an evaluation that never ends
    try:
        note = wait_for_line(proc, "note:")
        while "holds an earlier run" not in note:
            note = wait_for_line(proc, "note:")
        time.sleep(1.0)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert "holds an earlier run" in note and "--init_from=resume" in note
    assert "nothing saved" in out, (out, err)
    assert {name: open(tmp_path / "out" / name, "rb").read() for name in before} == before


def interrupting_forward(monkeypatch, at_call):
    """GPT.forward that sends this process SIGINT at the end of its at_call-th call (counting from 1): after
    the call has drawn its dropout masks, so that the abandoned iteration has moved the RNG on."""
    original, calls = GPT.forward, []
    # start-up times the model on a CPU (the slow-CPU note): those passes are not the loop's calls
    monkeypatch.setattr("nanogpt.training.notes.batch_seconds", lambda *a: 0.0)

    def forward(self, idx, targets=None, **kw):
        calls.append(1)
        out = original(self, idx, targets, **kw)
        if len(calls) == at_call:
            os.kill(os.getpid(), signal.SIGINT)
        return out
    monkeypatch.setattr(GPT, "forward", forward)


def test_resume_after_an_abandoned_iteration_matches_an_uninterrupted_run(tmp_path, char_dataset, monkeypatch):
    common = dict(TINY, dataset=str(char_dataset), max_iters=6, eval_interval=100, eval_iters=1, dropout=0.1)
    whole = train(TrainConfig(**common, out_dir=str(tmp_path / "whole")), log=lambda *a: None)
    # the iter-0 evaluation makes 2 calls; then the end of iteration 3's forward, its dropout drawn: a resume that
    # took the RNG state at the interrupt, not at the iteration's start, would draw other masks
    interrupting_forward(monkeypatch, at_call=2 + 4)
    lines = []
    summary = train(TrainConfig(**common, out_dir=str(tmp_path / "cut")), log=lines.append)
    assert summary["interrupted"] and summary["iters"] == 3
    assert load_checkpoint(str(tmp_path / "cut" / "ckpt.pt"))["iter_num"] == 3
    monkeypatch.undo()
    cfg, overrides = parse_args(TrainConfig, ["--init_from=resume", f"--out_dir={tmp_path / 'cut'}"])
    resumed = train(cfg, overrides, log=lambda *a: None)
    assert resumed["val_loss"] == whole["val_loss"]
    a = load_checkpoint(str(tmp_path / "whole" / "ckpt.pt"))["model"]
    b = load_checkpoint(str(tmp_path / "cut" / "ckpt.pt"))["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_second_signal_stops_at_once_and_saves_nothing_more(tmp_path, char_dataset, monkeypatch):
    original = torch.optim.AdamW.step

    def step_with_two_signals(self, *args, **kwargs):  # both arrive while the optimizer step must finish
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGTERM)
        return original(self, *args, **kwargs)
    monkeypatch.setattr(torch.optim.AdamW, "step", step_with_two_signals)
    cfg = TrainConfig(**TINY, dataset=str(char_dataset), out_dir=str(tmp_path / "out"), max_iters=5, eval_interval=100)
    with pytest.raises(KeyboardInterrupt, match="second SIGTERM"):
        train(cfg, log=lambda *a: None)
    assert not os.path.exists(tmp_path / "out" / "ckpt.pt")
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the handlers are restored


def test_interrupt_never_saves_non_finite_weights(tmp_path, char_dataset, monkeypatch):
    cfg = TrainConfig(**TINY, dataset=str(char_dataset), out_dir=str(tmp_path / "out"), max_iters=4, eval_interval=2)
    train(cfg, log=lambda *a: None)
    good = open(tmp_path / "out" / "ckpt.pt", "rb").read()
    original = torch.optim.AdamW.step

    def poisoning_step(self, *args, **kwargs):  # the step that makes the weights NaN, with SIGTERM arriving in it
        result = original(self, *args, **kwargs)
        if self.state and next(iter(self.state.values()))["step"] >= 6:
            os.kill(os.getpid(), signal.SIGTERM)
            with torch.no_grad():
                self.param_groups[0]["params"][0].fill_(float("nan"))
        return result
    monkeypatch.setattr(torch.optim.AdamW, "step", poisoning_step)
    cfg, overrides = parse_args(TrainConfig, ["--init_from=resume", f"--out_dir={tmp_path / 'out'}", "--max_iters=100", "--eval_interval=1000",
                                              "--log_interval=1000"])
    with pytest.raises(UserError, match="weights are not finite at iter 6"):
        train(cfg, overrides, log=lambda *a: None)
    assert open(tmp_path / "out" / "ckpt.pt", "rb").read() == good
    assert not [f for f in os.listdir(tmp_path / "out") if f.endswith(".tmp")]


def test_non_finite_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path, char_dataset, monkeypatch):
    cfg = TrainConfig(**TINY, dataset=str(char_dataset), out_dir=str(tmp_path / "out"), max_iters=4, eval_interval=2)
    train(cfg, log=lambda *a: None)
    good = open(tmp_path / "out" / "ckpt.pt", "rb").read()
    original = GPT.forward

    def diverging(self, idx, targets=None, **kw):
        logits, loss = original(self, idx, targets, **kw)
        return logits, (loss * float("nan") if loss is not None else None)
    monkeypatch.setattr(GPT, "forward", diverging)
    cfg, overrides = parse_args(TrainConfig, ["--init_from=resume", f"--out_dir={tmp_path / 'out'}", "--max_iters=8"])
    with pytest.raises(UserError, match="training loss is nan at iter 5"):
        train(cfg, overrides, log=lambda *a: None)
    assert open(tmp_path / "out" / "ckpt.pt", "rb").read() == good


def nanogpt_checkpoint(tmp_path, dataset):
    """A checkpoint as nanoGPT writes it: compiled-model keys, its config dict, no RNG or scaler state."""
    cfg = GPTConfig(block_size=16, vocab_size=read_meta(str(dataset))["vocab_size"], n_layer=2, n_head=2, n_embd=32,
                    bias=False)
    model = GPT(cfg)
    optimizer = configure_optimizers(model, optimizer_settings(learning_rate=1e-3, beta2=0.99))
    state = {"_orig_mod." + k: v for k, v in model.state_dict().items()}
    config = {k: v for k, v in TrainConfig().__dict__.items() if k in (
        "out_dir", "eval_interval", "log_interval", "eval_iters", "eval_only", "always_save_checkpoint", "init_from",
        "wandb_log", "wandb_project", "wandb_run_name", "dataset", "gradient_accumulation_steps", "batch_size",
        "block_size", "n_layer", "n_head", "n_embd", "dropout", "bias", "learning_rate", "max_iters", "weight_decay",
        "beta1", "beta2", "grad_clip", "decay_lr", "warmup_iters", "lr_decay_iters", "min_lr", "backend", "device",
        "dtype", "compile")}
    config.update(dataset=str(dataset), backend="nccl", device="cuda", dtype="bfloat16", compile=True,
                  block_size=16, n_layer=2, n_head=2, n_embd=32, bias=False, batch_size=4, eval_iters=2,
                  gradient_accumulation_steps=1, max_iters=2, eval_interval=2)
    ckpt = {"model": state, "optimizer": optimizer.state_dict(), "model_args": {
        "n_layer": 2, "n_head": 2, "n_embd": 32, "block_size": 16, "bias": False, "vocab_size": cfg.vocab_size,
        "dropout": 0.0}, "iter_num": 2, "best_val_loss": torch.tensor(3.0), "config": config}
    (tmp_path / "nano").mkdir()
    torch.save(ckpt, tmp_path / "nano" / "ckpt.pt")
    return tmp_path / "nano"


def test_nanogpt_checkpoint_resumes_and_samples(tmp_path, char_dataset):
    out = nanogpt_checkpoint(tmp_path, char_dataset)
    lines = []
    cfg, overrides = parse_args(TrainConfig, ["--init_from=resume", f"--out_dir={out}", "--max_iters=4", "--device=cpu"])
    summary = train(cfg, overrides, log=lines.append)
    assert summary["iters"] == 4 and any("no RNG state" in line for line in lines)
    result = run_script(["sample.py", f"--out_dir={out}", "--num_samples=1", "--max_new_tokens=10", "--start=All"])
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("All")


def test_our_gpt2_style_checkpoint_has_nanogpt_shapes(tmp_path, char_dataset):
    cfg = TrainConfig(**TINY, dataset=str(char_dataset), out_dir=str(tmp_path / "out"), max_iters=2, eval_interval=2)
    train(cfg, log=lambda *a: None)
    ckpt = torch.load(tmp_path / "out" / "ckpt.pt", weights_only=True)
    assert set(ckpt["model_args"]) == {"n_layer", "n_head", "n_embd", "block_size", "bias", "vocab_size", "dropout"}
    assert all(isinstance(v, (int, float, str, bool, type(None), list)) for v in ckpt["config"].values())
    assert set(ckpt["model"]) == set(GPT(GPTConfig(**ckpt["model_args"])).state_dict())


def test_a_second_writer_is_refused_and_readers_delete_nothing(tmp_path, char_dataset):
    live = start_training(tmp_path, char_dataset, "--eval_interval=2")
    out = tmp_path / "out"
    try:
        wait_for_line(live, "iter 3:")  # ckpt.pt written at iter 2
        partial = out / ".ckpt.pt.abc123.tmp"  # what the live run's save in progress looks like
        partial.write_bytes(b"half a checkpoint")
        second = run_script(["train.py", f"--dataset={char_dataset}", f"--out_dir={out}", "--device=cpu",
                             "--block_size=16", "--n_layer=1", "--n_head=1", "--n_embd=8", "--max_iters=1"])
        assert second.returncode == 2 and "Traceback" not in second.stderr
        assert f"{out} is in use by train.py (pid {live.pid} on" in second.stderr
        reader = run_script(["train.py", "--init_from=resume", f"--out_dir={out}", "--eval_only=True"])
        assert reader.returncode == 0, reader.stderr
        assert partial.exists()  # neither the refused writer nor the reader deleted it
        live.send_signal(signal.SIGINT)
        _, err = live.communicate(timeout=60)
        assert live.returncode == 0, err
    finally:
        live.kill()
    assert partial.exists()
    next_iter = load_checkpoint(str(out / "ckpt.pt"))["iter_num"] + 1
    cfg, overrides = parse_args(TrainConfig, ["--init_from=resume", f"--out_dir={out}", f"--max_iters={next_iter}"])
    train(cfg, overrides, log=lambda *a: None)
    assert not partial.exists()  # the next writer, holding the lock, cleans what a dead run left


def test_a_failing_file_system_is_one_line_and_keeps_the_checkpoint(tmp_path, char_dataset, monkeypatch):
    import errno
    cfg = TrainConfig(**TINY, dataset=str(char_dataset), out_dir=str(tmp_path / "out"), max_iters=2, eval_interval=2)
    train(cfg, log=lambda *a: None)
    good = open(tmp_path / "out" / "ckpt.pt", "rb").read()

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system", str(tmp_path / "out" / "x.tmp"))
    monkeypatch.setattr(checkpoint.tempfile, "mkstemp", read_only)
    cfg, overrides = parse_args(TrainConfig, ["--init_from=resume", f"--out_dir={tmp_path / 'out'}", "--max_iters=4"])
    with pytest.raises(UserError, match="saving .*ckpt.pt failed: .*Read-only file system; the file system is "
                                        "read-only: write elsewhere; the previous one is intact"):
        train(cfg, overrides, log=lambda *a: None)
    assert open(tmp_path / "out" / "ckpt.pt", "rb").read() == good


def trained(tmp_path, char_dataset, **overrides):
    cfg = TrainConfig(**{**TINY, "max_iters": 2, "eval_interval": 2, **overrides}, dataset=str(char_dataset),
                      out_dir=str(tmp_path / "out"))
    train(cfg, log=lambda *a: None)
    return tmp_path / "out"


def test_a_deleted_lock_file_is_no_longer_held_and_a_second_writer_gets_its_own(tmp_path):
    first = out_dir.OutDirLock(str(tmp_path)).acquire()
    with pytest.raises(UserError, match="is in use by train.py"):
        out_dir.OutDirLock(str(tmp_path)).acquire()
    os.remove(tmp_path / ".lock")  # a cleanup of dotfiles
    second = out_dir.OutDirLock(str(tmp_path), "second").acquire()
    assert second.held() and not first.held()  # the first writer sees it before its next save
    second.release()
    first.release()


def test_a_run_whose_lock_file_was_deleted_stops_before_saving(tmp_path, char_dataset, monkeypatch):
    """A cleanup deletes out/.lock during the run and a second writer locks a new one: the first saves nothing."""
    import train as train_module
    original, second = train_module.estimate_loss, []

    def estimate_then_lose_the_lock(*args, **kwargs):
        if not second:  # the first evaluation (iter 0): nothing to save yet
            os.remove(tmp_path / "out" / ".lock")
            second.append(out_dir.OutDirLock(str(tmp_path / "out"), "second").acquire())
        return original(*args, **kwargs)
    monkeypatch.setattr(train_module, "estimate_loss", estimate_then_lose_the_lock)
    cfg = TrainConfig(**TINY, dataset=str(char_dataset), out_dir=str(tmp_path / "out"), max_iters=2, eval_interval=2)
    with pytest.raises(UserError, match=r"\.lock was deleted or replaced while this train.py held it.*stopping "
                                        r"without saving"):
        train(cfg, log=lambda *a: None)
    second[0].release()
    assert sorted(os.listdir(tmp_path / "out")) == [".lock", "log.jsonl"]  # no ckpt.pt, no best.pt


@pytest.mark.parametrize("best", [float("nan"), float("-inf"), torch.tensor(float("nan"))],
                         ids=["nan", "-inf", "nan-tensor"])
def test_a_best_val_loss_no_evaluation_can_beat_does_not_stop_best_pt(tmp_path, char_dataset, best):
    """A damaged best_val_loss is taken as no best yet (the weights are fine): the next evaluation writes best.pt."""
    out = trained(tmp_path, char_dataset)
    state = torch.load(out / "ckpt.pt", weights_only=True)
    torch.save({**state, "best_val_loss": best}, out / "ckpt.pt")
    lines = []
    cfg, overrides = parse_args(TrainConfig, ["--init_from=resume", f"--out_dir={out}", "--max_iters=4"])
    summary = train(cfg, overrides, log=lines.append)
    assert any("no best yet" in line for line in lines), lines
    best_pt = load_checkpoint(str(out / "best.pt"))
    assert best_pt["iter_num"] == 4 and best_pt["best_val_loss"] == summary["best_val_loss"] == summary["val_loss"]


def no_model_built_outside_meta(monkeypatch):
    """GPT(config) may run only on the meta device (shapes, no memory): a real one fails the test."""
    real = checkpoint.GPT

    def guarded(config):
        assert torch.get_default_device().type == "meta", "a model was built from unchecked sizes"
        return real(config)
    monkeypatch.setattr(checkpoint, "GPT", guarded)


def test_weights_whose_storage_is_smaller_than_their_shape_are_refused_before_allocating(tmp_path, monkeypatch):
    """torch.zeros(1).expand(...) saves one number: loading it into a model of its shape allocates it all."""
    config = GPTConfig(block_size=16, vocab_size=64, n_layer=2, n_head=4, n_embd=32, bias=True)
    state = {k: torch.zeros(1).expand(v.shape) for k, v in GPT(config).state_dict().items()}
    path = tmp_path / "ckpt.pt"
    torch.save({"model": state, "model_args": checkpoint.model_args(config)}, path)
    assert os.path.getsize(path) < sum(v.numel() * 4 for v in state.values())
    no_model_built_outside_meta(monkeypatch)
    with pytest.raises(UserError, match=r"transformer.wte.weight has shape \(64, 32\) \(8,192 bytes\) but its "
                                        r"storage holds 4 bytes"):
        checkpoint.model_from_checkpoint(load_checkpoint(str(path)), str(path))


def test_blocks_sharing_one_storage_are_refused_before_allocating(tmp_path, monkeypatch):
    """Every block's weights the same tensors: the file holds one block, the model would allocate n_layer."""
    config = GPTConfig(block_size=16, vocab_size=64, n_layer=4, n_head=4, n_embd=32, bias=True)
    state = GPT(config).state_dict()
    state = {k: state[k.replace(f".h.{k.split('.')[2]}.", ".h.0.")] if k.startswith("transformer.h.") else v
             for k, v in state.items()}
    path = tmp_path / "ckpt.pt"
    torch.save({"model": state, "model_args": checkpoint.model_args(config)}, path)
    no_model_built_outside_meta(monkeypatch)
    with pytest.raises(UserError, match="tensors share their bytes"):
        checkpoint.model_from_checkpoint(load_checkpoint(str(path)), str(path))
    tied = GPTConfig(block_size=16, vocab_size=64, n_layer=2, n_head=4, n_embd=32, tie_weights=True)
    torch.save({"model": GPT(tied).state_dict(), "model_args": checkpoint.model_args(tied)}, path)
    monkeypatch.undo()
    checkpoint.model_from_checkpoint(load_checkpoint(str(path)), str(path))  # lm_head is wte: one tensor, two names


def test_a_billion_claimed_layers_are_refused_without_counting_to_a_billion(tmp_path, char_dataset):
    """Refused in one line by sample.py, in a process allowed 3 GiB of address space."""
    import resource
    out = trained(tmp_path, char_dataset)
    state = torch.load(out / "ckpt.pt", weights_only=True)
    torch.save({**state, "model_args": {**state["model_args"], "n_layer": 10 ** 9}}, out / "ckpt.pt")

    def limit_memory():
        resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
    result = subprocess.run([sys.executable, "sample.py", f"--out_dir={out}"], cwd=ROOT, capture_output=True,
                            text=True, timeout=120, preexec_fn=limit_memory)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert "claims n_layer=1000000000 but the weights hold 2 blocks" in result.stderr


@pytest.mark.parametrize("name", [".ckpt.dcp.tmp", ".ckpt.dcp.old", ".best.dcp.old", ".ckpt.pt.x.tmp"])
def test_a_link_at_a_saves_scratch_name_is_removed_not_followed(tmp_path, name):
    """A link planted in an out_dir at a sharded save's scratch name (adversarial pass, #31): the next writer
    removes the link itself; its target is neither deleted nor moved into the checkpoint's place."""
    from nanogpt.out_dir import remove_partial_saves
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("mine")
    out = tmp_path / "out"
    out.mkdir()
    os.symlink(outside, out / name)
    remove_partial_saves(str(out))
    assert not os.path.lexists(out / name) and not os.path.exists(out / "ckpt.dcp")
    assert (outside / "keep.txt").read_text() == "mine"


def test_a_sharded_checkpoint_asking_for_decompression_is_refused_before_any_read(tmp_path):
    """DCP can decode a shard through zstd before any size check: a 24 KB frame made a reader hold 1.9 GB
    (adversarial pass, #31). No save here writes such a shard, so a .metadata that asks for one is refused."""
    import pickle
    import warnings

    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.filesystem import _StorageInfo

    from nanogpt.dcp import dcp_reader
    from nanogpt.errors import UserError
    directory = tmp_path / "ckpt.dcp"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "assuming the intent is to save in a single process": it is
        dcp.save({"model.transformer.wte.weight": torch.randn(4, 8)}, checkpoint_id=str(directory), no_dist=True)
    assert dcp_reader(str(directory)).read_metadata().storage_data  # the plain directory reads
    with open(directory / ".metadata", "rb") as f:
        metadata = pickle.load(f)  # our own file, just written
    index, info = next(iter(metadata.storage_data.items()))
    metadata.storage_data[index] = _StorageInfo(info.relative_path, info.offset, info.length, ["stream.zstd/1"])
    with open(directory / ".metadata", "wb") as f:
        pickle.dump(metadata, f)
    with pytest.raises(UserError, match="refusing to load .*stream.zstd"):
        dcp_reader(str(directory)).read_metadata()


@pytest.mark.parametrize("options", [dict(), dict(pos_emb="rope", norm="rmsnorm", tie_weights=False, n_kv_head=1)])
def test_a_checkpoint_loads_once_into_a_model_built_on_the_meta_device(options):
    """model_from_checkpoint builds the model's shapes on the meta device and takes the file's tensors as its
    weights (no initialisation, no copy): the same logits as a model initialised and then loaded, a tied head
    still one Parameter, RoPE's tables computed as GPT computes them."""
    torch.manual_seed(0)
    config = GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=11, dropout=0.0, **options)
    trained = GPT(config)
    for p in trained.parameters():  # every weight random: an initialisation's zeros would hide a weight left out
        torch.nn.init.normal_(p, std=0.3)
    state = {k: v.clone() for k, v in trained.state_dict().items()}
    loaded = checkpoint.model_from_checkpoint({"model": state, "model_args": checkpoint.model_args(config)})
    assert all(p.data_ptr() == state[name].data_ptr() for name, p in loaded.named_parameters())  # not copied
    assert (loaded.lm_head.weight is loaded.transformer.wte.weight) == config.tie_weights
    assert len(list(loaded.parameters())) == len(list(trained.parameters()))
    x = torch.randint(0, 11, (2, 16))
    assert torch.equal(loaded.eval()(x)[0], trained.eval()(x)[0])
    if config.pos_emb == "rope":
        assert torch.equal(loaded.rope, trained.rope)


def test_weights_laid_over_each_others_bytes_load_as_weights_of_their_own():
    """A file may lay two weights over one storage, or one weight over itself (stride 0), with as many bytes as
    they claim: loaded as they are, a step on one would write the other (or fail on the overlap). Each becomes
    a parameter of its own bytes; the tied head alone shares wte's."""
    torch.manual_seed(0)
    config = GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=11, dropout=0.0)
    state = {k: v.clone() for k, v in GPT(config).state_dict().items()}
    fc = state["transformer.h.0.mlp.c_fc.weight"]
    padded = torch.randn(2 * fc.numel())  # twice the bytes, so that the file's storages hold what it claims
    state["transformer.h.0.mlp.c_fc.weight"] = padded[:fc.numel()].view(fc.shape)
    state["transformer.h.1.mlp.c_fc.weight"] = padded[:fc.numel()].view(fc.shape)
    row = torch.randn(config.n_embd * 16)
    state["transformer.wpe.weight"] = row[:config.n_embd].expand(16, config.n_embd)  # stride 0, its storage padded
    model = checkpoint.model_from_checkpoint({"model": state, "model_args": checkpoint.model_args(config)})
    h0, h1 = model.transformer.h[0].mlp.c_fc.weight, model.transformer.h[1].mlp.c_fc.weight
    assert torch.equal(h0, h1) and h0.data_ptr() != h1.data_ptr()
    assert model.transformer.wpe.weight.is_contiguous()
    assert model.lm_head.weight is model.transformer.wte.weight
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    x = torch.randint(0, 11, (2, 16))
    model(x, x)[1].backward()
    optimizer.step()  # fails on a self-overlapping parameter
    assert not torch.equal(model.transformer.h[0].mlp.c_fc.weight, model.transformer.h[1].mlp.c_fc.weight)
