"""train.py --minutes=N on a text used up well before N: the budget as three runs (plan.py decides; docs/minutes.md,
"More minutes than a text is worth"). Plans of 0.3 N into out_dir/teacher-a and out_dir/teacher-b (the second with
the next seed), then one of 0.4 N into out_dir that learns from the text and from both (--teacher).

Each part is a run of its own: its plan, its log.jsonl, its checkpoints, its Ctrl-C. The whole ends by the budget:
each part by the end of its share, counted from process start, so a part that ends early leaves its time to the
next. out_dir/log.jsonl records the plan in parts and, at the end, the result; a resume of out_dir
(--init_from=resume --out_dir=OUT) goes on from where the parts stopped: a part done is kept, one interrupted is
resumed (keeping its plan), one not begun is planned anew with its share of the budget.
"""
import os
import time
from dataclasses import asdict, replace

from nanogpt.errors import UserError
from nanogpt.training.metrics import Metrics, read_log
from nanogpt.training.plan import minutes_text
from nanogpt.training.resume import resume_command, saved_settings
from nanogpt.training.startup import LOCAL_FIELDS
from nanogpt.training.stopping import Interrupted
from nanogpt.training.train_config import TrainConfig


def records(out_dir):
    """out_dir/log.jsonl's records, or none."""
    path = os.path.join(out_dir, "log.jsonl")
    return read_log(path, note=lambda *a: None) if os.path.isfile(path) else []


def plan_in_parts(out_dir):
    """The plan in parts that out_dir's log records last, if the whole is not done: the record, else None."""
    plan = None
    for r in records(out_dir):
        if r.get("kind") == "plan" and r.get("parts"):
            plan = r
        elif r.get("kind") == "plan_result" and r.get("parts") and plan is not None:
            plan = None  # done: a resume of out_dir is its last part's own
    return plan


def part_state(out_dir, since):
    """A part's run in out_dir: "done" (its plan's result recorded), "started" (a checkpoint saved since the plan
    in parts began, at `since`), or "new". A checkpoint older than `since` is an earlier run's, which a new part
    replaces as any run does."""
    ckpt = os.path.join(out_dir, "ckpt.pt")
    if not os.path.isfile(ckpt) or os.path.getmtime(ckpt) < since:
        return "new"
    kinds = [r["kind"] for r in records(out_dir) if r.get("kind") in ("plan", "plan_result")]
    return "done" if kinds and kinds[-1] == "plan_result" else "started"


def measured(out_dir):
    """The val bpb of a part's best checkpoint, as its log's last plan result says (None where it has none)."""
    results = [r for r in records(out_dir) if r.get("kind") == "plan_result"]
    return results[-1].get("measured_val_bpb") if results else None


def user_settings(plan, cfg, overrides, log):
    """(cfg, given): the user's config and the keys they set, as the plan in parts recorded them, read as a resume
    reads a checkpoint's (typed; a key naming code only from this invocation), with this invocation's local keys
    (out_dir, device, ...)."""
    path = os.path.join(cfg.out_dir, "log.jsonl")
    saved = saved_settings({"config": plan.get("config")}, TrainConfig, path, overrides, log, skip=LOCAL_FIELDS)
    given = {k: saved[k] for k in plan.get("given") or () if k in saved}
    try:
        user = TrainConfig(**{**saved, **{k: getattr(cfg, k) for k in LOCAL_FIELDS}})
    except (TypeError, ValueError) as e:
        raise UserError(f"{path}: the plan in parts records a config that does not load ({e}); train anew in a new "
                        f"--out_dir") from None
    return user, {**given, **{k: v for k, v in overrides.items() if k in LOCAL_FIELDS and k != "init_from"}}


