"""Score a checkpoint on lm-evaluation-harness tasks, in process (no server): the field's own numbers.

    python tasks/prepare.py  # our next-line tasks, from the val splits
    python eval.py --out_dir=out-tangshi --tasks=tangshi_next_line --include_path=tasks
    python eval.py --out_dir=out-shakespeare-char --tasks=shakespeare_next_line --include_path=tasks --limit=100
    python eval.py --init_from=gpt2 --tasks=hellaswag,arc_easy  # GPT-2's weights; lm-eval downloads the data

The model is harness.NanoGPT (loglikelihood, loglikelihood_rolling, generate_until
over out_dir/ckpt.pt with its own tokenizer). Prints lm-eval's table and writes its
results JSON to --output_path (default out_dir/eval_results.json). docs/eval.md
says what each task measures.
"""
import json
import os
import sys
from dataclasses import dataclass

from configurator import parse_args, report_overrides
from nanogpt.device import Device, resolve_device
from nanogpt.errors import UserError
from nanogpt.files import write_text_atomically
from nanogpt.program import run_main
from nanogpt.source import Source


@dataclass
class EvalConfig(Source, Device):
    tasks: str = ""  # lm-eval task names, comma-separated: tangshi_next_line,hellaswag
    include_path: str | None = None  # a folder of task YAMLs added to lm-eval's (ours: tasks)
    limit: float | None = None  # at most this many examples per task (a fraction if below 1): for trying things
    num_fewshot: int | None = None  # examples shown before each question; None: the task's own choice
    batch_size: int = 16  # requests per forward
    output_path: str | None = None  # the results JSON; None: out_dir/eval_results.json

    def __post_init__(self):
        super().__post_init__()
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {self.batch_size}")
        if self.num_fewshot is not None and self.num_fewshot < 0:
            raise ValueError(f"num_fewshot must be >= 0 (or None: each task's own), got {self.num_fewshot}")
        if self.limit is not None and self.limit <= 0:
            raise ValueError(f"limit must be positive (a count, or a fraction below 1), got {self.limit}")

    @property
    def task_list(self):
        return [t.strip() for t in self.tasks.split(",") if t.strip()]


def read_caches_if_offline():
    """Where the Hugging Face Hub cannot be reached, read only Hugging Face's caches, as HF_HUB_OFFLINE=1
    does: datasets would retry each task's download for half a minute before failing (hf.from_hf reads
    the weights' cache at once itself)."""
    import datasets.config
    from huggingface_hub import constants

    from nanogpt.interop.hf import hub_reachable
    if constants.is_offline_mode() or hub_reachable():
        return
    os.environ["HF_HUB_OFFLINE"] = "1"  # for what reads it later
    constants.HF_HUB_OFFLINE = datasets.config.HF_HUB_OFFLINE = True  # both libraries read these at each request


def fetch_error(e):
    """A UserError for a task whose data could not be fetched (offline, no such dataset), else None."""
    chain = [e]
    while chain[-1].__cause__ or chain[-1].__context__:
        chain.append(chain[-1].__cause__ or chain[-1].__context__)
    names = " ".join(f"{type(x).__module__}.{type(x).__name__}" for x in chain)
    if not any(m in names for m in ("datasets.", "huggingface_hub.", "requests.", "ConnectionError")):
        return None
    detail = str(e).splitlines()[0] if str(e) else type(e).__name__
    return UserError(f"a task's data could not be fetched from the Hugging Face Hub ({detail}); connect to the "
                     f"network once (datasets caches it under HF_HOME, which is read offline), or choose tasks with "
                     f"local data (--include_path=tasks)")


def evaluate(lm, cfg, manager):
    import lm_eval
    limit = int(cfg.limit) if cfg.limit is not None and cfg.limit >= 1 else cfg.limit
    try:
        return lm_eval.simple_evaluate(model=lm, tasks=cfg.task_list, num_fewshot=cfg.num_fewshot, limit=limit,
                                       task_manager=manager, log_samples=False)
    except UserError:
        raise
    except ValueError as e:
        if "Sample larger than population" not in str(e):  # lm-eval drawing the few-shot examples
            raise
        raise UserError(f"--num_fewshot={cfg.num_fewshot}: a task has fewer examples to show than that; choose "
                        f"fewer") from None
    except Exception as e:
        error = fetch_error(e)
        if error is None:
            raise
        raise error from None


def main(argv):
    cfg, overrides = parse_args(EvalConfig, argv)
    report_overrides(overrides, EvalConfig(), log=lambda line: print(line, file=sys.stderr))
    if not cfg.task_list:
        raise UserError("no tasks: name them with --tasks=a,b (e.g. --tasks=tangshi_next_line --include_path=tasks)")
    output_path = cfg.output_path or os.path.join(cfg.out_dir, "eval_results.json")  # init_from=gpt2: out/
    if os.path.isdir(output_path):  # before the evaluation: its results would have nowhere to go
        raise UserError(f"--output_path={output_path} is a directory; name the results file (e.g. "
                        f"--output_path={os.path.join(output_path, 'eval_results.json')})")
    read_caches_if_offline()
    from lm_eval.utils import handle_non_serializable, make_table

    from nanogpt.harness import NanoGPT, quiet_logging, task_manager
    quiet_logging()
    # the model first: GPT-2's weights not found offline is said before lm-eval indexes its own tasks (seconds)
    lm = NanoGPT(out_dir=cfg.out_dir, ckpt=cfg.ckpt, device=resolve_device(cfg.device), batch_size=cfg.batch_size,
                 init_from=cfg.init_from)
    if cfg.num_fewshot is not None and cfg.num_fewshot > lm.max_length:  # each example takes a token at least
        raise UserError(f"--num_fewshot={cfg.num_fewshot}: the model's context holds {lm.max_length} tokens, so at "
                        f"most {lm.max_length} examples fit before a question; choose fewer")
    manager = task_manager(cfg.include_path, cfg.task_list)
    results = evaluate(lm, cfg, manager)
    print(make_table(results))
    if "groups" in results:
        print(make_table(results, "groups"))
    os.makedirs(os.path.dirname(output_path) or ".", exist_ok=True)
    write_text_atomically(output_path, json.dumps(results, indent=2, default=handle_non_serializable,
                                                  ensure_ascii=False))
    print(f"results written to {output_path}", file=sys.stderr)


if __name__ == "__main__":
    run_main(main)
