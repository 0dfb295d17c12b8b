"""train.py --teacher: distillation from trained models (nanogpt/training/distill.py)."""
import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from conftest import CORPUS, ROOT, run_script
from configurator import parse_args
from nanogpt.checkpoint import load_checkpoint, model_from_checkpoint
from nanogpt.training.distill import distill_loss
from test_train import quiet, tiny_cfg
from train import TrainConfig, train


def test_the_loss_is_the_text_and_the_kl_to_the_teachers_mean_probability_worked_in_numpy():
    """(1 - w) * ce + w * KL(mean of the teachers' probabilities || the student's), averaged over positions:
    the mean of probabilities (an ensemble), not of log-probabilities, and the KL in that direction."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 3, 5, generator=g)
    teachers = [torch.randn(2, 3, 5, generator=g) * 3, torch.randn(2, 3, 5, generator=g) * 3]
    ce = torch.tensor(1.7)

    def softmax(z):
        z = z.numpy().astype(np.float64).reshape(-1, 5)
        e = np.exp(z - z.max(1, keepdims=True))
        return e / e.sum(1, keepdims=True)
    mean = (softmax(teachers[0]) + softmax(teachers[1])) / 2
    kl = (mean * (np.log(mean) - np.log(softmax(logits)))).sum(1).mean()  # 6 positions
    for w in (0.0, 0.3, 1.0):
        got = distill_loss(logits, ce, teachers, w)
        assert got.item() == pytest.approx((1 - w) * 1.7 + w * kl, rel=1e-5)
    # positions whose target is -1 (a chat dataset's prompts) are left out of the KL as of the text's loss
    targets = torch.tensor([[0, -1, 2], [-1, -1, 4]])
    keep = targets.reshape(-1).numpy() != -1
    kl_kept = (mean * (np.log(mean) - np.log(softmax(logits)))).sum(1)[keep].mean()
    assert distill_loss(logits, ce, teachers, 1.0, targets).item() == pytest.approx(kl_kept, rel=1e-5)
    assert distill_loss(logits, ce, teachers, 0.5, torch.full((2, 3), -1)).item() == pytest.approx(0.85)
    # one teacher that is the student: nothing left to learn from it
    assert distill_loss(logits, ce, [logits.clone()], 1.0).item() == pytest.approx(0.0, abs=1e-6)


def kl_to(teacher_dir, student_dir, dataset):
    """Mean KL(teacher || student) over the val split's first windows: how closely the student predicts as the
    teacher does."""
    models = [model_from_checkpoint(load_checkpoint(str(d / "ckpt.pt"))).eval() for d in (teacher_dir, student_dir)]
    val = np.fromfile(dataset / "val.bin", dtype=np.uint16).astype(np.int64)
    x = torch.from_numpy(val[:4 * 16].reshape(4, 16))
    with torch.no_grad():
        t, s = (F.log_softmax(m(x)[0], -1) for m in models)
    return (t.exp() * (t - s)).sum(-1).mean().item()


def test_a_distilled_model_learns_its_teachers_predictions_and_a_resume_keeps_them(tmp_path, char_dataset):
    """A student trained only on a teacher's distribution (distill=1) ends closer to it than the same student
    trained on the text alone; a resumed student goes on distilling from the teacher its checkpoint names. The
    teacher learned the text backwards (the same characters): what it predicts the text does not teach."""
    from data.prepare import prepare
    backwards = tmp_path / "backwards.txt"
    backwards.write_text(CORPUS[::-1], encoding="utf-8")
    prepare(str(backwards), "char", str(tmp_path / "backwards"), 0.1, log=quiet)
    teacher = tmp_path / "teacher"
    train(tiny_cfg(teacher, tmp_path / "backwards", max_iters=30, lr_decay_iters=30, eval_interval=10,
                   learning_rate=1e-2), log=quiet)
    student = dict(max_iters=40, lr_decay_iters=40, eval_interval=20, learning_rate=1e-2,
                   seed=7)
    train(tiny_cfg(tmp_path / "text", char_dataset, **student), log=quiet)
    lines = []
    train(tiny_cfg(tmp_path / "taught", char_dataset, teacher=str(teacher / "out"), distill=1.0, **student),
          log=lines.append)
    assert f"teacher: {teacher / 'out' / 'ckpt.pt'} (" in "\n".join(lines)
    taught = kl_to(teacher / "out", tmp_path / "taught" / "out", char_dataset)
    alone = kl_to(teacher / "out", tmp_path / "text" / "out", char_dataset)
    assert taught < 0.5 * alone, (taught, alone)
    cfg, overrides = parse_args(TrainConfig, ["--init_from=resume", f"--out_dir={tmp_path / 'taught' / 'out'}",
                                              "--max_iters=44"])
    lines = []
    train(cfg, overrides, log=lines.append)
    assert any(line.startswith("distilling: 0 of the loss from the text, 1 from its teacher's predictions")
               for line in lines), lines


def test_a_teacher_that_cannot_teach_this_run_is_one_line(tmp_path, char_dataset):
    """A missing checkpoint, a teacher in the run's own out_dir, one of another tokenizer, one that sees less context
    than the run, and a weight outside [0, 1]: one line each, exit 2, nothing written, the teacher kept."""
    teacher = tmp_path / "t"
    train(tiny_cfg(teacher, char_dataset, max_iters=2, lr_decay_iters=2, eval_interval=1), log=quiet)
    teacher_bytes = (teacher / "out" / "ckpt.pt").read_bytes()
    (tmp_path / "link.pt").symlink_to(teacher / "out" / "ckpt.pt")  # a link elsewhere to the run's own checkpoint
    other = tmp_path / "other.txt"
    other.write_text("zyxwvutsrq 0123456789\n" * 400, encoding="utf-8")
    from data.prepare import prepare
    prepare(str(other), "char", str(tmp_path / "other"), 0.1, log=quiet)
    args = ["train.py", f"--dataset={char_dataset}", "--device=cpu", "--n_layer=1", "--n_head=2", "--n_embd=16",
            "--block_size=16", "--batch_size=2", "--gradient_accumulation_steps=1", "--max_iters=2", "--compile=False",
            f"--out_dir={tmp_path / 'student'}"]
    cases = {f"--teacher={tmp_path / 'nowhere'}": "--teacher: no training checkpoint at",
             f"--teacher={teacher / 'out'},": "has an empty name",
             "--distill=1.5": "distill must be in [0, 1]"}
    for extra, said in cases.items():
        r = run_script([*args, extra, f"--teacher={teacher / 'out'}"] if extra.startswith("--distill") else
                       [*args, extra])
        assert r.returncode == 2 and said in r.stderr and "Traceback" not in r.stderr, (extra, r.stderr)
    for own in (teacher / "out" / "ckpt.pt", tmp_path / "link.pt"):  # it would write over its teacher
        r = run_script([*args, f"--teacher={own}", f"--out_dir={teacher / 'out'}"])
        assert r.returncode == 2 and "is in this run's out_dir" in r.stderr, (own, r.stderr)
    r = run_script([*args, f"--teacher={teacher / 'out'}", "--block_size=32"])
    assert r.returncode == 2 and "sees 16 tokens of context, fewer than this run's block_size (32)" in r.stderr
    r = run_script([*args, f"--dataset={tmp_path / 'other'}", f"--teacher={teacher / 'out'}"])
    assert r.returncode == 2 and "a teacher must be trained on this dataset" in r.stderr, r.stderr
    assert not (tmp_path / "student").exists() or not any((tmp_path / "student").iterdir())
    assert (teacher / "out" / "ckpt.pt").read_bytes() == teacher_bytes


def test_a_teachers_claimed_shape_is_checked_against_its_weights_before_a_plan_builds_it(tmp_path, char_dataset):
    """A teacher file whose model_args claim a width of 2**20 over the weights of a width of 16: a plan
    (--minutes) would time that model's forward passes, building it from the claim (16 TB of weights); the file is
    refused when read, in one line, before anything is built."""
    train(tiny_cfg(tmp_path / "t", char_dataset, max_iters=2, lr_decay_iters=2, eval_interval=1), log=quiet)
    ckpt = torch.load(tmp_path / "t" / "out" / "ckpt.pt", weights_only=True)
    ckpt["model_args"]["n_embd"] = 2 ** 20
    torch.save(ckpt, tmp_path / "claims.pt")
    r = run_script(["train.py", f"--dataset={char_dataset}", "--device=cpu", "--compile=False", "--minutes=0.2",
                    f"--teacher={tmp_path / 'claims.pt'}", f"--out_dir={tmp_path / 'student'}"])
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "claims.pt: weights do not match its model_args" in r.stderr, r.stderr
    assert "plan:" not in r.stdout  # refused before the plan's probe


def test_a_resume_reads_the_same_teachers_from_anywhere_and_says_where_their_names_came_from(tmp_path, char_dataset):
    """A teacher given by a relative path is saved absolute, so a resume started in another directory reads the same
    file; a teacher gone by then is one line that names the checkpoint that named it and how to go on."""
    train(tiny_cfg(tmp_path / "t", char_dataset, max_iters=2, lr_decay_iters=2, eval_interval=1), log=quiet)
    args = [os.path.join(ROOT, "train.py"), f"--dataset={char_dataset}", "--device=cpu", "--n_layer=1", "--n_head=2",
            "--n_embd=16", "--block_size=16", "--batch_size=2", "--gradient_accumulation_steps=1", "--compile=False",
            "--eval_interval=2", "--eval_iters=1"]
    r = run_script([*args, "--max_iters=2", "--teacher=t/out", f"--out_dir={tmp_path / 's'}"], cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    saved = load_checkpoint(str(tmp_path / "s" / "ckpt.pt"))["config"]["teacher"]
    assert saved == str(tmp_path / "t" / "out" / "ckpt.pt")
    (tmp_path / "t").rename(tmp_path / "gone")
    r = run_script([*args, "--init_from=resume", "--max_iters=4", f"--out_dir={tmp_path / 's'}"], cwd=ROOT)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert f"named by {tmp_path / 's' / 'ckpt.pt'}'s config" in r.stderr and "--teacher= goes on without" in r.stderr
    r = run_script([*args, "--init_from=resume", "--max_iters=4", f"--out_dir={tmp_path / 's'}", "--teacher="])
    assert r.returncode == 0 and "distilling" not in r.stdout, r.stderr
    # a weight of 0, or an evaluation, distils nothing: the teacher it names is not read, gone or not
    for extra in ("--distill=0", "--eval_only=True"):
        r = run_script([*args, "--init_from=resume", "--max_iters=6", f"--out_dir={tmp_path / 's'}", extra,
                        f"--teacher={tmp_path / 'gone' / 'out'}.missing"])
        assert r.returncode == 0 and "teacher:" not in r.stdout, (extra, r.stderr)
    r = run_script([*args, "--max_iters=2", "--distill=0.5", f"--out_dir={tmp_path / 'alone'}"])
    assert r.returncode == 0 and "note: --distill weighs what --teacher names" in r.stdout, r.stderr


def test_the_benchmarks_ensemble_predicts_the_mean_of_its_models_probabilities(tiny_config):
    """runs/minutes_bench.py's Ensemble, which scores two plans together: its logits' softmax is the mean of the
    models' probabilities, worked in numpy."""
    from conftest import runs_module
    from model import GPT
    bench = runs_module("minutes_bench")
    models = []
    for seed in (1, 2):
        torch.manual_seed(seed)
        models.append(GPT(tiny_config).eval())
        with torch.no_grad():
            models[-1].lm_head.weight.mul_(20)  # predictions far apart: a mean of logs would differ
    x = torch.randint(0, tiny_config.vocab_size, (2, 8))
    with torch.no_grad():
        logits, _ = bench.Ensemble(models)(x)
        probs = [torch.softmax(m(x)[0].double(), -1).numpy() for m in models]
    assert np.allclose(torch.softmax(logits.double(), -1).numpy(), (probs[0] + probs[1]) / 2, atol=1e-6)


