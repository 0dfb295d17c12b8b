"""train.py's eval_tasks (train_tasks.py): lm-eval tasks scored at each evaluation on the same items, logged,
found wrong at start-up, and without changing what training computes."""
import json
import math
import random
import shutil
import sys
from functools import partial

import numpy as np
import pytest
import torch

from configurator import UserError, parse_args
from conftest import ROOT, run_script
from nanogpt.checkpoint import load_checkpoint
from nanogpt.harness import NanoGPT
from nanogpt.source import Source, load_model
from test_eval import reference_loglikelihood, write_task
from train import TrainConfig, train

TINY = dict(n_layer=2, n_head=2, n_embd=32, block_size=16, batch_size=4, gradient_accumulation_steps=1, eval_iters=1,
            log_interval=1, learning_rate=3e-3, warmup_iters=2, min_lr=3e-4, device="cpu", compile=False,
            max_iters=2, lr_decay_iters=2, eval_interval=1)
PPL_DOCS = [("Before we", " pr"), ("All:", "\nS"), ("You are all", " r"), ("Resolved.", " re"), ("First", " Ci"),
            ("hear me", " s")]
MC_DOCS = [{"context": "All:\n", "choices": ["Speak", "Resolved", "You"], "label": 0},
           {"context": "First ", "choices": ["Citizen", "All"], "label": 0},
           {"context": "You are all ", "choices": ["resolved", "famish", "speak"], "label": 0},
           {"context": "Speak, ", "choices": ["speak.", "hear"], "label": 0},
           {"context": "A", "choices": ["ll:", "ny"], "label": 1}]
LIMIT = 4  # of 6 and 5 items


@pytest.fixture
def tasks(tmp_path):
    """tiny_ppl, a loglikelihood task whose perplexity depends on every weight, and tiny_mc, multiple choice as
    ours are: YAMLs over JSONL files in tmp_path/tasks."""
    write_task(tmp_path / "tasks", "tiny_mc", MC_DOCS)
    docs = tmp_path / "tasks" / "tiny_ppl.jsonl"
    docs.write_text("".join(json.dumps({"context": c, "target": t}) + "\n" for c, t in PPL_DOCS), encoding="utf-8")
    (tmp_path / "tasks" / "tiny_ppl.yaml").write_text(
        f"task: tiny_ppl\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {docs}\ntest_split: test\n"
        "output_type: loglikelihood\ndoc_to_text: '{{context}}'\ndoc_to_target: '{{target}}'\ntarget_delimiter: ''\n"
        "metric_list:\n  - metric: perplexity\n    aggregation: perplexity\n    higher_is_better: false\n"
        "  - metric: acc\n    aggregation: mean\n    higher_is_better: true\n", encoding="utf-8")
    return tmp_path / "tasks"


def cfg(tmp_path, dataset, tasks=None, **kw):
    extra = {}
    if tasks:
        extra = dict(eval_tasks="tiny_ppl,tiny_mc", eval_tasks_limit=LIMIT, eval_tasks_include_path=str(tasks))
    return TrainConfig(**{**TINY, "out_dir": str(tmp_path / "out"), "dataset": str(dataset), **extra, **kw})


def records(out_dir, kind):
    return [r for r in map(json.loads, open(out_dir / "log.jsonl")) if r["kind"] == kind]


def reference_perplexity(out_dir, docs):
    """exp(-mean log-likelihood) of the targets, from the checkpoint's weights: a numpy log-softmax."""
    model, tok = load_model(Source(out_dir=str(out_dir)), "cpu")
    return math.exp(-np.mean([reference_loglikelihood(model, tok.encode(c), tok.encode(t))[0] for c, t in docs]))


