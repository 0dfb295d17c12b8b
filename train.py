"""Train a GPT by teacher forcing: every position predicts the next token, all at once.

    python train.py config/shakespeare_char_cpu.py
    python train.py --dataset=data/mytexts --minutes=10     # a plan: the best model for that text in 10 minutes
    python train.py config/shakespeare_char.py --batch_size=32 --compile=False
    python train.py --init_from=resume --out_dir=out-shakespeare-char --max_iters=6000
    torchrun --standalone --nproc_per_node=2 train.py config/shakespeare_char_cpu.py
    torchrun --standalone --nproc_per_node=2 train.py config/shakespeare_char_cpu.py --parallel=fsdp

Writes out_dir/ckpt.pt (latest), out_dir/best.pt (best val loss) and
out_dir/log.jsonl (one JSON object per log line); with --parallel=fsdp the
checkpoints are sharded directories, ckpt.dcp and best.dcp (checkpoint.py). Ctrl-C saves the last
completed iteration and exits; a second Ctrl-C exits at once.

Read top to bottom: the config (TrainConfig), the model (nanogpt.training.startup.start_run: new, resumed, fine-tuned
or GPT-2's, with every check of a resume), the loop (evaluate, step, save), the summary.
"""
import time

PROCESS_START = time.time()  # before the heavy imports: "training time" counts from here
BUDGET_SAY = 0.05  # --minutes: a move of the iterations this large (from the last one said) is said, smaller ones logged
CONSOLE_EVERY = 5  # --minutes: a plan's train lines on the console, one in this many (about 20 a run)

from nanogpt import program

program.exit_quietly_on_ctrl_c()  # before the slow imports (torch): Ctrl-C during them exits quietly

# ruff: noqa: E402
import math
import os
import shlex
from dataclasses import asdict

import torch
from torch.nn.parallel import DistributedDataParallel as DDP
from tqdm import tqdm

from configurator import parse_args
from nanogpt.checkpoint import model_args, rng_state, save_training
from nanogpt.errors import UserError
from nanogpt.out_dir import OutDirLock, latest_form
from nanogpt.training.batches import TRAINING, estimate_loss
from nanogpt.training.distributed import (all_ranks, barrier, from_rank0, gather_rng, local_gradients,
                                          mean_over_ranks, micro_batches, setup_distributed, teardown)
from nanogpt.training.metrics import Clock, Metrics
from nanogpt.training.notes import cpu_time_of, startup_notes
from nanogpt.training.parts import plan_in_parts, train_parts
from nanogpt.training.optim import OptimizerSettings, configure_optimizers, lr_scale
from nanogpt.training.plan import (Deadline, deadline_ceiling, halfway_revision, minutes_text, plan_summary,
                                   predicted_text)
from nanogpt.training.resume import resume_command
from nanogpt.training.sharding import first_non_finite, held_bytes
from nanogpt.training.startup import Start, start_run
from nanogpt.training.stopping import Interrupted, StopFlag
from nanogpt.training.train_config import TrainConfig
from nanogpt.values import how_many


def train(cfg, overrides=None, log=print, t_start=None, config_files=(), whole=None):
    """Run training as cfg says; returns a summary dict (iters, losses, time).

    t_start: when the clock for "training time" started (the process start for the script).
    config_files: the config files cfg was read from (a note on a slow CPU never suggests one of them).
    whole: for one of a plan's three runs (parts.py), the config that resumes them all: its Ctrl-C names that.
    """
    t_start = t_start or time.time()
    if whole is None and cfg.init_from == "resume" and not cfg.eval_only:
        plan = plan_in_parts(cfg.out_dir)
        if plan is not None:  # out_dir holds three runs not yet done: they go on where they stopped
            return train_parts(train, cfg, overrides or {}, plan, t_start, log, config_files)
    lock = OutDirLock(cfg.out_dir)  # taken once the run is about to write; refuses a file where out_dir would be
    stop = StopFlag()  # a signal during start-up stops the run at once, with nothing saved (restored in finally)
    world = 1
    threads = torch.get_num_threads()  # a planned run fits them to the load (startup.py): the caller's come back
    try:
        rank, local_rank, world = setup_distributed(cfg.device, cfg.backend)
        stop.abandon = world == 1  # DDP ranks stop together, at a log iteration
        log = log if rank == 0 else (lambda *a, **k: None)
        run = start_run(cfg, overrides or {}, rank, local_rank, world, log, lock, into=Run,
                        elapsed=lambda: time.time() - t_start)
        if run.plan is not None and run.plan.get("parts") and whole is None:  # the budget as three runs
            plan, run = run.plan, None  # the one run's model and batches are not held while the parts train
            return train_parts(train, cfg, overrides or {}, plan, t_start, log, config_files)
        run.whole = whole
        run.begin(local_rank, t_start, stop, lock, config_files)
        with run.kernels.applied(run.raw_model):
            loop(run, stop)
        summary = run.finish(stop)
        barrier(world)  # rank 0 saves last: no rank tears down its connections while another still uses them
        return summary
    except Interrupted:
        log("interrupted during start-up: nothing saved")
        return {"iters": None, "val_loss": None, "best_val_loss": None, "time": time.time() - t_start,
                "train_time": None, "interrupted": True, "reached": None}
    finally:
        if torch.get_num_threads() != threads:  # however the run ended: a refused plan, Ctrl-C, an error
            torch.set_num_threads(threads)
        lock.release()
        stop.restore()
        teardown(world)


