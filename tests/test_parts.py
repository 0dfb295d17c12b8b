"""train.py --minutes=N on a text used up well before N: three runs, two teachers and a model that learns from both
(nanogpt/training/parts.py), their budget, their Ctrl-C and their resume."""
import json
import math
import os
import re
import signal
import time

import numpy as np
import pytest
import torch

import train as train_module
from nanogpt.training import plan as planning
from nanogpt.errors import UserError
from nanogpt.out_dir import OutDirLock
from nanogpt.source import Source, load_model
from nanogpt.training import parts
from nanogpt.training.parts import REVISED_SIGMA, better, checked, measured, plan_in_parts, user_settings
from nanogpt.training.train_config import TrainConfig
from test_train import TINY
from train import train

SHAPE = dict(n_layer=2, n_embd=64, n_head=2)  # the shape set: one candidate, quick to probe and to train


def records(out_dir, kind=None):
    with open(os.path.join(out_dir, "log.jsonl")) as f:
        return [r for r in map(json.loads, f) if kind is None or r.get("kind") == kind]


def saved(path):
    return torch.load(path, map_location="cpu", weights_only=False)


@pytest.fixture
def split_small_budgets(monkeypatch):
    """A minute's budget split as 10 minutes are: on a text of a few KB each part ends within seconds (a minute, not
    less: a share of it must buy the fewest iterations a plan runs twice over, on a loaded machine too)."""
    monkeypatch.setattr(planning, "DISTILL_MINUTES", 0.1)


def test_a_text_used_up_early_trains_two_teachers_then_a_model_from_both_within_the_budget(
        tmp_path, char_dataset, split_small_budgets, monkeypatch):
    monkeypatch.setattr(planning, "WARM_EPOCHS", math.inf)  # a text of a few KB: the third runs far more epochs
    out = str(tmp_path / "out")
    keys = dict(dataset=str(char_dataset), out_dir=out, minutes=1, device="cpu", **SHAPE)
    start, lines = time.time(), []
    summary = train(TrainConfig(**keys), keys, log=lines.append, t_start=start)
    assert time.time() - start <= 60 + 10  # the whole, within the 10 s the plan promises
    a, b = (os.path.join(out, name) for name in planning.TEACHER_DIRS)
    student = saved(os.path.join(out, "ckpt.pt"))["config"]
    # the model learns from both teachers, by absolute path, at the default weight; the teachers differ in seed
    assert student["teacher"] == f"{os.path.abspath(a)}/ckpt.pt,{os.path.abspath(b)}/ckpt.pt"
    assert student["distill"] == 0.8 and not student["plan_teachers"]
    assert [saved(os.path.join(d, "ckpt.pt"))["config"]["seed"] for d in (a, b)] == [1337, 1338]
    # it starts from the weights of the teacher whose best checkpoint scored lower over the same windows: its first
    # evaluation is that checkpoint's, far below a new model's (about log2 of the vocabulary a byte)
    ranked = next(line for line in lines if str(line).startswith("the teachers over the same "))
    scores = [float(part.split()[1]) for part in ranked.split(": ")[1].split(" (")[0].split(", ")]
    assert scores[(a, b).index(student["init_from"])] == min(scores)
    first = records(out, "eval")[0]
    assert first["iter"] == 0 and first["val_bpb"] == pytest.approx(min(scores), rel=0.02)
    assert "the shape of the teacher whose weights it starts from" in records(out, "plan")[-1]["why"][2]
    # each part runs to the end of its share, counted from process start: the first 0.3 of the budget, and a part
    # that ends early (these do: the text is used up) leaves its time to the next
    minutes = [records(d, "plan")[-1]["minutes"] for d in (a, b, out)]
    assert minutes[0] == pytest.approx(0.3) and 0.3 < minutes[1] < 0.6 and 0.4 < minutes[2] < 1
    # out_dir's log: the plan in parts first, its result last, the student's own plan between
    log = [r for r in records(out) if r["kind"] in ("plan", "plan_result")]
    assert log[0]["parts"] and log[0]["started"] == pytest.approx(start) and log[-1]["parts"] is True
    assert log[-1]["measured_val_bpb"] == pytest.approx(summary["best_val_bpb"])
    assert summary["parts"][:2] == [records(d, "plan_result")[-1]["measured_val_bpb"] for d in (a, b)]
    assert any("three parts: teachers" in line for line in lines)
    # the prediction, revised once the teachers are measured: the law's for the three, by the ratio of the teachers'
    # best val bpb to the law's for them (a text harder than the rule reads is so for all three; a text this small
    # has each prediction capped at its hardness, and the revision is of the law's, before the caps)
    teachers = [(records(d, "plan")[-1]["law_val_bpb"], records(d, "plan_result")[-1]["measured_val_bpb"])
                for d in (a, b)]
    revised = log[0]["law_val_bpb"] * (teachers[0][1] + teachers[1][1]) / (teachers[0][0] + teachers[1][0])
    assert log[-1]["revised_val_bpb"] == pytest.approx(revised)
    said = next(line for line in lines if str(line).startswith("the teachers measured "))
    was = log[0]["predicted_val_bpb"]
    assert f"revised by that, {revised:.3f} +- {revised * REVISED_SIGMA:.3f} (it was {was:.3f})" in said
    assert parts.revised(log[0], [a, str(tmp_path / "none")]) is None  # a teacher without a plan: no revision
    assert any("the 2 teachers' forward passes and the loss against them are in the time" in line for line in records(out, "plan")[-1]["why"])
    assert not any(str(line).startswith("override: seed") for line in lines)  # a part's keys are its line's


