"""train.py --minutes=N on a text the budget uses up: the budget as three runs (plan.py decides; docs/minutes.md,
"More minutes than a text is worth"). Plans of 0.3 N into out_dir/teacher-a and out_dir/teacher-b (the second with
the next seed), then one of 0.4 N into out_dir that learns from the text and from both (--teacher), starting from the
weights of the one with the lower val loss over the same val windows (--init_from) if it is planned plan.WARM_EPOCHS
or fewer.

Each part is a run of its own: its plan, its log.jsonl, its checkpoints, its Ctrl-C. The whole ends by the budget:
each part by the end of its share, counted from process start, so a part that ends early leaves its time to the
next. out_dir/log.jsonl records the plan in parts (with the user's config) and, at the end, the result; a resume of
out_dir (--init_from=resume --out_dir=OUT) goes on from where the parts stopped: a part done is kept, one
interrupted is resumed (keeping its plan), one not begun is planned anew with its share of the budget. A later run
of its own in out_dir (a config record that is not the third part's) ends the plan in parts: a resume is that run's.
"""
import os
import time
from dataclasses import asdict, replace

from nanogpt.checkpoint import load_checkpoint, model_from_checkpoint
from nanogpt.dataset import prepared_dir
from nanogpt.device import autocast, resolve_device, resolve_dtype
from nanogpt.errors import UserError
from nanogpt.out_dir import OutDirLock, latest_form
from nanogpt.source import checkpoint_file
from nanogpt.tokenizer import read_meta
from nanogpt.training.batches import Batches, split_loss
from nanogpt.training.metrics import Metrics, read_log
from nanogpt.training.plan import (MIN_WINDOWS, TEACHER_DIRS, WARM_EPOCHS, damaged, minutes_text, more_minutes,
                                   plan_parts, positive, predicted_text, recorded_plan)
from nanogpt.training.resume import resume_command, saved_settings
from nanogpt.training.startup import LOCAL_FIELDS, bytes_per_token
from nanogpt.training.stopping import Interrupted, StopFlag
from nanogpt.training.train_config import TrainConfig


def records(out_dir):
    """out_dir/log.jsonl's records, or none."""
    path = os.path.join(out_dir, "log.jsonl")
    return read_log(path, note=lambda *a: None) if os.path.isfile(path) else []


def is_third_part(record):
    """True for the config record of a plan in parts' third run: one run, learning from the two teachers."""
    names = [os.path.basename(os.path.dirname(p)) for p in str(record.get("teacher") or "").split(",")]
    return record.get("plan_teachers") is False and names == list(TEACHER_DIRS)


def plan_in_parts(out_dir):
    """The plan in parts that out_dir's log records last, if it is not done and no run of its own followed it: the
    record, else None."""
    plan = None
    for r in records(out_dir):
        if r.get("kind") == "plan" and r.get("parts"):
            plan = r
        elif plan is not None and r.get("kind") == "plan_result" and r.get("parts"):
            plan = None  # done: a resume of out_dir is its third part's own
        elif plan is not None and r.get("kind") == "config" and not is_third_part(r):
            plan = None  # a later run of its own in out_dir: a resume is that run's
    return plan


def checked(plan, path):
    """The recorded plan in parts, its fields checked (a log may come from anyone): one line where one is wrong."""
    for key in ("minutes", "started", "predicted_val_bpb", "predicted_sigma"):
        if positive(plan.get(key)) is None:
            raise damaged(path, "the plan in parts", key, plan.get(key), "a positive number")
    if not isinstance(plan.get("config"), dict) or not isinstance(plan.get("given"), dict):
        raise UserError(f"{path}: the plan in parts records no config of yours to plan its parts from; train anew in "
                        f"a new --out_dir")
    return plan


def part_state(out_dir, since):
    """A part's run in out_dir: "done" (its plan's result recorded), "started" (a checkpoint saved since the plan
    in parts began, at `since`), or "new". A checkpoint older than `since` is an earlier run's, which a new part
    replaces as any run does."""
    ckpt = latest_form(os.path.join(out_dir, "ckpt.pt"))  # ckpt.pt, or ckpt.dcp with --parallel=fsdp
    if not os.path.exists(ckpt) or os.path.getmtime(ckpt) < since:
        return "new"
    kinds = [r["kind"] for r in records(out_dir) if r.get("kind") in ("plan", "plan_result")]
    return "done" if kinds and kinds[-1] == "plan_result" else "started"


