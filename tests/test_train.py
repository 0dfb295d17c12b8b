"""train.py and sample.py end to end on a tiny char dataset: checkpoints, resume, logs, schedule."""
import json
import math
import os
import re
from contextlib import nullcontext
from dataclasses import replace

import pytest
import torch

from configurator import parse_args
from conftest import CORPUS, run_script
from nanogpt.checkpoint import load_checkpoint
from nanogpt.training.optim import lr_scale
from train import TrainConfig, train

TINY = dict(n_layer=2, n_head=2, n_embd=32, block_size=16, batch_size=4, gradient_accumulation_steps=1,
            eval_iters=2, log_interval=1, learning_rate=3e-3, warmup_iters=2, min_lr=3e-4, device="cpu",
            compile=False)


def tiny_cfg(tmp_path, dataset, **kw):
    values = {**TINY, "out_dir": str(tmp_path / "out"), "dataset": str(dataset), "max_iters": 6,
              "lr_decay_iters": 6, "eval_interval": 3, **kw}
    return TrainConfig(**values)


def quiet(*args, **kwargs):
    pass


def test_train_writes_checkpoint_and_log(tmp_path, char_dataset):
    summary = train(tiny_cfg(tmp_path, char_dataset), log=quiet)
    ckpt = load_checkpoint(str(tmp_path / "out" / "ckpt.pt"))
    assert {"model", "optimizer", "model_args", "iter_num", "best_val_loss", "config"} <= set(ckpt)
    assert ckpt["iter_num"] == 6 and summary["iters"] == 6
    assert not any(k.startswith("_orig_mod.") for k in ckpt["model"])
    records = [json.loads(line) for line in open(tmp_path / "out" / "log.jsonl")]
    train_records = [r for r in records if r["kind"] == "train"]
    assert [r["iter"] for r in train_records] == [1, 2, 3, 4, 5, 6]
    assert all(math.isfinite(r["loss"]) and r["tok_s"] > 0 for r in train_records)
    evals = [r for r in records if r["kind"] == "eval"]
    assert [r["iter"] for r in evals] == [0, 3, 6]
    assert ckpt["best_val_loss"] == min(r["val_loss"] for r in evals)


def test_every_line_of_a_run_goes_through_log(tmp_path, char_dataset, capsys):
    """Evaluations, training lines, the memory record and the end: all through the log callable, nothing printed
    past it (a library caller, or a test, that passes its own log gets every line and a quiet console)."""
    lines = []
    train(tiny_cfg(tmp_path, char_dataset, target_loss=0.01), log=lines.append)
    assert capsys.readouterr().out == ""
    for start in ("model: ", "iter 0: train loss", "memory per process:", "iter 6: loss", "iter 6: train loss",
                  "did not reach val loss 0.01", "done: 6 iters"):
        assert sum(line.startswith(start) for line in lines) == 1, (start, lines)


def test_best_val_loss_is_the_best_seen_and_best_pt_holds_it(tmp_path, char_dataset):
    train(tiny_cfg(tmp_path, char_dataset), log=quiet)
    first = load_checkpoint(str(tmp_path / "out" / "best.pt"))
    # resumed with a learning rate this high, val loss only gets worse: the best stays the old one
    cfg, overrides = parse_args(TrainConfig, ["--init_from=resume", f"--out_dir={tmp_path / 'out'}", "--max_iters=12",
                                              "--learning_rate=5.0", "--decay_lr=False", "--grad_clip=0"])
    lines = []
    summary = train(cfg, overrides, log=lines.append)
    # the time is this process's, and so is the count beside it: 6 of the 12 iters
    assert re.fullmatch(r"done: 6 iters in [0-9.]+ s \(12 in all\); val loss .*", lines[-1]), lines[-1]
    evals = [json.loads(line) for line in open(tmp_path / "out" / "log.jsonl") if '"eval"' in line]
    assert evals[-1]["val_loss"] > first["best_val_loss"]
    assert summary["best_val_loss"] == first["best_val_loss"] == min(r["val_loss"] for r in evals)
    latest = load_checkpoint(str(tmp_path / "out" / "ckpt.pt"))
    assert latest["iter_num"] == 12 and latest["best_val_loss"] == first["best_val_loss"]
    assert load_checkpoint(str(tmp_path / "out" / "best.pt"))["iter_num"] == first["iter_num"]


def test_resume_matches_uninterrupted_run(tmp_path, char_dataset):
    """8 iters straight vs 4, stop, resume to 8: bit-identical weights, optimizer state and losses (dropout on)."""
    kw = dict(dropout=0.1, max_iters=8, lr_decay_iters=8, eval_interval=4)
    train(tiny_cfg(tmp_path / "a", char_dataset, **kw), log=quiet)
    train(tiny_cfg(tmp_path / "b", char_dataset, **{**kw, "max_iters": 4}), log=quiet)
    cfg, overrides = parse_args(TrainConfig, ["--init_from=resume", f"--out_dir={tmp_path / 'b' / 'out'}", "--max_iters=8"])
    train(cfg, overrides, log=quiet)
    a = load_checkpoint(str(tmp_path / "a" / "out" / "ckpt.pt"))
    b = load_checkpoint(str(tmp_path / "b" / "out" / "ckpt.pt"))
    assert a["iter_num"] == b["iter_num"] == 8
    for key, value in a["model"].items():
        assert torch.equal(value, b["model"][key]), key
    for sa, sb in zip(a["optimizer"]["state"].values(), b["optimizer"]["state"].values()):
        assert all(torch.equal(sa[k], sb[k]) for k in sa)

    def losses(path):
        return [r["loss"] for r in map(json.loads, open(path / "out" / "log.jsonl")) if r["kind"] == "train"]
    assert losses(tmp_path / "a") == losses(tmp_path / "b")


def test_resume_rejects_a_shape_change_and_allows_other_overrides(tmp_path, char_dataset):
    from configurator import UserError
    train(tiny_cfg(tmp_path, char_dataset, max_iters=3), log=quiet)
    out = f"--out_dir={tmp_path / 'out'}"
    cfg, overrides = parse_args(TrainConfig, ["--init_from=resume", out, "--n_layer=3"])
    with pytest.raises(UserError, match=r"--n_layer=3 contradicts the checkpoint's n_layer=2"):
        train(cfg, overrides, log=quiet)
    cfg, overrides = parse_args(TrainConfig, ["--init_from=resume", out, "--embedding_lr=0.1"])
    with pytest.raises(UserError, match=r"--embedding_lr=0.1 would add or remove the embeddings' own optimizer "
                                        r"group, which the checkpoint's optimizer state lacks"):
        train(cfg, overrides, log=quiet)
    lines = []
    cfg, overrides = parse_args(TrainConfig, ["--init_from=resume", out, "--max_iters=5", "--eval_only=True"])
    train(cfg, overrides, log=lines.append)
    assert "override: max_iters = 5 (was 3)" in lines