def train_parts(train, cfg, overrides, plan, t_start, log, config_files=()):
    """The parts of `plan` (a plan in parts, new or recorded in cfg.out_dir's log), in order, each a train() of its
    own; the summary of the last (the model out_dir keeps), with the whole's wall time. cfg and overrides: the
    user's, before the plan; a resume's are the resume's own (init_from, out_dir)."""
    resuming = cfg.init_from == "resume"
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise UserError(f"{cfg.out_dir} holds a plan in parts, which runs in one process: resume it with "
                        f"{resume_command('train.py', replace(cfg, init_from='resume'), 1)}")
    if resuming and "minutes" in overrides and overrides["minutes"] != plan["minutes"]:
        raise UserError(f"--minutes={overrides['minutes']:g}: {cfg.out_dir} holds a plan in parts for "
                        f"--minutes={plan['minutes']:g}, and a resumed run keeps its plan; resume without --minutes")
    if resuming:
        user, given = user_settings(plan, cfg, overrides, log)
    else:  # the user's config beside the plan: a part begun after a resume is planned from it
        user, given = cfg, overrides
        plan = {**plan, "started": t_start, "config": asdict(cfg), "given": overrides}
        metrics = Metrics(os.path.join(cfg.out_dir, "log.jsonl"), cfg, log, record=True)
        metrics.record(kind="plan", iter=0, **plan)
        metrics.close()
    budget = plan["minutes"] * 60
    dirs = [os.path.join(cfg.out_dir, part["dir"]) if part["dir"] else cfg.out_dir for part in plan["parts"]]
    teachers = ",".join(d for d, part in zip(dirs, plan["parts"]) if not part["distils"])
    whole = replace(cfg, init_from="resume")  # what a part's Ctrl-C says to run: the whole goes on from there
    share_end, summary = t_start, None

    def quiet(line, *args, **kwargs):  # the user's keys were said once, before the plan: not again in each part
        if not str(line).startswith("override: "):
            log(line, *args, **kwargs)
    try:
        for number, (part, out_dir) in enumerate(zip(plan["parts"], dirs), 1):
            share_end += part["share"] * budget  # where this part's share ends, counted from process start
            state = part_state(out_dir, plan["started"]) if resuming else "new"
            what = "the model, learning from both" if part["distils"] else f"teacher {number} of 2"
            if state == "done":
                log(f"part {number} of 3 ({what}, {out_dir}): done earlier, val bpb {measured(out_dir)}")
                continue
            begin = time.time()
            if state == "started":
                part_cfg = replace(cfg, out_dir=out_dir, init_from="resume")
                part_overrides = {k: v for k, v in overrides.items() if k != "minutes"} | {"out_dir": out_dir}
                log(f"part {number} of 3 ({what}): resuming {out_dir}")
            else:
                # a part begun now: to the end of its share, or after a resume its whole share from now; at least
                # half its share, should the parts before have run past theirs
                left = part["share"] * budget if resuming else share_end - (t_start if number == 1 else begin)
                minutes = round(max(left, part["share"] * budget / 2) / 60, 2)
                keys = dict(out_dir=out_dir, minutes=minutes, seed=part["seed"], plan_teachers=False,
                            teacher=teachers if part["distils"] else "", init_from="scratch")
                part_cfg, part_overrides = replace(user, **keys), {**given, **keys}
                log(f"part {number} of 3 ({what}): a plan of {minutes_text(minutes)} into {out_dir}, seed "
                    f"{part['seed']}" + (f", teachers {teachers}" if part["distils"] else ""))
            summary = train(part_cfg, part_overrides, quiet, t_start=t_start if number == 1 and not resuming else begin,
                            config_files=config_files, whole=whole)
            if summary.get("interrupted"):
                log(f"the three parts go on with {resume_command('train.py', whole, 1)}")
                return summary
    except Interrupted:  # between two parts: each part before has saved what it ran
        log(f"interrupted between parts; the three parts go on with {resume_command('train.py', whole, 1)}")
        return {"iters": None, "val_loss": None, "best_val_loss": None, "time": time.time() - t_start,
                "train_time": None, "interrupted": True, "reached": None}
    seconds = time.time() - t_start
    scores = [measured(d) for d in dirs]
    shown = ["-" if s is None else f"{s:.3f}" for s in scores]
    log(f"three parts: teachers {shown[0]} and {shown[1]}, the model in {cfg.out_dir} {shown[2]} (val bpb of each "
        f"best checkpoint); predicted {plan['predicted_val_bpb']:.3f} +- {plan['predicted_sigma']:.3f}; "
        + (f"{seconds:.0f} s of the {budget:.0f} s budget" if not resuming else f"{seconds:.0f} s since the resume"))
    metrics = Metrics(os.path.join(cfg.out_dir, "log.jsonl"), cfg, log, record=True)
    metrics.record(kind="plan_result", iter=summary["iters"] if summary else 0, parts=True, measured_val_bpb=scores[2],
                   teachers_val_bpb=scores[:2], predicted_val_bpb=plan["predicted_val_bpb"], budget=budget,
                   seconds=seconds, resumed=resuming)
    metrics.close()
    return {**(summary or {}), "time": seconds, "parts": scores}