def measured(out_dir):
    """The val bpb of a part's best checkpoint: its lowest val loss's since its last plan (None where it has none)."""
    evals = []
    for r in records(out_dir):
        if r.get("kind") == "plan":
            evals = []
        elif r.get("kind") == "eval" and r.get("val_bpb") is not None:
            evals.append(r)
    return min(evals, key=lambda r: r["val_loss"])["val_bpb"] if evals else None


def better(teachers, cfg, log):
    """The teacher (an out_dir) whose checkpoint (ckpt.pt: a plan's best val loss) has the lower val loss over the
    same fixed val windows, whose weights the model starts from where its plan is short (plan.WARM_EPOCHS); "scratch"
    where none has a checkpoint. Each teacher's own evaluations read as many windows as its plan afforded, a set of
    their own, too few to rank two models on: both are scored here over the same windows, as many as the more of
    the two read (at most the val split's), in the third's time. cfg: the user's."""
    found = [(d, path) for d in teachers if (path := checkpoint_file(d)) is not None]
    if len(found) < 2:
        return found[0][0] if found else "scratch"
    models, windows, batch = [], [], []
    for _, path in found:  # one checkpoint in memory at a time: the weights are kept, the optimizer's state is not
        ckpt = load_checkpoint(path)
        models.append(model_from_checkpoint(ckpt, path, dropout=0.0).eval())
        saved = ckpt.get("config") or {}
        n, b = saved.get("eval_windows"), saved.get("batch_size")
        windows.append(n if type(n) is int and n > 0 else MIN_WINDOWS)
        batch.append(b if type(b) is int and b > 0 else MIN_WINDOWS // 2)
        del ckpt
    device = resolve_device(cfg.device)
    ctx = autocast(device, resolve_dtype(cfg.dtype, device))
    data_dir = prepared_dir(cfg.dataset)
    meta = read_meta(data_dir)
    vocab_size = models[0].config.vocab_size
    batches = Batches(data_dir, min(m.config.block_size for m in models), min(batch), device, cfg.seed, meta,
                      vocab_size)
    windows = min(max(windows), batches.distinct_windows("val"))
    token_bytes = bytes_per_token(meta, vocab_size, device, lambda *a: None)
    scores = []
    for model in models:  # on the device one at a time
        scores.append(split_loss(model.to(device), batches.windows("val", windows), ctx, device,
                                 token_bytes=token_bytes))
        model.to("cpu")
    shown = ", ".join(f"{os.path.basename(d)} {loss if bpb is None else bpb:.5f}"
                      for (d, _), (loss, bpb) in zip(found, scores))
    log(f"the teachers over the same {windows} val windows: {shown} (val {'loss' if token_bytes is None else 'bpb'})")
    return found[min(range(len(found)), key=lambda i: scores[i][0])][0]


# The plan in parts' prediction, revised once its teachers are measured: a text harder or easier than the study's
# rule reads is so for all three runs, so the prediction takes the ratio of the teachers' measured val bpb to what
# their own plans predicted. Over the 22 plans in parts run on the AMD EPYC (西游记's and 三国演义's first 300 KB,
# Pride and Prejudice's first 100 KB; 4.55 to 10 minutes) the plan's prediction was off by 5.5% rms (-10.2% to
# +0.8%: vernacular Chinese reads easier to the rule than it is), the revision by 2.0% rms (-4.4% to +3.0%). Plans in
# parts from 1.5 to 10 minutes on a faster EPYC (Zen 4; eight, most of them 西游记's 300 KB): -3.7% to +1.5%
REVISED_SIGMA = 0.020


def law_of(plan):
    """A plan's prediction by the law alone (law_val_bpb: before a small text's cap at its hardness), else its
    prediction (a plan from before the cap); None where it records neither as a positive number."""
    return positive((plan or {}).get("law_val_bpb")) or positive((plan or {}).get("predicted_val_bpb"))


def revised(plan, teachers):
    """(val bpb, sigma, the teachers' (predicted, measured)): the plan in parts' prediction revised by its teachers'
    measurements (REVISED_SIGMA): the law's, scaled by how the teachers measured against the law's for them, so
    that the law's error on this text cancels; None where a teacher has no plan of its own or no score."""
    pairs = [(law_of(recorded_plan(d)[0]), measured(d)) for d in teachers]
    if not pairs or any(p is None or m is None for p, m in pairs):
        return None
    value = law_of(plan) * sum(m for _, m in pairs) / sum(p for p, _ in pairs)
    return value, value * REVISED_SIGMA, pairs


def user_settings(plan, cfg, overrides, log):
    """(cfg, given): the user's config and the keys they set, as the plan in parts recorded them, read as a resume
    reads a checkpoint's (typed; a key naming code only from this invocation), with the keys this resume sets laid
    over them."""
    path = os.path.join(cfg.out_dir, "log.jsonl")
    saved = saved_settings({"config": plan["config"]}, TrainConfig, path, overrides, log, skip=LOCAL_FIELDS)
    given = {k: saved[k] for k in plan["given"] if k in saved}
    now = {k: v for k, v in overrides.items() if k not in ("init_from", "minutes", "out_dir")}
    try:
        user = TrainConfig(**{**saved, **{k: getattr(cfg, k) for k in LOCAL_FIELDS}, **now})
    except (TypeError, ValueError) as e:
        raise UserError(f"{path}: the plan in parts records a config that does not load ({e}); train anew in a new "
                        f"--out_dir") from None
    return user, {**given, **now}


def train_parts(train, cfg, overrides, plan, t_start, log, config_files=()):
    """The parts of `plan` (a plan in parts, new or recorded in cfg.out_dir's log), in order, each a train() of its
    own; the summary of the last (the model out_dir keeps), with the whole's wall time. cfg and overrides: the
    user's, before the plan; a resume's are the resume's own (init_from, out_dir)."""
    resuming = cfg.init_from == "resume"
    whole = replace(cfg, init_from="resume")  # what a part's Ctrl-C says to run: the whole goes on from there
    again = resume_command("train.py", whole, 1)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise UserError(f"{cfg.out_dir} holds a plan in parts, which runs in one process: resume it with {again}")
    path = os.path.join(cfg.out_dir, "log.jsonl")
    if resuming:
        plan = checked(plan, path)
        if "minutes" in overrides and overrides["minutes"] != plan["minutes"]:
            raise UserError(f"--minutes={overrides['minutes']:g}: {cfg.out_dir} holds a plan in parts for "
                            f"--minutes={plan['minutes']:g}, and a resumed run keeps its plan; resume without "
                            f"--minutes ({more_minutes(overrides.get('dataset', plan['config'].get('dataset')))})")
    # out_dir is the plan's until its third part takes it (that run locks it itself): a run already writing there
    # refuses this one before any record or any training
    lock = OutDirLock(cfg.out_dir).acquire()
    stop = StopFlag()  # a signal between two parts (each part's own flag covers it while it runs)
    try:
        if resuming:
            user, given = user_settings(plan, cfg, overrides, log)
        else:  # the user's config beside the plan: a part begun after a resume is planned from it
            user, given = cfg, overrides
            plan = {**plan, "started": t_start, "config": asdict(cfg), "given": overrides}
            metrics = Metrics(path, cfg, log, record=True)
            metrics.record(kind="plan", iter=0, **plan)
            metrics.close()
        return run_parts(train, cfg, user, given, overrides, plan, t_start, log, config_files, whole, lock)
    except Interrupted:  # outside a part (between two, or after the third): each part has saved what it ran
        log(f"interrupted outside a part; the three parts go on with {again}")
        return {"iters": None, "val_loss": None, "best_val_loss": None, "time": time.time() - t_start,
                "train_time": None, "interrupted": True, "reached": None}
    finally:
        stop.restore()
        lock.release()


def run_parts(train, cfg, user, given, overrides, plan, t_start, log, config_files, whole, lock):
    """train_parts' loop: each part that is not done, resumed or begun; then the result, said and recorded."""
    resuming, budget = cfg.init_from == "resume", plan["minutes"] * 60
    parts = plan_parts(user.seed)  # the recorded plan's parts are code's, not read back: only their shares of it
    dirs = [os.path.join(cfg.out_dir, part["dir"]) if part["dir"] else cfg.out_dir for part in parts]
    teachers = ",".join(d for d, part in zip(dirs, parts) if not part["distils"])
    share_end, summary = t_start, None

    def quiet(line, *args, **kwargs):  # the user's keys were said once, before the plan: not again in each part
        if not str(line).startswith("override: "):
            log(line, *args, **kwargs)
    for number, (part, out_dir) in enumerate(zip(parts, dirs), 1):
        share_end += part["share"] * budget  # where this part's share ends, counted from process start
        state = part_state(out_dir, plan["started"]) if resuming else "new"
        what = "the model, learning from both" if part["distils"] else f"teacher {number} of 2"
        if state == "done":
            score = measured(out_dir)
            log(f"part {number} of 3 ({what}): done earlier in {out_dir}"
                + ("" if score is None else f", val bpb {score:.3f}"))
            continue
        begin = time.time()
        if part["distils"]:
            lock.release()  # the third part's run locks out_dir itself
            revision = revised(plan, dirs[:number - 1])
            if revision is not None:
                value, sigma, pairs = revision
                log(f"the teachers measured {' and '.join(f'{m:.3f}' for _, m in pairs)} where the law predicted "
                    f"{' and '.join(f'{p:.3f}' for p, _ in pairs)} for them: the three's prediction, revised by that, "
                    f"{predicted_text(value, sigma)} (it was {plan['predicted_val_bpb']:.3f})")
        if state == "started":
            part_cfg = replace(cfg, out_dir=out_dir, init_from="resume")
            part_overrides = {k: v for k, v in overrides.items() if k != "minutes"} | {"out_dir": out_dir}
            log(f"part {number} of 3 ({what}): resuming {out_dir}")
        else:
            # a part begun now: to the end of its share, or after a resume its whole share from now; at least half
            # its share, should the parts before have run past theirs
            left = part["share"] * budget if resuming else share_end - (t_start if number == 1 else begin)
            minutes = round(max(left, part["share"] * budget / 2) / 60, 2)
            keys = dict(out_dir=out_dir, minutes=minutes, seed=part["seed"], plan_teachers=False,
                        teacher=teachers if part["distils"] else "",
                        init_from=better(dirs[:number - 1], user, log) if part["distils"] else "scratch")
            part_cfg, part_overrides = replace(user, **keys), {**given, **keys}
            log(f"part {number} of 3 ({what}): a plan of {minutes_text(minutes)} into {out_dir}, seed "
                f"{part['seed']}" + (f", teachers {teachers}, from {keys['init_from']}'s weights if it is planned "
                                     f"fewer than {WARM_EPOCHS:g} epochs" if part["distils"] else ""))
        summary = train(part_cfg, part_overrides, quiet, t_start=t_start if number == 1 and not resuming else begin,
                        config_files=config_files, whole=whole)
        if summary.get("interrupted"):
            return summary
    seconds = time.time() - t_start
    scores = [measured(d) for d in dirs]
    shown = ["-" if s is None else f"{s:.3f}" for s in scores]
    revision = revised(plan, dirs[:2])
    log(f"three parts: teachers {shown[0]} and {shown[1]}, the model in {cfg.out_dir} {shown[2]} (val bpb of each "
        f"best checkpoint); predicted {predicted_text(plan['predicted_val_bpb'], plan['predicted_sigma'])}"
        + ("" if revision is None else f", revised by the teachers {predicted_text(*revision[:2])}") + "; "
        + (f"{seconds:.0f} s of the {budget:.0f} s budget" if not resuming else f"{seconds:.0f} s since the resume"))
    metrics = Metrics(os.path.join(cfg.out_dir, "log.jsonl"), cfg, log, record=True, headed=True)  # the third's run
    metrics.record(kind="plan_result", iter=summary["iters"] if summary else 0, parts=True, measured_val_bpb=scores[2],
                   teachers_val_bpb=scores[:2], predicted_val_bpb=plan["predicted_val_bpb"],
                   revised_val_bpb=revision and revision[0], budget=budget, seconds=seconds, resumed=resuming)
    metrics.close()
    return {**(summary or {}), "time": seconds, "parts": scores}