def test_lr_schedule_warmup_cosine_floor():
    # learning_rate 1: the multiplier is the rate
    cfg = TrainConfig(learning_rate=1.0, min_lr=0.1, warmup_iters=10, lr_decay_iters=110)
    assert lr_scale(0, cfg) == pytest.approx(1 / 11)
    assert lr_scale(9, cfg) == pytest.approx(10 / 11)
    assert lr_scale(10, cfg) == pytest.approx(1.0)
    assert lr_scale(60, cfg) == pytest.approx(0.55)  # halfway: min + (max - min) / 2
    assert lr_scale(110, cfg) == pytest.approx(0.1) and lr_scale(500, cfg) == pytest.approx(0.1)
    same = TrainConfig(learning_rate=1.0, min_lr=0.1, warmup_iters=10, lr_decay_iters=10)
    assert [lr_scale(i, same) for i in (9, 10, 11)] == pytest.approx([10 / 11, 0.1, 0.1])  # no division by zero


def test_sample_prints_text_from_the_trained_checkpoint(tmp_path, char_dataset):
    train(tiny_cfg(tmp_path, char_dataset), log=quiet)
    args = ["sample.py", f"--out_dir={tmp_path / 'out'}", "--start=First", "--num_samples=2", "--max_new_tokens=20"]
    first = run_script(args)
    assert first.returncode == 0, first.stderr
    samples = first.stdout.split("---------------\n")
    assert samples[0].startswith("First") and len(samples) == 3
    again = run_script(args)
    assert again.stdout == first.stdout  # same seed, same text
    greedy = run_script(args + ["--temperature=0", "--stream=True"])
    assert greedy.returncode == 0, greedy.stderr
    assert greedy.stdout == run_script(args + ["--temperature=0", "--seed=7"]).stdout  # greedy has no randomness


def test_train_script_runs_from_a_config_file(tmp_path, char_dataset):
    config = tmp_path / "tiny.py"
    config.write_text("\n".join(f"{k} = {v!r}" for k, v in TINY.items()) + "\n")
    result = run_script(["train.py", str(config), f"--dataset={char_dataset}", f"--out_dir={tmp_path / 'o'}",
                         "--max_iters=3", "--eval_interval=3"])
    assert result.returncode == 0, result.stderr
    assert "done: 3 iters" in result.stdout and os.path.exists(tmp_path / "o" / "ckpt.pt")


def test_wandb_gets_the_same_metrics_as_the_json_log(tmp_path, char_dataset, monkeypatch):
    import sys
    import types
    calls = []
    fake = types.ModuleType("wandb")
    fake.init = lambda **kw: calls.append(("init", kw["project"], kw["name"]))
    fake.log = lambda data, step: calls.append(("log", step, data))
    monkeypatch.setitem(sys.modules, "wandb", fake)
    train(tiny_cfg(tmp_path, char_dataset, wandb_log=True, wandb_project="p", wandb_run_name="r"), log=quiet)
    assert calls[0] == ("init", "p", "r") and sum(c[0] == "init" for c in calls) == 1
    logged = {(c[1], k): v for c in calls[1:] for k, v in c[2].items()}
    records = [json.loads(line) for line in open(tmp_path / "out" / "log.jsonl")][1:]
    assert {r["kind"] for r in records} == {"train", "eval", "memory"}
    for r in records:
        if r["kind"] == "memory":
            assert logged[(r["iter"], "memory/params")] == r["params"]
            continue
        assert logged[(r["iter"], f"{r['kind']}/loss" if r["kind"] == "train" else "eval/val_loss")] == \
            (r["loss"] if r["kind"] == "train" else r["val_loss"])


def test_wandb_log_without_wandb_is_a_clear_error(tmp_path, char_dataset, monkeypatch):
    import sys

    from configurator import UserError
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb raises ImportError
    with pytest.raises(UserError, match="wandb_log=True needs wandb: pip install wandb"):
        train(tiny_cfg(tmp_path, char_dataset, wandb_log=True), log=quiet)
    assert not os.path.exists(tmp_path / "out")


def test_sample_rebuilds_a_modern_model_from_its_checkpoint(tmp_path, char_dataset):
    options = dict(pos_emb="rope", norm="rmsnorm", activation="swiglu", n_kv_head=1, tie_weights=False, bias=False)
    train(tiny_cfg(tmp_path, char_dataset, max_iters=2, **options), log=quiet)
    ckpt = load_checkpoint(str(tmp_path / "out" / "ckpt.pt"))
    assert {k: ckpt["model_args"][k] for k in options} == options
    result = run_script(["sample.py", f"--out_dir={tmp_path / 'out'}", "--start=All", "--num_samples=1",
                         "--max_new_tokens=10"])
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("All")


def test_gpu_recipe_on_a_cpu_says_so_and_does_not_compile(tmp_path, char_dataset):
    result = run_script(["train.py", "config/shakespeare_char.py", f"--dataset={char_dataset}",
                         f"--out_dir={tmp_path / 'o'}", "--device=cpu", "--max_iters=0", "--eval_iters=1"])
    assert result.returncode == 0, result.stderr
    note = next(line for line in result.stdout.splitlines() if "sized for a GPU" in line)
    assert "an iter takes about" in note and "each evaluation about" in note
    assert "compiling" not in result.stdout


def test_a_new_run_on_another_text_is_refused_an_out_dir_holding_a_model_of_one(tmp_path, char_dataset):
    """config/tangshi_cpu.py --dataset=data/mine trained into the recipe's out-tangshi and, at its first evaluation,
    replaced the Tang model with one of the user's text (a new user's trial). A new run on another text now refuses
    such an out_dir before it spends anything, and leaves the checkpoint as it was; the same text replaces it, as a
    note says (nanoGPT's habit of training again into out_dir)."""
    import shutil

    from configurator import UserError
    train(tiny_cfg(tmp_path, char_dataset), log=quiet)
    ckpt = tmp_path / "out" / "ckpt.pt"
    before = ckpt.read_bytes()
    other = tmp_path / "other"
    shutil.copytree(char_dataset, other)  # the same tokens in another folder: another dataset all the same
    with pytest.raises(UserError, match=rf"ckpt.pt holds a model of {char_dataset} \(iter 6, best val loss .*\), and "
                                        rf"this run trains on {other}: give it a folder of its own "
                                        rf"\(--out_dir=out-other\), or move that checkpoint away to replace it"):
        train(replace(tiny_cfg(tmp_path, char_dataset), dataset=str(other)), log=quiet)
    assert ckpt.read_bytes() == before
    # a fine-tune of that very checkpoint into its own out_dir is refused, and not told to move it away
    with pytest.raises(UserError, match=r"give it a folder of its own \(--out_dir=out-other\)$"):
        train(replace(tiny_cfg(tmp_path, char_dataset), dataset=str(other), init_from=str(ckpt)), log=quiet)
    assert ckpt.read_bytes() == before
    # what is not a new model in that out_dir is not refused: an evaluation on the other folder, a resume on it
    cfg, overrides = parse_args(TrainConfig, ["--init_from=resume", f"--out_dir={tmp_path / 'out'}",
                                              f"--dataset={other}", "--eval_only=True"])
    train(cfg, overrides, log=quiet)
    lines = []
    train(tiny_cfg(tmp_path, char_dataset), log=lines.append)  # the same text: replaced, and said
    assert any("holds an earlier run (iter 6" in line for line in lines)
    cfg, overrides = parse_args(TrainConfig, ["--init_from=resume", f"--out_dir={tmp_path / 'out'}",
                                              f"--dataset={other}", "--max_iters=8", "--lr_decay_iters=8"])
    assert train(cfg, overrides, log=quiet)["iters"] == 8


