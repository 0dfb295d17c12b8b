"""A run's metrics: the console line, out_dir/log.jsonl and Weights & Biases, and the training clock."""
import errno
import json
import os
import time
from dataclasses import asdict

from tqdm import tqdm

from nanogpt.errors import UserError
from nanogpt.files import open_fd_to_write, open_regular


class Clock:
    """Training time: wall time since the process started, less the time spent evaluating and saving, plus
    `before`, the training time of the run this process resumes."""

    def __init__(self, t_start, before=0.0):
        self.t_start, self.excluded, self.paused_at, self.before = t_start, 0.0, None, before
        self.lap_time, self.lap_iter = self.train_time(), None

    def pause(self):
        self.paused_at = time.time()

    def resume(self):
        self.excluded += time.time() - self.paused_at
        self.paused_at = None

    def wall(self):
        return time.time() - self.t_start

    def train_time(self):
        return self.before + (self.paused_at or time.time()) - self.t_start - self.excluded

    def lap(self, iter_num):
        """Seconds of training per iter since the previous lap (None on the first)."""
        now, last_time, last_iter = self.train_time(), self.lap_time, self.lap_iter
        self.lap_time, self.lap_iter = now, iter_num
        if last_iter is None or iter_num == last_iter:
            return None
        return (now - last_time) / (iter_num - last_iter)


class Metrics:
    """Each event as a line through log (above any tqdm progress bar) and a JSON record in
    out_dir/log.jsonl, and on Weights & Biases with wandb_log. Only the writing process (rank 0,
    not eval_only) records; the log is opened on the first record, so a run that fails before
    leaves out_dir (and wandb) alone. Each process's records follow a config record, whose iter is
    where it started: a resumed run's (init_from resume) continue the run from there."""

    def __init__(self, path, cfg, log, record, iter=0, headed=False):
        self.path, self.log, self.active, self.file = path, log, record, None
        # the config record written (headed: by the run whose records these continue): a record after close()
        # reopens the log without another
        self.headed = headed
        self.header = {"kind": "config", "iter": iter, **asdict(cfg)}
        self.wandb = None
        if record and cfg.wandb_log:
            try:
                import wandb
            except ImportError:
                raise UserError("wandb_log=True needs wandb: pip install wandb (or drop --wandb_log)") from None
            self.wandb, self.wandb_args = wandb, dict(project=cfg.wandb_project, name=cfg.wandb_run_name,
                                                      config=asdict(cfg))

    def say(self, line):
        with tqdm.external_write_mode():  # the bar is cleared, then drawn again below the line
            self.log(line)

    def write(self, line, **record):
        """Say line, and record the event (kind, iter and the numbers)."""
        self.say(line)
        self.record(**record)

    def record(self, **record):
        """Record an event (kind, iter, ...) in the log without a line on the console."""
        if not self.active:
            return
        text = json.dumps(record) + "\n"
        if self.file is None:
            os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
            self.file = open_fd_to_write(self.path, append=True)  # never through a link planted in out_dir
            size = os.fstat(self.file).st_size
            torn = size and os.pread(self.file, 1, size - 1) != b"\n"  # a line cut short before: end it
            text = ("\n" if torn else "") + ("" if self.headed else json.dumps(self.header) + "\n") + text
            if self.wandb is not None and not self.headed:
                self.wandb.init(**self.wandb_args)
            self.headed = True
        self.append(text.encode("utf-8"))
        if self.wandb is not None:  # e.g. train/loss, eval/val_loss, at step iter
            self.wandb.log({f"{record['kind']}/{k}": v for k, v in record.items() if k not in ("kind", "iter")},
                           step=record.get("iter"))

    def append(self, data):
        """data, whole lines, at the end of the log in one write, or nothing: a failed write is cut back."""
        size = os.fstat(self.file).st_size
        try:
            if os.write(self.file, data) != len(data):  # a short write: the disk filled
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        except OSError as e:
            try:
                os.ftruncate(self.file, size)
            except OSError:
                pass
            raise OSError(e.errno, e.strerror, self.path) from None

    def close(self):
        if self.file is not None:
            os.close(self.file)
            self.file = None


NUMBERED = ("train", "eval", "tasks", "rl", "rl_eval")  # the kinds whose fields are numbers (or null)
TIMED = ("eval", "tasks")  # the kinds plot.py draws against training time


def read_log(path, note=None):
    """The records of a log.jsonl. A line cut short (a write that failed, a lost power) is skipped with a note, and a
    record appended to it on the same line is kept; so is a record of the wrong shape (malformed says how)."""
    records, say = [], note or print
    with open_regular(path, "r", encoding="utf-8", errors="replace") as f:  # a FIFO would wait forever
        for number, line in enumerate(f, 1):
            record = parse_record(line)
            if record is None:
                say(f"note: {path}:{number}: skipping a torn line (a write cut short) or one that is no JSON record: "
                    f"{line[:60]!r}")
                record = parse_record(line[max(line.rfind('{"kind": '), 1):])  # what was appended to it
            problem = record is not None and malformed(record)
            if problem:
                say(f"note: {path}:{number}: skipping a {record['kind'][:20]!r} record: {problem}")
            elif record is not None:
                records.append(record)
    return records


def parse_record(text):
    try:
        record = json.loads(text)
    except (ValueError, RecursionError):  # RecursionError: arrays nested thousands deep
        return None
    return record if isinstance(record, dict) and isinstance(record.get("kind"), str) else None


def malformed(record):
    """What makes a record unfit to read (None where nothing): an iter that is not a whole number; in the kinds
    of numbers, a field that is not one (a loss written as a string), and in the timed kinds no train_time."""
    if "iter" in record and type(record["iter"]) is not int:
        return f"its iter is {json.dumps(record['iter'])[:40]}, not a whole number"
    if record["kind"] not in NUMBERED:
        return None
    if "iter" not in record or (record["kind"] in TIMED and "train_time" not in record):
        return "it has no " + ("iter" if "iter" not in record else "train_time")
    for key, value in record.items():
        if key != "kind" and value is not None and type(value) not in (int, float):
            return f"its {key[:40]} is {json.dumps(value)[:40]}, not a number"
    return None