def test_each_evaluation_logs_the_tasks_scores_on_the_first_items_of_the_weights_of_that_iter(tmp_path, char_dataset,
                                                                                            tasks):
    """Dropout on: a model scored in train mode would not match the checkpoint's perplexity."""
    lines = []
    train(cfg(tmp_path, char_dataset, tasks, dropout=0.2), log=lambda line, **k: lines.append(line))
    logged = records(tmp_path / "out", "tasks")
    assert [r["iter"] for r in logged] == [0, 1, 2]
    assert all(r["tiny_ppl/n"] == r["tiny_mc/n"] == LIMIT for r in logged)
    assert {"tiny_mc/acc", "tiny_mc/acc_norm", "tiny_mc/acc_stderr", "train_time", "seconds"} <= set(logged[-1])
    acc = logged[-1]["tiny_mc/acc"]
    assert logged[-1]["tiny_mc/acc_stderr"] == pytest.approx(math.sqrt(acc * (1 - acc) / (LIMIT - 1)))
    want = reference_perplexity(tmp_path / "out", PPL_DOCS[:LIMIT])  # ckpt.pt: iter 2
    assert logged[-1]["tiny_ppl/perplexity"] == pytest.approx(want, rel=1e-5)
    assert logged[0]["tiny_ppl/perplexity"] != logged[-1]["tiny_ppl/perplexity"]
    console = [line for line in lines if line.startswith("iter 2: tiny_ppl")]
    assert len(console) == 1 and f"tiny_mc acc {acc:.3f} ± " in console[0] and "(4 items)" in console[0], console


def test_a_run_whose_evaluation_draws_random_numbers_trains_the_weights_of_one_without_eval_tasks(
        tmp_path, char_dataset, tasks, monkeypatch):
    """Dropout on, and the scoring drawing from torch's, numpy's and python's RNGs (as a task's sampling or
    lm-eval itself may): the same weights and losses, bit for bit."""
    train(cfg(tmp_path / "plain", char_dataset, dropout=0.1), log=lambda *a, **k: None)
    scored = NanoGPT._loglikelihood_tokens

    def drawing(self, requests, disable_tqdm=False):
        torch.rand(3), np.random.rand(3), random.random()
        return scored(self, requests, disable_tqdm)
    monkeypatch.setattr(NanoGPT, "_loglikelihood_tokens", drawing)
    train(cfg(tmp_path / "tasks", char_dataset, tasks, dropout=0.1), log=lambda *a, **k: None)
    a, b = (load_checkpoint(str(tmp_path / run / "out" / "ckpt.pt")) for run in ("plain", "tasks"))
    for key, value in a["model"].items():
        assert torch.equal(value, b["model"][key]), key
    losses = [[r["loss"] for r in records(tmp_path / run / "out", "train")] for run in ("plain", "tasks")]
    assert losses[0] == losses[1] and len(records(tmp_path / "tasks" / "out", "tasks")) == 3



def draws_after_runs(tmp_path, char_dataset, tasks, monkeypatch, device):
    """For a run without eval_tasks and one with them (whose scoring draws from every RNG): the numbers numpy's,
    python's and (on CUDA) the device's RNG give next, each run started from the same seeds."""
    scored = NanoGPT._loglikelihood_tokens

    def drawing(self, requests, disable_tqdm=False):
        np.random.rand(3), random.random(), torch.rand(3, device=device)
        return scored(self, requests, disable_tqdm)
    monkeypatch.setattr(NanoGPT, "_loglikelihood_tokens", drawing)
    draws = []
    for run, with_tasks in (("plain", None), ("tasks", tasks)):
        np.random.seed(5), random.seed(5)
        train(cfg(tmp_path / run, char_dataset, with_tasks, dropout=0.1, device=device), log=lambda *a, **k: None)
        draws.append((np.random.rand(3).tolist(), random.random(), torch.rand(3, device=device).tolist()))
    assert len(records(tmp_path / "tasks" / "out", "tasks")) == 3
    return draws


def test_numpys_and_pythons_rng_after_a_run_with_eval_tasks_are_those_of_a_run_without(tmp_path, char_dataset, tasks,
                                                                                      monkeypatch):
    """Training draws from neither (its batches have their own generators), so only what comes after the
    run can tell: the numbers they give next are the ones a run without eval_tasks leaves."""
    plain, scored = draws_after_runs(tmp_path, char_dataset, tasks, monkeypatch, "cpu")
    assert scored == plain


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cudas_rng_after_a_run_with_eval_tasks_is_that_of_a_run_without(tmp_path, char_dataset, tasks, monkeypatch):
    plain, scored = draws_after_runs(tmp_path, char_dataset, tasks, monkeypatch, "cuda")
    assert scored == plain

def copy_our_task(tmp_path):
    """tasks/tangshi_next_line.yaml and its loader in a folder without tasks/data."""
    (tmp_path / "ours").mkdir()
    for name in ("tangshi_next_line.yaml", "prepare.py"):
        shutil.copy(f"{ROOT}/tasks/{name}", tmp_path / "ours" / name)
    return tmp_path / "ours"