def test_a_resume_on_a_dataset_prepared_again_over_other_characters_is_refused(tmp_path, char_dataset):
    """As many characters, other ones: the vocabulary's size passed, and the resumed model would have trained on ids
    that now mean other characters."""
    from conftest import CORPUS
    from configurator import UserError
    from data.prepare import prepare
    train(tiny_cfg(tmp_path, char_dataset), log=quiet)
    shifted = "".join(chr(ord(c) + 1) for c in CORPUS)  # every character another, as many of them
    (tmp_path / "shifted.txt").write_text(shifted)
    prepare(str(tmp_path / "shifted.txt"), "char", str(tmp_path / "shifted"), log=quiet)
    cfg, overrides = parse_args(TrainConfig, ["--init_from=resume", f"--out_dir={tmp_path / 'out'}",
                                              f"--dataset={tmp_path / 'shifted'}", "--max_iters=8"])
    with pytest.raises(UserError, match=r"shifted's tokenizer is not the one .*ckpt.pt was trained with; resume with "
                                        r"the dataset it was trained on \(--dataset\), prepared as it was"):
        train(cfg, overrides, log=quiet)


def test_notes_name_the_laptop_recipe_a_short_warmup_and_a_checkpoint_about_to_be_replaced(tmp_path):
    from nanogpt.training.notes import earlier_checkpoint, earlier_run, startup_notes
    from train import TrainConfig
    cfg = TrainConfig(dataset="shakespeare_char", batch_size=64, block_size=256, n_layer=6, n_head=6, n_embd=384,
                      max_iters=50, warmup_iters=100, learning_rate=1e-3, out_dir=str(tmp_path))
    (tmp_path / "ckpt.pt").write_bytes(b"an earlier run")
    notes = startup_notes(cfg, str(tmp_path / "ckpt.pt"), earlier=earlier_run(earlier_checkpoint(str(tmp_path / "ckpt.pt"))),
                          cpu_time=(2.0, 30.0))
    assert "use config/shakespeare_char_cpu.py" in notes[0]
    # lr at iter 49 of a 100-iter warmup: 1e-3 * 50 / 101, worked by hand
    assert "rises only to 4.95e-04 of its 1.00e-03" in notes[1]
    assert "holds an earlier run (its iter and val loss could not be read)" in notes[2] and "--init_from=resume" in notes[2]
    assert "best checkpoint" in notes[2] and "at iter 50 at the earliest" in notes[2]
    done = replace(cfg, init_from="resume", warmup_iters=10, lr_decay_iters=50)
    assert startup_notes(done, "x", iter_num=50)[-1] == (
        "the checkpoint is at iter 50 and max_iters is 50: nothing to train; pass --max_iters=N with N > 50 to continue")
    # a planned run's budget counts the time it has spent, so a longer max_iters would not train: more is a new plan
    assert startup_notes(replace(done, minutes=1.0, dataset="data/mine"), "x", iter_num=50)[-1].endswith(
        "nothing to train; the planned run is over (for more minutes, plan a new run, which chooses the model they "
        "buy: python train.py --dataset=data/mine --minutes=M --out_dir=NEW_DIR)")
    short = TrainConfig(max_iters=200, warmup_iters=100, lr_decay_iters=2000, learning_rate=1e-3, min_lr=1e-4,
                        n_layer=1, n_head=1, n_embd=16, block_size=16, out_dir=str(tmp_path / "new"))
    note = startup_notes(short, "nowhere", cpu_time=(0.01, 0.1))
    assert note[0].startswith("max_iters (200) < lr_decay_iters (2000)") and "--lr_decay_iters=200" in note[0]
    small = TrainConfig(dataset="x", batch_size=4, block_size=16, n_layer=1, n_head=1, n_embd=16, max_iters=200,
                        warmup_iters=10, lr_decay_iters=200, out_dir=str(tmp_path / "new"))
    assert startup_notes(small, "nowhere", cpu_time=(0.01, 0.1)) == []


def test_slow_cpu_note_never_suggests_the_recipe_being_run(tmp_path, monkeypatch):
    from nanogpt import REPOSITORY as ROOT
    from nanogpt.training.notes import cpu_time_note
    from train import TrainConfig
    gpu = TrainConfig(dataset="shakespeare_char", max_iters=5000, eval_interval=250)
    laptop = os.path.join(ROOT, "config", "shakespeare_char_cpu.py")
    assert cpu_time_note(gpu, 1.0, 10.0, ["config/shakespeare_char.py"]) is None  # not over SLOW_CPU_ITER
    # 5000 iters x 2 s + 21 evaluations x 60 s = 11,260 s, worked by hand
    note = cpu_time_note(gpu, 2.0, 60.0, [os.path.join(ROOT, "config", "shakespeare_char.py")])
    assert note.startswith("this run is sized for a GPU: on this CPU an iter takes about 2.0 s and each evaluation "
                           "about 60.0 s, 3.1 h for 5000 iters") and "rough" in note
    assert note.endswith("use config/shakespeare_char_cpu.py")
    # the laptop recipe itself, named as the user named it (relative, or through a symlink): only the time
    monkeypatch.chdir(ROOT)
    (tmp_path / "mine.py").symlink_to(laptop)
    for path in ("config/shakespeare_char_cpu.py", "./config/../config/shakespeare_char_cpu.py", str(tmp_path / "mine.py")):
        cpu = TrainConfig(dataset="shakespeare_char", max_iters=2000, eval_interval=250)
        note = cpu_time_note(cpu, 1.5, 3.0, [path])
        assert "use config/" not in note and "sized for a GPU" not in note and f"{path} is a CPU recipe" in note
    # any recipe whose file says device = "cpu" (the Tang fine-tune) is one too, whatever its dataset
    sft = tmp_path / "sft.py"
    sft.write_text('device = "cpu"\n')
    note = cpu_time_note(TrainConfig(dataset="tangshi_chat", init_from="gpt2"), 2.0, 5.0, [str(sft)])
    assert f"{sft} is a CPU recipe" in note and "sized for a GPU" not in note
    # no laptop recipe for the dataset: a fine-tune keeps its shape, so only its batch can shrink
    note = cpu_time_note(TrainConfig(dataset="owt", init_from="gpt2"), 2.0, 5.0, [])
    assert note.endswith("a smaller batch_size or block_size shortens each iter")
    assert "n_layer" in cpu_time_note(TrainConfig(dataset="owt"), 2.0, 5.0, [])


