"""lm-evaluation-harness tasks scored at each evaluation of a training run (train.py's eval_tasks).

    python tasks/prepare.py && python train.py config/tangshi_cpu.py --eval_tasks=tangshi_next_line

Everything that can be wrong (lm_eval missing, an unknown name, a task's data missing, characters
outside the model's vocabulary) is found at start-up, before training spends time. Each evaluation
scores the same items: the first eval_tasks_limit of each task (our tasks' files are already in a
seeded random order). The in-memory model is scored in eval mode without gradients, and every RNG
of training (torch, CUDA, numpy, python) is saved before and restored after, so a run with
eval_tasks trains the very weights of one without.
"""
import math
import time
from contextlib import contextmanager
from functools import partial

import torch

from nanogpt.checkpoint import rng_state, set_rng_state
from nanogpt.errors import UserError
from nanogpt.files import find_folder
from nanogpt.tokenizer import tokenizer_from_meta

BINARY = ("acc", "acc_norm", "exact_match")  # 0 or 1 per item: the stderr of their mean is sqrt(p (1 - p) / (n - 1))
FEWSHOT_SEED = 1234  # lm-eval's default


def task_scores(cfg, model, meta, rank, sharded):
    """The TaskScores of this process, or None: without eval_tasks, and on ranks other than 0 unless the model
    is sharded (FSDP: every rank runs each forward, its all-gathers with the others')."""
    if not cfg.eval_tasks or (rank != 0 and not sharded):
        return None
    return TaskScores(cfg, model, tokenizer_from_meta(meta))


def include_folder(path):
    """path as given (from the working directory), else beside train.py (the default: tasks)."""
    found = find_folder(path)
    if found is not None:
        return found
    raise UserError(f"eval_tasks_include_path={path} is not a folder of task YAMLs (ours: tasks, beside train.py)")


@contextmanager
def kept_rng():
    """Every RNG training draws from, as it was before the block."""
    state = rng_state()
    try:
        yield
    finally:
        set_rng_state(state)


class TaskScores:
    """The tasks named in cfg.eval_tasks, loaded once; score(model) -> {task: {metric: value}}, logged by log."""

    def __init__(self, cfg, model, tokenizer):
        self.names = [t.strip() for t in cfg.eval_tasks.split(",") if t.strip()]
        self.limit = cfg.eval_tasks_limit
        try:
            import lm_eval.evaluator  # noqa: F401
        except ImportError:
            raise UserError("eval_tasks needs lm-evaluation-harness: pip install lm-eval "
                            "(or drop --eval_tasks)") from None
        from nanogpt.harness import NanoGPT, quiet_logging, task_manager
        quiet_logging()
        with kept_rng(), quiet_progress():
            self.tasks = task_manager(include_folder(cfg.eval_tasks_include_path), self.names).load(self.names)
            for task in self.tasks["tasks"].values():  # as simple_evaluate sets them
                if task.get_config("num_fewshot") is None:
                    task.set_config(key="num_fewshot", value=0)
                task.set_fewshot_seed(seed=FEWSHOT_SEED)
            self.lm = NanoGPT(model=model, tokenizer=tokenizer)
            self.check_vocabulary()

    def check_vocabulary(self):
        """A character model's vocabulary holds every character of the items scored (at start-up, not at
        the first evaluation, which a resumed run reaches only after eval_interval iters)."""
        for task in self.tasks["tasks"].values():
            task.build_all_requests(limit=self.limit, rank=0, world_size=1)
            self.lm.check_vocabulary(task.instances, lambda r: r.args)

    def score(self, ctx):
        """{task: {metric: value}} on the first eval_tasks_limit items of each task; the model's mode and
        every RNG as they were."""
        from lm_eval.evaluator import evaluate
        model = self.lm.model
        training = model.training
        model.eval()
        try:
            with kept_rng(), torch.no_grad(), ctx, quiet_progress():
                results = evaluate(lm=self.lm, task_dict=self.tasks, limit=self.limit, bootstrap_iters=0,
                                   log_samples=False)
        finally:
            model.train(training)
        return {name: metrics(results["results"][name], results["n-samples"][name]["effective"])
                for name in self.tasks["tasks"]}

    def log(self, metrics_log, ctx, it, **times):
        """Score, then one console line and one "tasks" record: {task}/{metric}, {task}/{metric}_stderr,
        {task}/n."""
        start = time.time()
        scores = self.score(ctx)
        seconds = time.time() - start
        record, parts = {}, []
        for name, values in scores.items():
            record.update({f"{name}/{k}": v for k, v in values.items()})
            shown = [f"{k} {v:.3f}" + (f" ± {values[k + '_stderr']:.3f}" if k + "_stderr" in values else "")
                     for k, v in values.items() if k != "n" and not k.endswith("_stderr")]
            parts.append(f"{name} {', '.join(shown)} ({values['n']} items)")
        metrics_log.write(f"iter {it}: {'; '.join(parts)} [{seconds:.1f} s]", kind="tasks", iter=it, seconds=seconds,
                          **times, **record)


def metrics(task_results, n):
    """lm-eval's "metric,filter" values as {metric: value} (the filter named where it is not "none"), with the
    stderr of the 0-or-1 metrics, and n, the items scored."""
    out = {}
    for key, value in task_results.items():
        metric, _, filter_name = key.partition(",")
        if not filter_name or metric.endswith("_stderr") or not isinstance(value, (int, float)):
            continue
        name = metric if filter_name == "none" else f"{metric}:{filter_name}"
        out[name] = float(value)
        if metric in BINARY and n > 1:
            out[f"{name}_stderr"] = math.sqrt(value * (1 - value) / (n - 1))
    out["n"] = n
    return out


@contextmanager
def quiet_progress():
    """No lm-eval progress bars (building requests, tokenizing them) between training's log lines."""
    import lm_eval.api.model
    import lm_eval.api.task
    modules = (lm_eval.api.model, lm_eval.api.task)
    bars = [module.tqdm for module in modules]
    for module, bar in zip(modules, bars):
        module.tqdm = partial(silent, bar)
    try:
        yield
    finally:
        for module, bar in zip(modules, bars):
            module.tqdm = bar


def silent(bar, *args, **kwargs):
    return bar(*args, **{**kwargs, "disable": True})  # over a caller's disable=False