def test_the_benchmark_reads_the_latest_run_of_a_log_that_holds_several(tmp_path):
    """runs/minutes_bench.py's plan_of and --rescore read the plan of the run whose best.pt is there: a log.jsonl only
    grows, so an out_dir used again holds the runs before it; a plan in parts' third run writes into the same log and
    is part of its run."""
    import json

    from conftest import runs_module
    bench = runs_module("minutes_bench")
    plan = {"kind": "plan", "iter": 0, "iters": 100, "epochs": 2.0, "dropout": 0.0}
    third = {"kind": "config", "iter": 0, "plan_teachers": False,
             "teacher": f"{tmp_path}/teacher-a/ckpt.pt,{tmp_path}/teacher-b/ckpt.pt"}
    records = [{"kind": "config", "iter": 0}, {**plan, "shape": "S1", "predicted_val_bpb": 2.5},
               {"kind": "plan_result", "iter": 100, "measured_val_bpb": 2.6},
               {"kind": "config", "iter": 0}, {**plan, "shape": "S3", "predicted_val_bpb": 2.2, "parts": True},
               third, {**plan, "shape": "S2", "predicted_val_bpb": 2.3},
               {"kind": "plan_result", "iter": 100, "measured_val_bpb": 2.25, "parts": True}]
    (tmp_path / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records) + '{"kind": "tr')
    row = bench.plan_of(str(tmp_path))
    assert (row["shape"], row["predicted_val_bpb"], row["parts"], row["measured_val_bpb"]) == ("S3", 2.2, True, 2.25)