def test_run_times_its_own_model_for_the_cpu_note_and_leaves_training_as_it_was(tmp_path, char_dataset, monkeypatch):
    import nanogpt.training.notes as startup_module
    from nanogpt.device import batch_seconds
    timed = []

    def slow(model, x, y, ctx):  # the real timing (its effects on training are what is checked), then a slow CPU's
        timed.append((x.shape, model.config.n_layer))
        return 5.0 + batch_seconds(model, x, y, ctx)

    baseline = train(tiny_cfg(tmp_path / "a", char_dataset, max_iters=3, dropout=0.1), log=quiet)
    monkeypatch.setattr(startup_module, "batch_seconds", slow)
    lines = []
    laptop = os.path.join(startup_module.REPOSITORY, "config", "shakespeare_char_cpu.py")
    slowed = train(tiny_cfg(tmp_path / "b", char_dataset, max_iters=3, dropout=0.1), log=lines.append,
                   config_files=[laptop])
    assert timed == [(torch.Size([4, 16]), 2)]  # the run's own batch (batch_size x block_size) and model
    note = next(line for line in lines if "an iter takes about" in line)
    assert f"{laptop} is a CPU recipe" in note and "use config/" not in note
    assert slowed["val_loss"] == baseline["val_loss"]  # timing drew no dropout and left no gradients

def test_resume_command_is_shell_quoted(tmp_path, char_dataset, monkeypatch):
    import shlex
    import signal
    out = tmp_path / "my runs" / "it's here"
    original = torch.optim.AdamW.step
    calls = []

    def step(self, *a, **k):
        calls.append(1)
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGINT)
        return original(self, *a, **k)
    monkeypatch.setattr(torch.optim.AdamW, "step", step)
    lines = []
    train(tiny_cfg(tmp_path, char_dataset, out_dir=str(out), max_iters=10), log=lines.append)
    command = next(line for line in lines if "continue with" in line).split("continue with ")[1]
    assert shlex.split(command) == ["python", "train.py", "--init_from=resume", f"--out_dir={out}"]


def test_streamed_samples_equal_batched_ones_and_greedy_prints_one(tmp_path, char_dataset):
    from sample import SEPARATOR
    train(tiny_cfg(tmp_path, char_dataset, max_iters=20, lr_decay_iters=20, eval_interval=20), log=quiet)
    args = ["sample.py", f"--out_dir={tmp_path / 'out'}", "--num_samples=3", "--max_new_tokens=40", "--start=All",
            "--device=cpu", "--temperature=1.5"]
    batched, streamed = run_script(args), run_script(args + ["--stream=True"])
    assert batched.returncode == 0 and streamed.returncode == 0, batched.stderr + streamed.stderr
    assert streamed.stdout == batched.stdout
    assert len(set(batched.stdout.split(SEPARATOR)[:3])) == 3  # three different samples
    greedy = run_script(args + ["--temperature=0"])
    assert greedy.returncode == 0, greedy.stderr
    assert greedy.stdout.count(SEPARATOR) == 1 and "printing 1 sample, not 3" in greedy.stderr


def test_trace_writes_bare_file_names_into_out_dir(tmp_path, char_dataset):
    train(tiny_cfg(tmp_path, char_dataset), log=quiet)
    from conftest import ROOT
    result = run_script([os.path.join(ROOT, "trace.py"), f"--out_dir={tmp_path / 'out'}", "--start=All", "--html=t.html", "--json=t.json",
                         "--steps=1"], cwd=str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "out" / "t.html").exists() and (tmp_path / "out" / "t.json").exists()
    assert not (tmp_path / "t.html").exists()


def train_records(out, kind="train"):
    return [r for r in map(json.loads, open(out / "log.jsonl")) if r["kind"] == kind]


def test_wsd_schedule_holds_the_peak_then_decays_linearly_to_min_lr(tmp_path, char_dataset, monkeypatch):
    """warmup 2, peak 1e-2 until 4 iters before lr_decay_iters=10, then down by 2e-3 an iter to min_lr 2e-3."""
    applied = []
    original = torch.optim.AdamW.step

    def step(self, *a, **k):
        applied.append([group["lr"] for group in self.param_groups])
        return original(self, *a, **k)
    monkeypatch.setattr(torch.optim.AdamW, "step", step)
    cfg = tiny_cfg(tmp_path, char_dataset, lr_schedule="wsd", learning_rate=1e-2, min_lr=2e-3, warmup_iters=2,
                   cooldown_iters=4, lr_decay_iters=10, max_iters=12, eval_interval=12)
    train(cfg, log=quiet)
    # the lr of iterations 0..11, worked by hand: warmup (it + 1) / 3 of the peak, the peak through it 6
    # (10 - it >= 4 iters left), then min_lr + 8e-3 * (10 - it) / 4, then min_lr
    expected = [1e-2 / 3, 2e-2 / 3, 1e-2, 1e-2, 1e-2, 1e-2, 1e-2, 8e-3, 6e-3, 4e-3, 2e-3, 2e-3]
    records = train_records(tmp_path / "out")
    assert [r["iter"] for r in records] == list(range(1, 13))
    assert [r["lr"] for r in records] == pytest.approx(expected, rel=1e-12)
    assert all(len(lrs) == 2 and lrs[0] == lrs[1] for lrs in applied)  # both param groups
    assert [lrs[0] for lrs in applied] == pytest.approx(expected, rel=1e-12)  # and each step used it


def muon_cfg(tmp_path, dataset, **kw):
    return tiny_cfg(tmp_path, dataset, optimizer="muon", muon_lr=0.02, **kw)