@pytest.mark.parametrize("case", ["unknown name", "no lm_eval", "no data", "no folder"])
def test_a_mistake_in_eval_tasks_stops_the_run_at_start_up(tmp_path, char_dataset, tasks, monkeypatch, case):
    import lm_eval.tasks
    # lm-eval's own 14,000 YAMLs are indexed to look a name up: not here (seconds to a minute)
    monkeypatch.setattr(lm_eval.tasks, "TaskManager", partial(lm_eval.tasks.TaskManager, include_defaults=False))
    overrides, message = {
        "unknown name": ({"eval_tasks": "tiny_mc,tiny_mx"}, r"unknown task 'tiny_mx' \(did you mean 'tiny_mc'\?\)"),
        "no lm_eval": ({}, r"eval_tasks needs lm-evaluation-harness: pip install lm-eval"),
        "no data": ({"eval_tasks": "tangshi_next_line", "eval_tasks_include_path": str(copy_our_task(tmp_path))},
                    r"ours/data/tangshi_next_line.jsonl not found; run python tasks/prepare.py"),
        "no folder": ({"eval_tasks_include_path": str(tmp_path / "nowhere")}, r"is not a folder of task YAMLs"),
    }[case]
    if case == "no lm_eval":
        monkeypatch.setitem(sys.modules, "lm_eval.evaluator", None)  # import lm_eval.evaluator: ImportError
    with pytest.raises(UserError, match=message):
        train(cfg(tmp_path, char_dataset, tasks, **overrides), log=lambda *a, **k: None)
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())  # nothing trained or logged


def test_characters_outside_the_vocabulary_stop_a_resumed_run_before_it_trains(tmp_path, char_dataset, tasks):
    train(cfg(tmp_path, char_dataset, max_iters=2), log=lambda *a, **k: None)
    tang = [{"context": "床前明月光，", "choices": ["疑是地上霜。", "AAAAAA"], "label": 0}]
    write_task(tasks, "tiny_tang", tang)
    before = (tmp_path / "out" / "log.jsonl").read_text()
    run, overrides = parse_args(TrainConfig, ["--init_from=resume", f"--out_dir={tmp_path / 'out'}", "--max_iters=4",
                                              "--eval_tasks=tiny_tang", f"--eval_tasks_include_path={tasks}"])
    with pytest.raises(UserError, match="task tiny_tang: its text has 12 characters outside the model's vocabulary"):
        train(run, overrides, log=lambda *a, **k: None)
    assert (tmp_path / "out" / "log.jsonl").read_text() == before


def test_a_task_without_its_data_is_one_line_and_exit_2_from_the_command_line(tmp_path, char_dataset):
    result = run_script(["train.py", *[f"--{k}={v}" for k, v in TINY.items()], f"--dataset={char_dataset}",
                         f"--out_dir={tmp_path / 'out'}", "--eval_tasks=tangshi_next_line",
                         f"--eval_tasks_include_path={copy_our_task(tmp_path)}"])
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.strip().splitlines()[-1] == (f"error: {tmp_path}/ours/data/tangshi_next_line.jsonl not found; "
                                                      "run python tasks/prepare.py")
    assert not (tmp_path / "out" / "log.jsonl").exists()


@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_two_processes_score_the_tasks_once_per_evaluation_without_waiting_on_each_other(tmp_path, char_dataset, tasks,
                                                                                         parallel):
    """DDP: rank 0 scores its whole copy while the other waits at the next collective. FSDP: every rank runs
    each forward (the all-gathers need them all), rank 0 logs."""
    launcher = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "train.py"]
    settings = {**TINY, "gradient_accumulation_steps": 2, "parallel": parallel, "dataset": char_dataset,
                "out_dir": tmp_path / "out", "eval_tasks": "tiny_ppl", "eval_tasks_limit": LIMIT,
                "eval_tasks_include_path": tasks}
    result = run_script(launcher + [f"--{k}={v}" for k, v in settings.items()], timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    logged = records(tmp_path / "out", "tasks")
    assert [r["iter"] for r in logged] == [0, 1, 2] and result.stdout.count(": tiny_ppl perplexity") == 3
    want = reference_perplexity(tmp_path / "out", PPL_DOCS[:LIMIT])
    assert logged[-1]["tiny_ppl/perplexity"] == pytest.approx(want, rel=1e-5)
