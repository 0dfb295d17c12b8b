"""Data parallelism through torchrun (gloo on CPU): the same result as one process, clean failures."""
import json

import torch

from conftest import run_script
from nanogpt.checkpoint import load_checkpoint
from train import TrainConfig, train

TINY = dict(n_layer=2, n_head=2, n_embd=32, block_size=16, batch_size=4, eval_iters=4, device="cpu",
            learning_rate=3e-3, warmup_iters=2, max_iters=5, lr_decay_iters=5, eval_interval=100, log_interval=1)


def torchrun(script, *args, timeout=120):
    launcher = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", script]
    return run_script(launcher + [f"--{k}={v}" for k, v in TINY.items()] + list(args), timeout=timeout)


def test_two_processes_equal_one_process_with_two_micro_batches(tmp_path, char_dataset):
    result = torchrun("train.py", f"--dataset={char_dataset}", f"--out_dir={tmp_path / 'ddp'}",
                      "--gradient_accumulation_steps=2")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "2 processes" in result.stdout
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as torchrun's workers: matmuls then sum in the same order
    try:
        train(TrainConfig(**TINY, dataset=str(char_dataset), out_dir=str(tmp_path / "one"),
                          gradient_accumulation_steps=2), log=lambda *a: None)
    finally:
        torch.set_num_threads(threads)
    ddp = load_checkpoint(str(tmp_path / "ddp" / "ckpt.pt"))
    one = load_checkpoint(str(tmp_path / "one" / "ckpt.pt"))
    assert ddp["iter_num"] == one["iter_num"] == 5 and len(ddp["rng"]) == 2
    for key, value in one["model"].items():
        torch.testing.assert_close(ddp["model"][key], value, atol=1e-6, rtol=0)

    def records(path):
        return [json.loads(line) for line in open(path / "log.jsonl")]
    ddp_log, one_log = records(tmp_path / "ddp"), records(tmp_path / "one")
    assert len(ddp_log) == len(one_log)  # rank 0 alone writes the log
    for a, b in zip(ddp_log[1:], one_log[1:]):
        for key in ("loss", "val_loss", "train_loss"):
            if key in a:
                assert abs(a[key] - b[key]) < 1e-5, (key, a, b)


def test_resume_under_ddp_continues_exactly(tmp_path, char_dataset):
    """5 iters under torchrun straight vs 3, stop, resume to 5 under torchrun: identical weights and losses."""
    common = [f"--dataset={char_dataset}", "--gradient_accumulation_steps=2", "--dropout=0.1"]
    straight = torchrun("train.py", *common, f"--out_dir={tmp_path / 'a'}")
    first = torchrun("train.py", *common, f"--out_dir={tmp_path / 'b'}", "--max_iters=3")
    resumed = torchrun("train.py", f"--out_dir={tmp_path / 'b'}", "--init_from=resume", "--max_iters=5")
    for result in (straight, first, resumed):
        assert result.returncode == 0, result.stderr[-3000:]
    a = load_checkpoint(str(tmp_path / "a" / "ckpt.pt"))
    b = load_checkpoint(str(tmp_path / "b" / "ckpt.pt"))
    assert a["iter_num"] == b["iter_num"] == 5
    for key, value in a["model"].items():
        assert torch.equal(value, b["model"][key]), key

    def losses(path):
        return [r["loss"] for r in map(json.loads, open(path / "log.jsonl")) if r["kind"] == "train"]
    assert losses(tmp_path / "a") == losses(tmp_path / "b")


def test_accumulation_must_divide_by_world_size(tmp_path, char_dataset):
    result = torchrun("train.py", f"--dataset={char_dataset}", f"--out_dir={tmp_path / 'o'}",
                      "--gradient_accumulation_steps=3")
    assert result.returncode != 0
    assert "gradient_accumulation_steps (3) must be divisible by the number of processes (2)" in result.stderr


def test_one_rank_failing_ends_the_run_with_its_error(tmp_path, char_dataset):
    result = torchrun("tests/ddp_fail_rank.py", f"--dataset={char_dataset}", f"--out_dir={tmp_path / 'o'}",
                      "--gradient_accumulation_steps=2", "--max_iters=1000", timeout=90)
    assert result.returncode != 0
    assert "rank 1 failed on purpose" in result.stderr + result.stdout