def test_muon_through_train_py_trains_the_blocks_matrices(tmp_path, char_dataset, monkeypatch):
    from nanogpt.training.optim import Muon
    before, calls = {}, []
    original = Muon.step

    def step(self, *a, **k):
        params = self.param_groups[0]["params"]
        if not calls:
            before.update((id(p), p.detach().clone()) for p in params)
        calls.append([group["lr"] for group in self.param_groups])
        return original(self, *a, **k)
    monkeypatch.setattr(Muon, "step", step)
    train(muon_cfg(tmp_path, char_dataset, max_iters=20, lr_decay_iters=20, eval_interval=20), log=quiet)
    losses = [r["loss"] for r in train_records(tmp_path / "out")]
    evals = [r["val_loss"] for r in train_records(tmp_path / "out", "eval")]
    assert len(losses) == len(calls) == 20  # one Muon step per iteration
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 0.3 and evals[-1] < evals[0] - 0.4, (losses, evals)
    ckpt = load_checkpoint(str(tmp_path / "out" / "ckpt.pt"))
    assert set(ckpt["optimizer"]) == {"muon", "adamw"}
    matrices = [k for k, v in ckpt["model"].items() if k.startswith("transformer.h.") and v.dim() == 2]
    assert len(matrices) == len(before) == 2 * 4  # c_attn, c_proj, c_fc, c_proj in each of 2 blocks
    for name, initial in zip(matrices, before.values()):  # Muon's params come in the model's order
        assert initial.shape == ckpt["model"][name].shape
        moved = (ckpt["model"][name] - initial).norm() / initial.norm()
        assert moved > 0.1, (name, moved)
    # Muon's lr follows the schedule from its own peak: muon_lr * (the logged lr / learning_rate)
    lrs = [r["lr"] for r in train_records(tmp_path / "out")]
    assert [c[0] for c in calls] == pytest.approx([0.02 * lr / 3e-3 for lr in lrs], rel=1e-12)


def test_muon_resume_matches_uninterrupted_run(tmp_path, char_dataset):
    """optimizer=muon, 8 iters straight vs 4, stop, resume to 8: bit-identical weights and both optimizers' state."""
    kw = dict(dropout=0.1, max_iters=8, lr_decay_iters=8, eval_interval=4)
    train(muon_cfg(tmp_path / "a", char_dataset, **kw), log=quiet)
    train(muon_cfg(tmp_path / "b", char_dataset, **{**kw, "max_iters": 4}), log=quiet)
    cfg, overrides = parse_args(TrainConfig, ["--init_from=resume", f"--out_dir={tmp_path / 'b' / 'out'}",
                                              "--max_iters=8"])
    train(cfg, overrides, log=quiet)
    a = load_checkpoint(str(tmp_path / "a" / "out" / "ckpt.pt"))
    b = load_checkpoint(str(tmp_path / "b" / "out" / "ckpt.pt"))
    assert a["iter_num"] == b["iter_num"] == 8 and a["config"]["optimizer"] == b["config"]["optimizer"] == "muon"
    for key, value in a["model"].items():
        assert torch.equal(value, b["model"][key]), key
    assert set(a["optimizer"]) == set(b["optimizer"]) == {"muon", "adamw"}
    for name in ("muon", "adamw"):
        sa, sb = a["optimizer"][name]["state"], b["optimizer"][name]["state"]
        assert len(sa) == len(sb) > 0 and sa.keys() == sb.keys()
        for i in sa:
            assert sa[i].keys() == sb[i].keys() and all(torch.equal(sa[i][k], sb[i][k]) for k in sa[i]), (name, i)
    assert [r["loss"] for r in train_records(tmp_path / "a" / "out")] == \
        [r["loss"] for r in train_records(tmp_path / "b" / "out")]


def test_target_loss_stops_at_the_first_evaluation_reaching_it(tmp_path, char_dataset):
    kw = dict(max_iters=8, lr_decay_iters=8, eval_interval=2)
    never = train(tiny_cfg(tmp_path / "a", char_dataset, target_loss=0.0, **kw), log=quiet)
    assert never["iters"] == 8 and never["reached"] is None
    evals = {r["iter"]: r["val_loss"] for r in train_records(tmp_path / "a" / "out", "eval")}
    assert list(evals) == [0, 2, 4, 6, 8]
    target = evals[4]  # reached exactly ("at or below"), first at iter 4, and passed again later
    assert evals[0] > target and evals[2] > target and min(evals[6], evals[8]) < target
    summary = train(tiny_cfg(tmp_path / "b", char_dataset, target_loss=target, **kw), log=quiet)
    records = train_records(tmp_path / "b" / "out", "eval")
    assert [r["iter"] for r in records] == [0, 2, 4] and records[-1]["val_loss"] == target
    assert summary["iters"] == 4 and summary["val_loss"] == target
    it, seconds = summary["reached"]
    assert it == 4 and seconds == records[-1]["train_time"] and 0 < seconds <= summary["train_time"]
    assert max(r["iter"] for r in train_records(tmp_path / "b" / "out")) == 4
    assert load_checkpoint(str(tmp_path / "b" / "out" / "ckpt.pt"))["iter_num"] == 4


def test_eval_windows_val_loss_is_the_mean_over_evenly_spread_fixed_windows(tmp_path, char_dataset):
    """5 windows (batches of 4 and 1): the logged val loss equals a loss worked independently from the checkpoint."""
    import numpy as np

    from nanogpt.checkpoint import model_from_checkpoint
    n, block = 5, TINY["block_size"]
    train(tiny_cfg(tmp_path, char_dataset, eval_windows=n, max_iters=3, eval_interval=3), log=quiet)
    logged = train_records(tmp_path / "out", "eval")[-1]
    assert logged["iter"] == 3
    ckpt = load_checkpoint(str(tmp_path / "out" / "ckpt.pt"))
    assert ckpt["iter_num"] == 3
    model = model_from_checkpoint(ckpt).eval()
    meta = json.load(open(char_dataset / "meta.json"))
    val = np.fromfile(char_dataset / "val.bin", dtype=meta["dtype"]).astype(np.int64)
    starts = np.linspace(0, len(val) - block - 1, n).round().astype(np.int64)
    assert starts[0] == 0 and starts[-1] + block + 1 == len(val)  # from the first token to the last
    nll = []
    with torch.no_grad():
        for s in starts:
            logits, _ = model(torch.from_numpy(val[s:s + block])[None])
            logp = torch.log_softmax(logits[0].double(), dim=-1)
            nll.append(-logp[torch.arange(block), torch.from_numpy(val[s + 1:s + block + 1])].mean().item())
    assert logged["val_loss"] == pytest.approx(sum(nll) / n, rel=1e-6, abs=0)
    assert len(set(nll)) == n  # distinct windows, each weighing the same


def test_keep_best_false_writes_no_best_pt(tmp_path, char_dataset):
    train(tiny_cfg(tmp_path, char_dataset, keep_best=False, max_iters=3), log=quiet)
    evals = [r["val_loss"] for r in train_records(tmp_path / "out", "eval")]
    assert len(evals) == 2 and evals[1] < evals[0]  # val loss improved: with keep_best, best.pt would be written
    assert os.path.exists(tmp_path / "out" / "ckpt.pt") and not os.path.exists(tmp_path / "out" / "best.pt")
    assert sorted(os.listdir(tmp_path / "out")) == [".lock", "ckpt.pt", "log.jsonl"]  # .lock: the writer's lock