def test_the_revision_scales_the_laws_prediction_not_a_small_texts_capped_one(tmp_path):
    """A text under the hardness sample has each plan's prediction capped at its hardness; the revision must cancel
    the law's error on the text, so it scales the law's figure for the three by the teachers' measured against the
    law's for them (worked by hand), and a plan from before the cap, which records no law_val_bpb, its prediction."""
    import json
    teachers = []
    for name, law, bpb in (("teacher-a", 3.0, 2.70), ("teacher-b", 3.2, 2.86)):
        d = tmp_path / name
        d.mkdir()
        rows = [{"kind": "plan", "iter": 0, "predicted_val_bpb": 2.54, "law_val_bpb": law},
                {"kind": "eval", "iter": 10, "val_loss": 1.9, "val_bpb": bpb + 0.1, "train_time": 1.0},
                {"kind": "eval", "iter": 20, "val_loss": 1.8, "val_bpb": bpb, "train_time": 2.0}]
        (d / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        teachers.append(str(d))
    value, sigma, pairs = parts.revised({"predicted_val_bpb": 2.54, "law_val_bpb": 2.9}, teachers)
    assert pairs == [(3.0, 2.70), (3.2, 2.86)] and value == pytest.approx(2.9 * (2.70 + 2.86) / (3.0 + 3.2))
    assert parts.revised({"predicted_val_bpb": 2.4}, teachers)[0] == pytest.approx(2.4 * 5.56 / 6.2)
    assert parts.revised({"predicted_val_bpb": 2.4, "law_val_bpb": "2.9"}, teachers)[0] == pytest.approx(2.4 * 5.56 / 6.2)


def test_the_third_starts_from_the_teacher_better_over_the_same_windows_whatever_its_own_log_says(
        tmp_path, char_dataset, monkeypatch):
    # two teachers of one shape: a trains 40 iterations and b 1, each evaluating over windows of its own count;
    # b's log then claims a val bpb far below a's (its own windows could have said so)
    dirs = [str(tmp_path / name) for name in planning.TEACHER_DIRS]
    for out_dir, iters, windows in zip(dirs, (40, 1), (24, 40)):
        keys = dict(TINY, dataset=str(char_dataset), out_dir=out_dir, max_iters=iters, lr_decay_iters=iters,
                    eval_interval=iters, eval_windows=windows)
        train(TrainConfig(**keys), keys, log=lambda *a: None)
    with open(os.path.join(dirs[1], "log.jsonl"), "a") as f:
        f.write(json.dumps({"kind": "eval", "iter": 1, "val_loss": 0.01, "val_bpb": 0.01, "train_time": 1.0}) + "\n")
    assert measured(dirs[1]) < measured(dirs[0])
    lines = []
    assert better(dirs, TrainConfig(dataset=str(char_dataset), device="cpu"), lines.append) == dirs[0]
    # the scores said are each model's over the same 40 windows, the more of the two counts: worked here from the
    # windows' definition (starts spread evenly over val, block_size tokens each) and the summed loss in bits over
    # the bytes of the targets (one a character of this ASCII text)
    val = torch.from_numpy(np.fromfile(os.path.join(char_dataset, "val.bin"), dtype=np.uint16).astype(np.int64))
    starts = np.linspace(0, len(val) - TINY["block_size"] - 1, 40).round().astype(np.int64)
    rows = torch.stack([val[s:s + TINY["block_size"] + 1] for s in starts])
    expected = []
    for out_dir in dirs:
        model = load_model(Source(init_from=out_dir))[0]
        with torch.no_grad():
            logits, _ = model(rows[:, :-1])
        nats = torch.nn.functional.cross_entropy(logits.flatten(0, 1), rows[:, 1:].flatten(), reduction="sum")
        expected.append(nats.item() / math.log(2) / rows[:, 1:].numel())
    said = lines[-1].split(": ")[1].split(" (")[0]
    assert lines[-1].startswith("the teachers over the same 40 val windows: ")
    assert [float(part.split()[1]) for part in said.split(", ")] == pytest.approx(expected, abs=1e-5)
    assert expected[0] < expected[1]
    # windows beyond the val split's distinct ones are the split's (a teacher that evaluated over random batches
    # counts as MIN_WINDOWS, more than a tiny split holds)
    val_windows = len(val) - TINY["block_size"]
    monkeypatch.setattr(parts, "MIN_WINDOWS", val_windows + 100)
    for out_dir in dirs:
        ckpt = saved(os.path.join(out_dir, "ckpt.pt"))
        ckpt["config"]["eval_windows"] = 0
        torch.save(ckpt, os.path.join(out_dir, "ckpt.pt"))
    assert better(dirs, TrainConfig(dataset=str(char_dataset), device="cpu"), lines.append) == dirs[0]
    assert lines[-1].startswith(f"the teachers over the same {val_windows} val windows: ")
    # one teacher with a checkpoint is the one; none, a new model
    os.remove(os.path.join(dirs[0], "ckpt.pt"))
    assert better(dirs, TrainConfig(dataset=str(char_dataset), device="cpu"), lines.append) == dirs[1]
    assert better([str(tmp_path / "none")], TrainConfig(), lines.append) == "scratch"


def test_ctrl_c_in_a_part_names_the_whole_and_a_resume_goes_on_from_that_part(
        tmp_path, char_dataset, split_small_budgets, monkeypatch):
    out = str(tmp_path / "out")
    keys = dict(dataset=str(char_dataset), out_dir=out, minutes=1, device="cpu", **SHAPE)
    step = train_module.Run.step

    def interrupted_in_b(run, loss):  # Ctrl-C after iteration 20 of the second teacher
        step(run, loss)
        if run.cfg.out_dir.endswith("teacher-b") and run.iter_num == 20:
            os.kill(os.getpid(), signal.SIGINT)
    monkeypatch.setattr(train_module.Run, "step", interrupted_in_b)
    lines = []
    summary = train(TrainConfig(**keys), keys, log=lines.append, t_start=time.time())
    assert summary["interrupted"]
    a, b = (os.path.join(out, name) for name in planning.TEACHER_DIRS)
    assert saved(os.path.join(b, "ckpt.pt"))["iter_num"] == 20 and not os.path.exists(os.path.join(out, "ckpt.pt"))
    said = [line for line in lines if "continue with" in str(line)]
    assert said and said[0].endswith(f"continue with python train.py --init_from=resume --out_dir={out}")
    teacher_a = open(os.path.join(a, "ckpt.pt"), "rb").read()

    monkeypatch.setattr(train_module.Run, "step", step)
    resume = dict(init_from="resume", out_dir=out)
    # an evaluation of out_dir is never a resume of the parts: out_dir has no model yet, and nothing is written
    before = open(os.path.join(out, "log.jsonl")).read()
    with pytest.raises(UserError, match="no checkpoint"):
        train(TrainConfig(**resume, eval_only=True), {**resume, "eval_only": True}, log=lambda *a: None)
    assert open(os.path.join(out, "log.jsonl")).read() == before
    # another budget is refused, and the new plan it points to is of the dataset the plan in parts recorded
    with pytest.raises(UserError, match=f"plan a new run, which chooses the model they buy: python train.py "
                                        f"--dataset={re.escape(str(char_dataset))} --minutes=M"):
        train(TrainConfig(**resume, minutes=5), {**resume, "minutes": 5}, log=lambda *a: None)
    lines = []
    summary = train(TrainConfig(**resume), resume, log=lines.append)
    assert not summary["interrupted"] and summary["parts"][2] is not None
    assert open(os.path.join(a, "ckpt.pt"), "rb").read() == teacher_a  # done: kept as it was
    assert any("part 1 of 3" in line and "done earlier" in line for line in lines)
    assert [r["iter"] for r in records(b, "config")] == [0, 20]  # resumed where it stopped, not begun again
    assert len(records(b, "plan")) == 1  # and keeping its plan
    student = saved(os.path.join(out, "ckpt.pt"))["config"]
    assert student["teacher"].split(",") == [os.path.abspath(os.path.join(d, "ckpt.pt")) for d in (a, b)]
    assert student["dataset"] == str(char_dataset) and student["n_embd"] == 64  # the user's keys, from the plan
    assert records(out, "plan_result")[-1]["parts"] is True
    # done: a resume now is the model's own, which has nothing left to train
    lines = []
    train(TrainConfig(**resume), resume, log=lines.append)
    assert not any("part 1 of 3" in str(line) for line in lines)


def test_a_plan_in_parts_takes_no_key_that_names_code_from_its_log(tmp_path):
    """A resume reads the user's config from out_dir/log.jsonl as it reads a checkpoint's: typed, and a key that
    leads to code (a folder of task YAMLs) only from this invocation."""
    plan = {"config": {"dataset": "data/x", "n_layer": 3, "eval_tasks_include_path": str(tmp_path / "evil")},
            "given": {"n_layer": 3, "eval_tasks_include_path": str(tmp_path / "evil")}}
    notes = []
    user, given = user_settings(plan, TrainConfig(out_dir=str(tmp_path), device="cpu"),
                                {"out_dir": str(tmp_path), "init_from": "resume", "device": "cpu"}, notes.append)
    assert user.n_layer == 3 and user.dataset == "data/x" and user.device == "cpu"
    assert user.eval_tasks_include_path == TrainConfig().eval_tasks_include_path
    assert given == {"n_layer": 3, "device": "cpu"} and any("names eval_tasks_include_path" in n for n in notes)
    # keys this resume sets reach the parts it begins, as they reach the one it resumes
    mine = str(tmp_path / "mine")
    user, given = user_settings(plan, TrainConfig(out_dir=str(tmp_path)), {"init_from": "resume", "batch_size": 8,
                                                                          "eval_tasks_include_path": mine}, notes.append)
    assert user.batch_size == 8 and user.eval_tasks_include_path == mine and given["batch_size"] == 8


def test_a_later_run_in_out_dir_ends_the_plan_in_parts_and_a_damaged_record_is_one_line(tmp_path):
    """A resume of out_dir goes on with the plan in parts only while the runs after its record are its third part's;
    a plain run there later (or a plan of one run) is what a resume continues. The record's numbers and config are
    checked before they are used."""
    out = tmp_path / "out"
    out.mkdir()
    third = {"kind": "config", "iter": 0, "plan_teachers": False,
             "teacher": f"{out}/teacher-a/ckpt.pt,{out}/teacher-b/ckpt.pt"}
    plan = {"kind": "plan", "iter": 0, "parts": [{"dir": "teacher-a"}], "minutes": 10, "started": 1.0,
            "predicted_val_bpb": 2.0, "predicted_sigma": 0.1, "config": {"dataset": "d"}, "given": {}}

    def log_of(*rows):
        (out / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        return plan_in_parts(str(out))
    assert log_of({"kind": "config", "iter": 0}, plan)["minutes"] == 10
    assert log_of(plan, third, {"kind": "eval", "iter": 5, "train_time": 1.0})["minutes"] == 10  # the third's own
    assert log_of(plan, {"kind": "config", "iter": 0, "plan_teachers": True}) is None  # a run of its own after it
    assert log_of(plan, third, {"kind": "plan_result", "iter": 9, "parts": True}) is None  # done
    path = str(out / "log.jsonl")
    assert checked(plan, path) is plan
    for damage in ({"started": "x"}, {"minutes": None}, {"predicted_val_bpb": float("nan")}, {"config": "x"},
                   {"given": [1]}):
        with pytest.raises(UserError, match="the plan in parts records"):
            checked({**plan, **damage}, path)


def test_a_plan_in_parts_into_an_out_dir_in_use_is_refused_before_it_trains(tmp_path, char_dataset,
                                                                             split_small_budgets):
    out = str(tmp_path / "out")
    keys = dict(dataset=str(char_dataset), out_dir=out, minutes=1, device="cpu", **SHAPE)
    held = OutDirLock(out).acquire()  # another run, writing there
    try:
        with pytest.raises(UserError, match="is in use by"):
            train(TrainConfig(**keys), keys, log=lambda *a: None, t_start=time.time())
    finally:
        held.release()
    assert not os.path.exists(os.path.join(out, "teacher-a")) and not os.path.exists(os.path.join(out, "log.jsonl"))