def console_every(plan):
    """One train line in this many goes to the console: a plan logs (and checks its budget) about 100 times a run,
    and the console shows every CONSOLE_EVERY-th, log.jsonl all of them; a log_interval of yours, every one."""
    return CONSOLE_EVERY if plan is not None and "log_interval" not in plan.get("kept", ()) else 1


def loop(run, stop):
    """Evaluate when due, then one iteration, until max_iters, the target loss, or a signal."""
    run.clock.lap(run.iter_num)
    try:
        while True:
            last = run.iter_num >= run.cfg.max_iters
            if run.cfg.eval_only or last or run.eval_due():
                last = run.evaluate(last)
            if last or stop.agreed(run.world, run.iter_num, run.cfg.log_interval):
                break
            if stop.abandon and run.cfg.dropout > 0:  # only dropout draws random numbers in an iteration
                run.rng_at_iter = [rng_state()]
            loss = run.forward_backward()
            with stop.finishing():  # from the optimizer step on, the iteration completes
                run.step(loss)
    except Interrupted:  # the iteration in flight (or the evaluation) is abandoned; the weights are untouched
        run.optimizer.zero_grad(set_to_none=True)
    finally:
        run.close()


class Run(Start):
    """One training run: what start-up built (a Start: the config, the model on its device, the batches), then
    the optimizer, and the steps the loop takes."""

    def begin(self, local_rank, t_start, stop, lock, config_files=()):
        """The optimizer (a resumed run's state restored), the model compiled or wrapped in DDP, the notes worth a
        line, and out_dir's log and lock."""
        cfg, log, world = self.cfg, self.log, self.world
        self.stop, self.lock, self.master = stop, lock, self.rank == 0
        self.optimizer = configure_optimizers(self.raw_model, OptimizerSettings.of(cfg, self.kernels.ns_dtype))
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=self.dtype == torch.float16)
        self.iter_num, self.best_val_loss, self.best_bpb, trained = self.restore(self.optimizer, self.scaler)
        self.model = self.raw_model
        if self.compile:
            log("compiling the model... (takes a minute)")
            if not self.sharded:  # sharded Blocks were compiled one by one
                self.model = torch.compile(self.model)
        if world > 1 and not self.sharded:
            self.model = DDP(self.model, device_ids=[local_rank] if self.device.type == "cuda" else None)
        self.accum = micro_batches(cfg.gradient_accumulation_steps, world)
        self.tokens_per_iter = cfg.gradient_accumulation_steps * cfg.batch_size * cfg.block_size
        log(f"model: {self.raw_model.get_num_params() / 1e6:.2f}M parameters; device {self.device}, "
            f"{str(self.dtype)[6:]}, {how_many(world, 'process')}; {self.tokens_per_iter:,} tokens per iter")
        # (a planned run was timed and fitted to its minutes already: the note's smaller recipe is the plan's to choose)
        cpu_time = (cpu_time_of(self, self.accum, self.iter_num)
                    if self.device.type == "cpu" and not cfg.eval_only and world == 1 and cfg.minutes is None else None)
        for note in startup_notes(cfg, self.ckpt_path, self.iter_num, self.replacing, cpu_time, config_files):
            log(f"note: {note}")
        writer = self.master and not cfg.eval_only  # eval_only only reads out_dir
        self.metrics = Metrics(os.path.join(cfg.out_dir, "log.jsonl"), cfg, log, record=writer, iter=self.iter_num)
        # --minutes: the budget runs from process start to exit; a resumed run's from its own start, less the
        # training time before it
        ceiling = deadline_ceiling(self.plan or {}, cfg.max_iters)
        self.deadline = None if cfg.minutes is None else Deadline(t_start + cfg.minutes * 60 - trained, ceiling)
        self.budget_said = cfg.max_iters  # the iterations the console last heard of
        self.console_every = console_every(self.plan)
        if self.plan is not None and self.iter_num == 0 and writer:
            self.metrics.record(kind="plan", iter=0, **self.plan)
        if writer:
            lock.acquire()  # out_dir is ours until the run ends
        self.start_iter, self.last_val = self.iter_num, None
        self.scale = 1.0  # the schedule's multiplier of this iteration (lr_scale)
        self.reached = None  # (iter, training seconds) when val loss first reached target_loss
        self.rng_at_iter = None  # RNG state when the iteration in flight began: an abandoned one is saved with it
        self.clock = Clock(t_start, before=trained)  # a resumed run's clock goes on from its checkpoint's
        self.bar = tqdm(total=cfg.max_iters, initial=self.iter_num, disable=not self.master or None, desc="train",
                        unit="iter")

    def eval_due(self):
        if self.iter_num == 0:
            return True
        if self.iter_num % self.cfg.eval_interval or self.iter_num == self.start_iter:
            return False
        # a budget moves a planned run's end: an evaluation a few iterations before the last one is its twin
        # (iter 180 and 181), at a share of the budget; a tenth of an interval before it (a config file's 250 of a
        # run the budget ends at 307 is a point of its own)
        return self.deadline is None or self.cfg.max_iters - self.iter_num > max(2, self.cfg.eval_interval // 10)

    def evaluate(self, last):
        """Losses now, logged; ckpt.pt and best.pt saved as configured. True when the run should end here."""
        cfg, it = self.cfg, self.iter_num
        wall, train_time = self.clock.wall(), self.clock.train_time()
        began = time.time()
        self.clock.pause()  # evaluating and saving is not training time
        losses = estimate_loss(self.model, self.batches, cfg, self.ctx, self.rank, self.world, self.token_bytes,
                               collective=self.world > 1)
        self.last_val, bpb = losses["val"], losses.get("val_bpb")
        self.metrics.write(f"iter {it}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}"
                           + (f", val bpb {bpb:.4f}" if bpb is not None else ""), kind="eval", iter=it,
                           train_loss=losses["train"], val_loss=losses["val"], val_bpb=bpb, time=wall,
                           train_time=train_time)
        if cfg.target_loss is not None and losses["val"] <= cfg.target_loss and self.reached is None:
            self.reached = (it, train_time)
            self.metrics.say(f"reached val loss {losses['val']:.4f} <= {cfg.target_loss} at iter {it} after "
                             f"{train_time:.1f}s of training (from process start, evaluation excluded)")
            last = True
        if not math.isfinite(losses["val"]):
            raise UserError(f"val loss is {losses['val']} at iter {it}; the run diverged (lower learning_rate "
                            f"or raise warmup_iters); the last good checkpoint is kept")
        if self.tasks is not None:
            self.tasks.log(self.metrics, self.ctx, it, time=wall, train_time=train_time)
        if cfg.eval_only:
            return True
        improved = losses["val"] < self.best_val_loss
        self.best_val_loss = min(self.best_val_loss, losses["val"])
        if improved:
            self.best_bpb = bpb
        if self.plan is not None and self.revision is None:
            self.revise(it)
        if it > self.start_iter:
            # a planned run ends with ckpt.pt at its best val loss: a small corpus is overfitted by the end
            if improved or cfg.always_save_checkpoint or (last and cfg.minutes is None):
                self.save("ckpt.pt")
                self.replacing = None  # this run's own checkpoint now
            if improved and cfg.keep_best:
                self.save("best.pt")
        self.clock.resume()
        if self.deadline is not None:
            self.deadline.evaluated(time.time() - began)
        return last

    def revise(self, it):
        """--minutes: the plan's prediction revised from the run's own val bpb, once, halfway (plan.py)."""
        self.revision = halfway_revision(self.plan, asdict(self.cfg), it, self.cfg.max_iters, self.best_bpb)
        if self.revision is not None:
            value, sigma = self.revision
            self.metrics.write(f"halfway (iteration {it:,} of {self.cfg.max_iters:,}, {it / self.cfg.max_iters:.0%}: "
                               f"the first evaluation at or past half): the best val bpb so far, "
                               f"{self.best_bpb:.3f}, revises the prediction at the end to "
                               f"{predicted_text(value, sigma)} (the plan's: "
                               f"{predicted_text(self.plan['predicted_val_bpb'], self.plan['predicted_sigma'])})",
                               kind="revision", iter=it,
                               revised_val_bpb=value, revised_sigma=sigma, end=self.cfg.max_iters)

    def forward_backward(self):
        """One iteration's gradients, accumulated over its micro-batches; returns its mean loss (a tensor)."""
        self.scale = lr_scale(self.iter_num, self.cfg)
        for group in self.optimizer.param_groups:  # every group follows the schedule from its own peak
            group["lr"] = group["initial_lr"] * self.scale
        loss_accum = torch.zeros((), device=self.device)
        for micro in range(self.accum):
            x, y = self.batches.get("train", (TRAINING, self.iter_num, self.rank * self.accum + micro))
            sync = self.world == 1 or micro == self.accum - 1  # grads are reduced on the last micro-step only
            with local_gradients(self.model, sync, self.sharded), self.ctx:
                logits, loss = self.model(x, y)
                if self.teachers is not None:  # --teacher: the text's loss and the teachers' predictions
                    loss = self.teachers.loss(x, y, logits, loss)
                loss = loss / self.accum
            self.scaler.scale(loss).backward()
            loss_accum += loss.detach()
        return loss_accum

    def step(self, loss):
        """The optimizer step that completes the iteration; every log_interval iters, its log line."""
        if self.cfg.grad_clip > 0:
            self.scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.grad_clip)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        if self.iter_num == self.start_iter:
            self.log_memory()
        self.optimizer.zero_grad(set_to_none=True)
        if self.threads is not None:
            self.threads.check()  # a clock read; every half second a look at the load
        self.iter_num += 1
        self.rng_at_iter = None
        self.bar.update(1)
        if self.iter_num % self.cfg.log_interval == 0:
            self.log_iter(loss)

    def log_memory(self):
        """What this process holds for training, beside activations: its shards under FSDP."""
        held = held_bytes(self.raw_model, self.optimizer)
        ran = how_many(self.world, "process") + ("" if self.world == 1 else f", {self.cfg.parallel}")
        self.metrics.write(f"memory per process: parameters {held['params'] / 2**20:,.1f} MiB, gradients "
                           f"{held['grads'] / 2**20:,.1f} MiB, optimizer state {held['optimizer'] / 2**20:,.1f} MiB "
                           f"({ran})",
                           kind="memory", iter=self.iter_num + 1,
                           world=self.world,
                           parallel=self.cfg.parallel, **held)

    def log_iter(self, loss):
        mean_over_ranks(loss, self.world)  # log the loss of the whole global batch, not rank 0's share
        lossf = loss.item()  # sync point: only on log iterations
        if not math.isfinite(lossf):
            raise UserError(f"training loss is {lossf} at iter {self.iter_num}; the run diverged (lower "
                            f"learning_rate or raise warmup_iters); the last good checkpoint is kept")
        dt = self.clock.lap(self.iter_num)  # seconds per iter since the last log, evaluations excluded
        lr = self.cfg.learning_rate * self.scale
        tok_s = self.tokens_per_iter / dt
        mfu = self.raw_model.estimate_mfu(self.cfg.gradient_accumulation_steps * self.cfg.batch_size, dt,
                                          self.peak) if self.peak else None
        if self.deadline is not None:
            self.keep_budget()
        record = dict(kind="train", iter=self.iter_num, loss=lossf, lr=lr, ms=dt * 1000, tok_s=tok_s, mfu=mfu,
                      time=self.clock.wall(), train_time=self.clock.train_time())
        if self.iter_num // self.cfg.log_interval % self.console_every:
            self.metrics.record(**record)
            return
        self.metrics.write(f"iter {self.iter_num}: loss {lossf:.4f}, lr {lr:.2e}, {dt * 1000:.1f} ms/iter, "
                           f"{tok_s:,.0f} tok/s" + (f", mfu {mfu * 100:.1f}%" if mfu is not None else ""), **record)

    def keep_budget(self):
        """--minutes: the iterations left fitted to the time left, as measured so far (rank 0's, on every rank);
        the schedule's decay follows."""
        target = self.deadline.update(self.iter_num, self.clock.train_time(), self.cfg) if self.master else None
        target = from_rank0(target, self.world)
        if target is None:
            return
        before, self.cfg.max_iters = self.cfg.max_iters, target
        if (self.plan or {}).get("decay_follows", True):  # not a decay of yours that ends elsewhere (plan.py)
            self.cfg.lr_decay_iters = target
        self.bar.total = target
        # every move is logged; the console hears of one that takes the run 5% or more from what it last said
        said = self.budget_said
        if abs(target - said) >= max(1, BUDGET_SAY * said):
            self.budget_said = target
            self.metrics.say(f"budget: {said} -> {target} iterations to end within {minutes_text(self.cfg.minutes)}")
        self.metrics.record(kind="budget", iter=self.iter_num, max_iters=target, previous=before)

    def save(self, name, rng=None):
        """ckpt.pt or best.pt (with --parallel=fsdp: ckpt.dcp or best.dcp), atomically; never non-finite weights.
        The other form of the same checkpoint, older, is removed."""
        if not all_ranks(self.lock.held(), self.world):  # rank 0 holds it; the others agree, and stop together
            raise self.lock.lost()
        bad = first_non_finite(self.raw_model, self.world)
        if bad:
            raise UserError(f"the weights are not finite at iter {self.iter_num} ({bad}); not saving {name}: the last "
                            f"good checkpoint is kept (lower learning_rate or raise warmup_iters)")
        meta = {"model_args": model_args(self.raw_model.config), "iter_num": self.iter_num,
                "best_val_loss": self.best_val_loss, "best_val_bpb": self.best_bpb, "config": asdict(self.cfg),
                "scaler": self.scaler.state_dict(),
                "rng": rng or gather_rng(self.world), "tokenizer": self.tokenizer_meta,
                "train_time": self.clock.train_time()}
        with self.stop.finishing():
            save_training(meta, self.raw_model, self.optimizer, os.path.join(self.cfg.out_dir, name),
                          self.cfg.parallel == "fsdp", self.rank, self.world)

    def close(self):
        self.bar.close()
        self.metrics.close()

    def finish(self, stop):
        """After the loop: save what a signal interrupted; the summary."""
        cfg, log = self.cfg, self.log
        interrupted = stop.final(self.world)
        if interrupted and not cfg.eval_only:
            if self.iter_num > self.start_iter and self.replacing is not None:
                log(f"interrupted at iter {self.iter_num}, before this run saved at an evaluation: nothing saved, so "
                    f"{latest_form(self.ckpt_path)} keeps the earlier run ({self.replacing}); to keep a new run's "
                    f"first iters, train it into another --out_dir or evaluate sooner (--eval_interval)")
            elif self.iter_num > self.start_iter:
                self.save("ckpt.pt", rng=self.rng_at_iter)
                log(f"interrupted: saved {latest_form(self.ckpt_path)} at iter {self.iter_num}; continue with "
                    f"{resume_command('train.py', self.whole or cfg, self.world)}")
            else:
                log(f"interrupted at iter {self.iter_num}, before this run completed an iteration: nothing saved")
        summary = {"iters": self.iter_num, "val_loss": self.last_val, "best_val_loss": self.best_val_loss,
                   "best_val_bpb": self.best_bpb,
                   "time": self.clock.wall(), "train_time": self.clock.train_time(), "interrupted": interrupted,
                   "reached": self.reached}
        if cfg.target_loss is not None and self.reached is None and self.last_val is not None:
            log(f"did not reach val loss {cfg.target_loss} in {self.iter_num} iters (last {self.last_val:.4f})")
        if self.last_val is not None and not cfg.eval_only and not interrupted:
            ran = self.iter_num - self.start_iter  # the wall time is this process's: so is the count beside it
            total = f" ({self.iter_num} in all)" if self.start_iter else ""
            log(f"done: {ran} iters in {summary['time']:.1f} s{total}; val loss {self.last_val:.4f} "
                f"(best {self.best_val_loss:.4f}); checkpoint {latest_form(self.ckpt_path)}; write from it with "
                f"python sample.py --out_dir={shlex.quote(cfg.out_dir)}")
            if self.plan is not None:  # recorded however it ended: a resume that improved nothing is done too
                if self.best_bpb is not None:
                    log(plan_summary(self.plan, self.best_bpb, self.iter_num, self.clock.before + summary["time"],
                                     cfg.minutes, reached=self.reached is not None, revision=self.revision))
                self.metrics.record(kind="plan_result", iter=self.iter_num, measured_val_bpb=self.best_bpb,
                                    predicted_val_bpb=self.plan["predicted_val_bpb"],
                                    revised_val_bpb=self.revision and self.revision[0], budget=cfg.minutes * 60,
                                    seconds=self.clock.before + summary["time"])
        return summary


def main(argv):
    cfg, overrides = parse_args(TrainConfig, argv)
    train(cfg, overrides, t_start=PROCESS_START, config_files=[a for a in argv if not a.startswith("--")])


if __name__ == "__main__":
    program.run_main(main)