def test_val_bpb_of_ascii_characters_is_the_loss_in_bits(tmp_path, char_dataset):
    train(tiny_cfg(tmp_path, char_dataset), log=quiet)
    evals = train_records(tmp_path / "out", "eval")
    assert evals and all(r["val_bpb"] == pytest.approx(r["val_loss"] / math.log(2), rel=1e-6) for r in evals)


def test_val_bpb_counts_the_utf8_bytes_of_the_targets(tmp_path):
    """A model that knows nothing (uniform over V tokens) on text of 1-, 2- and 3-byte characters:
    bits per byte = T log2(V) / (UTF-8 bytes of the T targets), worked out from the windows by hand.
    The text is not periodic, so the inputs' bytes differ from the targets': counting the wrong ones shows."""
    import random

    import numpy as np

    from nanogpt.training.batches import Batches, estimate_loss
    from nanogpt.dataset import prepare
    from nanogpt.tokenizer import CharTokenizer, read_meta, token_byte_lengths
    rng = random.Random(0)
    (tmp_path / "in.txt").write_text("".join(rng.choice("aé漢 b\n") for _ in range(2400)), encoding="utf-8")
    prepare(str(tmp_path / "in.txt"), "char", str(tmp_path / "d"), 0.2, log=quiet)
    meta = read_meta(str(tmp_path / "d"))
    V, T, n = meta["vocab_size"], 8, 5

    class Uniform(torch.nn.Module):
        def forward(self, x, y):
            logits = torch.zeros(*x.shape, V)
            return logits, torch.nn.functional.cross_entropy(logits.view(-1, V), y.reshape(-1))
    cfg = TrainConfig(eval_windows=n, eval_iters=1, block_size=T)
    batches = Batches(str(tmp_path / "d"), T, 2, torch.device("cpu"), 0, meta)
    lengths = torch.tensor(token_byte_lengths(CharTokenizer(meta["chars"]), V), dtype=torch.float64)
    out = estimate_loss(Uniform(), batches, cfg, nullcontext(), token_bytes=lengths)
    val = np.fromfile(tmp_path / "d" / "val.bin", dtype=np.uint16)
    starts = np.linspace(0, len(val) - T - 1, n).round().astype(int)
    nbytes = sum(len(meta["chars"][t].encode("utf-8")) for s in starts for t in val[s + 1:s + T + 1])
    input_bytes = sum(len(meta["chars"][t].encode("utf-8")) for s in starts for t in val[s:s + T])
    assert input_bytes != nbytes  # else this text could not tell targets from inputs
    assert out["val_bpb"] == pytest.approx(n * T * math.log2(V) / nbytes, rel=1e-6)  # float32 logits
    assert out["val"] == pytest.approx(math.log(V), rel=1e-6)


def test_val_bpb_counts_no_bytes_for_endoftext(tmp_path):
    """A BPE dataset of many files, each ended by <|endoftext|>: that token is no text, so a model that knows
    nothing (uniform over V) scores T log2(V) bits per window over the bytes of its other targets. Its 13
    characters counted as bytes would lower val_bpb."""
    import numpy as np

    from nanogpt.training.batches import Batches, estimate_loss
    from nanogpt.dataset import prepare
    from nanogpt.training.startup import bytes_per_token
    from nanogpt.tokenizer import read_meta, tokenizer_from_meta
    (tmp_path / "docs").mkdir()
    for i, line in enumerate(CORPUS.splitlines()[:100]):
        (tmp_path / "docs" / f"{i:03d}.txt").write_text(line + " é", encoding="utf-8")
    prepare(str(tmp_path / "docs"), "bpe", str(tmp_path / "d"), 0.2, log=quiet, vocab_size=300)
    meta = read_meta(str(tmp_path / "d"))
    enc, V, T, n = tokenizer_from_meta(meta).enc, meta["vocab_size"], 16, 8
    eot = enc.eot_token

    class Uniform(torch.nn.Module):
        def forward(self, x, y):
            logits = torch.zeros(*x.shape, V)
            return logits, torch.nn.functional.cross_entropy(logits.view(-1, V), y.reshape(-1))
    cfg = TrainConfig(eval_windows=n, eval_iters=1, block_size=T)
    batches = Batches(str(tmp_path / "d"), T, 4, torch.device("cpu"), 0, meta)
    out = estimate_loss(Uniform(), batches, cfg, nullcontext(),
                        token_bytes=bytes_per_token(meta, V, torch.device("cpu"), quiet))
    val = np.fromfile(tmp_path / "d" / "val.bin", dtype=np.uint16)
    targets = [t for s in np.linspace(0, len(val) - T - 1, n).round().astype(int) for t in val[s + 1:s + T + 1]]
    assert targets.count(eot) >= 3  # else this text could not show <|endoftext|> counted
    nbytes = len(enc.decode_bytes([t for t in targets if t != eot]))
    assert out["val_bpb"] == pytest.approx(n * T * math.log2(V) / nbytes, rel=1e-6)


def test_accumulation_splits_over_processes_or_is_refused_with_the_values():
    from configurator import UserError
    from nanogpt.training.distributed import micro_batches
    assert [micro_batches(6, w) for w in (1, 2, 3, 6)] == [6, 3, 2, 1]
    with pytest.raises(UserError, match=r"gradient_accumulation_steps \(3\) must be divisible by the number of "
                                        r"processes \(2\).*e\.g\. 4"):
        micro_batches(3, 2)


@pytest.mark.parametrize("saved, world", [(3, 2), (2, 3)])
def test_resume_checks_the_checkpoints_accumulation_against_the_processes(tmp_path, char_dataset, saved, world):
    """3 micro-batches saved, 2 processes: 1 each would shrink the batch; 2 saved, 3 processes: refused for the
    checkpoint's 2, not the default 40 the command line holds."""
    from configurator import UserError
    from nanogpt.training.startup import run_config
    train(tiny_cfg(tmp_path, char_dataset, max_iters=1, gradient_accumulation_steps=saved), log=quiet)
    ckpt = str(tmp_path / "out" / "ckpt.pt")
    cfg, overrides = parse_args(TrainConfig, ["--init_from=resume", f"--out_dir={tmp_path / 'out'}"])
    with pytest.raises(UserError, match=re.escape(f"gradient_accumulation_steps ({saved}, {ckpt}'s) must be "
                                                  f"divisible by the number of processes ({world})")):
        run_config(cfg, overrides, ckpt, world)
    fixed, overrides = parse_args(TrainConfig, ["--init_from=resume", f"--out_dir={tmp_path / 'out'}",
                                                f"--gradient_accumulation_steps={2 * world}"])
    assert run_config(fixed, overrides, ckpt, world)[0].gradient_accumulation_steps == 2 * world