def test_ctrl_c_under_torchrun_saves_and_prints_the_torchrun_command_to_resume(tmp_path, char_dataset):
    """A terminal's Ctrl-C reaches torchrun and every worker (one process group): the workers save the last
    completed iteration together, and the command printed to resume is torchrun's, not a single process's."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from conftest import ROOT
    args = [f"--{k}={v}" for k, v in {**TINY, "max_iters": 100000, "lr_decay_iters": 100000}.items()]
    proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                             "train.py", *args, f"--dataset={char_dataset}", f"--out_dir={tmp_path / 'out'}",
                             "--gradient_accumulation_steps=2"], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        # an iteration completed (its log line: log_interval=1), not a fixed wait: on a loaded machine the first
        # evaluation alone outlasted one, and a signal before any iteration rightly saves nothing
        log, deadline = tmp_path / "out" / "log.jsonl", time.time() + 120
        while time.time() < deadline and not (log.exists() and '"kind": "train"' in log.read_text()):
            time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    resume = (f"continue with torchrun --standalone --nproc_per_node=2 train.py --init_from=resume "
              f"--out_dir={tmp_path / 'out'}")
    assert resume in out, (out[-2000:], err[-2000:])
    assert load_checkpoint(str(tmp_path / "out" / "ckpt.pt"))["iter_num"] > 0


def test_a_signal_that_lands_during_the_ranks_agreement_is_kept_for_the_next(monkeypatch):
    """A worker spends much of a log iteration waiting in the all-reduce that agrees on stopping. A signal that
    lands then runs its handler before the all-reduce's False is stored: the agreement must not clear it, or the
    run trains on until torchrun kills it, and nothing is saved (the flake of the torchrun Ctrl-C test)."""
    import signal
    from nanogpt.training import stopping
    flag = stopping.StopFlag()
    try:
        flag.abandon = False  # as under DDP
        def signal_during_all_reduce(local, world):
            flag.handle(signal.SIGINT, None)  # the handler runs while the other rank's False is on its way
            return False
        monkeypatch.setattr(stopping, "any_rank", signal_during_all_reduce)
        assert not flag.agreed(2, 10, 1)  # this iteration the ranks did not agree: both go on, in step
        monkeypatch.setattr(stopping, "any_rank", lambda local, world: local)
        assert flag.agreed(2, 11, 1)  # the next log iteration carries this rank's signal to the others
        assert flag.set
    finally:
        flag.restore()


def test_a_signal_after_the_last_agreement_is_agreed_once_more_after_the_loop(monkeypatch):
    """A run that ends at max_iters after a signal landed past its last agreement: only that rank had the flag, and
    its save's collectives waited for ranks that never came. After the loop every rank agrees once more, on what the
    all-reduce says, not on its own flag."""
    from nanogpt.training import stopping
    flag = stopping.StopFlag()
    try:
        flag.abandon = False
        calls = []
        monkeypatch.setattr(stopping, "any_rank", lambda local, world: calls.append(local) or True)
        assert flag.final(2) and flag.set and calls == [False]  # another rank's signal: this one saves with it
        flag.set = True
        monkeypatch.setattr(stopping, "any_rank", lambda local, world: False)
        assert not flag.final(2)  # (the all-reduce is what every rank acts on)
        assert stopping.StopFlag.final(flag, 1) is True  # one process: its own flag
    finally:
        flag.restore()


def test_an_evaluation_whose_batches_do_not_divide_among_the_ranks_ends(tmp_path, char_dataset):
    """One train batch for two ranks (a plan's eval_iters on a short budget): DDP broadcasts the rotary buffers in
    every forward, so a rank that ran one forward fewer left the other waiting in the broadcast for ever. Each rank
    now runs as many forwards as the one with most, the extra one ignored."""
    result = torchrun("train.py", f"--dataset={char_dataset}", f"--out_dir={tmp_path / 'o'}", "--pos_emb=rope",
                      "--eval_iters=1", "--eval_windows=9", "--eval_interval=2", "--gradient_accumulation_steps=2",
                      timeout=60)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "iter 4: train loss" in result.stdout