def test_accumulating_k_micro_batches_gives_the_gradient_of_one_batch_k_times_larger(tmp_path, char_dataset,
                                                                                     monkeypatch):
    """One iteration's gradients over 3 micro-batches of 2 rows equal those of one batch of the same 6 rows,
    in one process; the rows come from one fixed tensor, split as the micro-step index says."""
    from nanogpt.training.batches import Batches
    k, rows = 3, 2
    data = torch.randint(0, 30, (k * rows, TINY["block_size"] + 1), generator=torch.Generator().manual_seed(0))
    original = Batches.get

    def get(self, split, key):
        if key[0] != 0:  # evaluation: its own windows
            return original(self, split, key)
        part = data[key[2] * self.batch_size:(key[2] + 1) * self.batch_size]
        return part[:, :-1], part[:, 1:]
    monkeypatch.setattr(Batches, "get", get)
    grads, step = [], torch.optim.AdamW.step

    def capture(self, *a, **kw):
        grads.append({id(p): p.grad.clone() for g in self.param_groups for p in g["params"]})
        return step(self, *a, **kw)
    monkeypatch.setattr(torch.optim.AdamW, "step", capture)
    for accum, batch in ((k, rows), (1, k * rows)):
        train(tiny_cfg(tmp_path / str(accum), char_dataset, max_iters=1, grad_clip=0.0, batch_size=batch,
                       gradient_accumulation_steps=accum), log=quiet)
    accumulated, whole = [list(g.values()) for g in grads]
    assert len(accumulated) == len(whole) > 0
    for a, b in zip(accumulated, whole):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


def test_a_new_run_interrupted_before_it_saved_keeps_the_earlier_runs_checkpoint(tmp_path, char_dataset, monkeypatch):
    """A scratch run in an out_dir holding a trained checkpoint says what it will replace; Ctrl-C after its
    first iteration leaves that checkpoint (and best.pt) alone and says so."""
    import signal
    train(tiny_cfg(tmp_path, char_dataset, max_iters=4, eval_interval=2), log=quiet)
    out = tmp_path / "out"
    before = {name: (out / name).read_bytes() for name in ("ckpt.pt", "best.pt")}
    best = load_checkpoint(str(out / "ckpt.pt"))["best_val_loss"]
    original, calls = torch.optim.AdamW.step, []

    def step(self, *a, **k):
        calls.append(1)
        if len(calls) == 1:
            os.kill(os.getpid(), signal.SIGINT)  # lets the step finish: the iteration completes
        return original(self, *a, **k)
    monkeypatch.setattr(torch.optim.AdamW, "step", step)
    lines = []
    summary = train(tiny_cfg(tmp_path, char_dataset, max_iters=100, eval_interval=50), log=lines.append)
    assert summary["interrupted"] and summary["iters"] == 1
    note = next(line for line in lines if "holds an earlier run" in line)
    assert f"(iter 4, best val loss {best:.4f})" in note and "at iter 50 at the earliest" in note
    assert {name: (out / name).read_bytes() for name in before} == before
    said = next(line for line in lines if line.startswith("interrupted at iter 1"))
    assert "nothing saved" in said and "keeps the earlier run (iter 4" in said and "--out_dir" in said


@pytest.mark.parametrize("where", ["override", "checkpoint"])
def test_resume_checks_the_memory_of_its_batch_before_allocating(tmp_path, char_dataset, where, monkeypatch):
    """batch_size=10**7 on resume, given on the command line or saved in the checkpoint's config: refused at
    start-up as a scratch run is (about 10^7 x 16 tokens of activations), and the checkpoint is untouched."""
    from configurator import UserError
    from nanogpt.training.batches import Batches
    from nanogpt.checkpoint import save_checkpoint
    train(tiny_cfg(tmp_path, char_dataset, max_iters=1), log=quiet)
    path = tmp_path / "out" / "ckpt.pt"
    args = ["--init_from=resume", f"--out_dir={tmp_path / 'out'}", "--max_iters=2"]
    if where == "checkpoint":
        ckpt = load_checkpoint(str(path))
        ckpt["config"]["batch_size"] = 10 ** 7
        save_checkpoint(ckpt, str(path))
    else:
        args.append(f"--batch_size={10 ** 7}")
    before = path.read_bytes()

    def batch(self, split, ix):
        raise AssertionError(f"a batch of {len(ix)} windows allocated before the memory check")
    monkeypatch.setattr(Batches, "batch", batch)
    cfg, overrides = parse_args(TrainConfig, args)
    with pytest.raises(UserError, match=r"micro-batches of 10000000 x 16 tokens needs about .* TB, more than"):
        train(cfg, overrides, log=quiet)
    assert path.read_bytes() == before


def test_eval_windows_beyond_the_val_splits_windows_are_refused_at_start_up(tmp_path, char_dataset, monkeypatch):
    import numpy as np

    from configurator import UserError
    distinct = len(np.memmap(char_dataset / "val.bin", dtype=np.uint16, mode="r")) - TINY["block_size"]
    linspace, sizes = np.linspace, []
    monkeypatch.setattr(np, "linspace", lambda a, b, n, **kw: sizes.append(n) or linspace(a, b, n, **kw))
    with pytest.raises(UserError, match=rf"eval_windows \(1,000,000,000,000\) is more than the {distinct:,} distinct "
                                        rf"windows of 16 tokens .*; use --eval_windows={distinct} or fewer"):
        train(tiny_cfg(tmp_path, char_dataset, eval_windows=10 ** 12), log=quiet)
    assert sizes == [] and not os.path.exists(tmp_path / "out")
    train(tiny_cfg(tmp_path, char_dataset, eval_windows=distinct, max_iters=0), log=quiet)  # every window: allowed
    assert sizes == [distinct]


def test_a_log_write_that_fails_leaves_no_torn_line_and_the_next_run_appends_whole_lines(tmp_path, char_dataset,
                                                                                           monkeypatch):
    """The disk fills during the first log write (half of it lands): the run stops with the error naming
    log.jsonl, the half is cut back, and the next run's log reads whole."""
    import errno

    from nanogpt.training import metrics
    real = os.write

    def disk_full(fd, data):
        if b'"kind": "config"' in data:  # the log's first write: its header and first record
            real(fd, data[:len(data) // 2])
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, data)
    monkeypatch.setattr(metrics.os, "write", disk_full)
    with pytest.raises(OSError, match="No space left on device") as failed:
        train(tiny_cfg(tmp_path, char_dataset, max_iters=2), log=quiet)
    log = tmp_path / "out" / "log.jsonl"
    assert failed.value.filename == str(log) and log.read_bytes() == b""
    monkeypatch.undo()
    train(tiny_cfg(tmp_path, char_dataset, max_iters=2), log=quiet)
    assert [json.loads(line)["kind"] for line in open(log)][:2] == ["config", "eval"]


def test_a_run_appending_to_a_log_cut_mid_line_starts_on_a_line_of_its_own(tmp_path, char_dataset):
    out = tmp_path / "out"
    out.mkdir()
    (out / "log.jsonl").write_text('{"kind": "config", "init_from": "scratch"}\n{"kind": "eval", "iter": 0, "tra')
    train(tiny_cfg(tmp_path, char_dataset, max_iters=2), log=quiet)
    lines = open(out / "log.jsonl").read().splitlines()
    assert lines[1] == '{"kind": "eval", "iter": 0, "tra' and json.loads(lines[2])["kind"] == "config"
    assert all(json.loads(line) for line in lines[2:])


@pytest.mark.parametrize("link", ["hard", "symbolic"])
def test_a_log_linked_to_a_file_elsewhere_is_refused_and_the_file_untouched(tmp_path, char_dataset, link):
    """out_dir/log.jsonl as a second name (hard link) or a symbolic link of a user's file: the run stops at its
    first record with one line naming the log, and appends nothing to the user's file."""
    from nanogpt.errors import UserError
    out, mine = tmp_path / "out", tmp_path / "mine.txt"
    out.mkdir()
    mine.write_text("precious\n")
    (os.link if link == "hard" else os.symlink)(mine, out / "log.jsonl")
    kind = "a hard link" if link == "hard" else "a symbolic link"
    with pytest.raises(UserError, match=f"refusing to write {re.escape(str(out / 'log.jsonl'))}: .*{kind}"):
        train(tiny_cfg(tmp_path, char_dataset, max_iters=1), log=quiet)
    assert mine.read_text() == "precious\n" and os.stat(mine).st_nlink == (2 if link == "hard" else 1)


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_optimizer_state_of_the_wrong_shape_is_refused_at_load(tmp_path, char_dataset, optimizer):
    from configurator import UserError
    from nanogpt.checkpoint import save_checkpoint
    train(tiny_cfg(tmp_path, char_dataset, max_iters=1, optimizer=optimizer), log=quiet)
    path = tmp_path / "out" / "ckpt.pt"
    ckpt = load_checkpoint(str(path))
    adamw = ckpt["optimizer"]["adamw"] if optimizer == "muon" else ckpt["optimizer"]
    first = adamw["param_groups"][0]["params"][0]  # the token embedding (tied head): (vocab, n_embd)
    adamw["state"][first]["exp_avg"] = adamw["state"][first]["exp_avg"][:, :31]  # a column short
    save_checkpoint(ckpt, str(path))
    cfg, overrides = parse_args(TrainConfig, ["--init_from=resume", f"--out_dir={tmp_path / 'out'}", "--max_iters=2"])
    with pytest.raises(UserError, match=r"ckpt.pt: its optimizer state does not fit the model: exp_avg of "
                                        r"transformer.wte.weight has shape \(34, 31\), the parameter \(34, 32\)"):
        train(cfg, overrides, log=quiet)


def test_a_resumed_run_continues_the_training_clock_and_the_figure(tmp_path, char_dataset):
    """4 iters, then a resume to 8: the checkpoint carries its training time (set here to 1000 s, far beyond
    what a fresh clock could reach), the resumed records go on from it, and plot.py draws iters 0 to 8."""
    pytest.importorskip("matplotlib")
    import plot
    from nanogpt.checkpoint import save_checkpoint
    train(tiny_cfg(tmp_path, char_dataset, max_iters=4, lr_decay_iters=8, eval_interval=2), log=quiet)
    path, out = tmp_path / "out" / "ckpt.pt", tmp_path / "out"
    ckpt = load_checkpoint(str(path))
    logged = train_records(out, "eval")[-1]
    assert logged["iter"] == 4 and logged["train_time"] <= ckpt["train_time"] < logged["train_time"] + 1.0
    ckpt["train_time"] = 1000.0
    save_checkpoint(ckpt, str(path))
    cfg, overrides = parse_args(TrainConfig, ["--init_from=resume", f"--out_dir={out}", "--max_iters=8"])
    summary = train(cfg, overrides, log=quiet)
    resumed = [r for r in train_records(out) if r["iter"] > 4]
    assert [r["iter"] for r in resumed] == [5, 6, 7, 8] and all(r["train_time"] > 1000 for r in resumed)
    assert summary["train_time"] > 1000 and load_checkpoint(str(path))["train_time"] > 1000
    assert [it for it, _, _ in plot.read_evals(str(out))] == [0, 2, 4, 6, 8]


def test_init_from_means_the_same_source_in_every_program(tmp_path, char_dataset):
    """One rule: an out_dir (or its checkpoint file) given as init_from is that checkpoint in every program, so
    sample.py reads it as --out_dir does; "scratch" is train.py's alone, and every program says which forms it
    takes in the same words."""
    from nanogpt.source import Source, check_init_from, init_from_kind
    train(tiny_cfg(tmp_path, char_dataset), log=quiet)
    out = tmp_path / "out"
    assert [init_from_kind(x) for x in ("scratch", "resume", "gpt2", str(out), str(out / "ckpt.pt"), "nowhere")] == [
        "scratch", "resume", "pretrained", "checkpoint", "checkpoint", None]
    args = ["sample.py", "--start=First", "--num_samples=1", "--max_new_tokens=20", "--device=cpu"]
    by_out_dir = run_script(args + [f"--out_dir={out}"])
    for given in (out, out / "ckpt.pt"):
        by_init_from = run_script(args + [f"--init_from={given}", "--out_dir=elsewhere"])
        assert by_init_from.returncode == 0 and by_init_from.stdout == by_out_dir.stdout, by_init_from.stderr
    assert Source(init_from=str(out), ckpt="best.pt").path == str(out / "best.pt")
    with pytest.raises(ValueError, match=r"^init_from must be resume \(out_dir's checkpoint\), a checkpoint \(an "
                                         r"out_dir holding ckpt.pt, or the file\) or gpt2, .*got 'scratch'$"):
        Source(init_from="scratch")
    for program, config in (("train.py", TrainConfig), ("sample.py", Source)):
        with pytest.raises(ValueError, match=r"a checkpoint \(an out_dir holding ckpt.pt, or the file\).*'nowhere' "
                                             r"\(no such checkpoint or directory\)$"):
            config(init_from="nowhere")
    assert check_init_from(str(out), ("resume", "checkpoint")) == "checkpoint"
    result = run_script(["rl.py", "--init_from=gpt2", f"--out_dir={tmp_path / 'rl'}"])
    assert result.returncode == 2 and "pretrained weights without a chat template" in result.stderr, result.stderr
