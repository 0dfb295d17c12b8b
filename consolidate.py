"""Consolidate a sharded checkpoint: out_dir/ckpt.dcp, written by train.py --parallel=fsdp, into one file.

    python consolidate.py --out_dir=out    # out/ckpt.dcp (sharded) -> out/ckpt.pt (one file, nanoGPT's keys)

The file has nanoGPT's keys and the optimizer state keyed by index, as a run on one process writes it:
train.py resumes from it on any number of processes, sample.py and nanoGPT read it. How the sharding
itself works: sharding.py.
"""
from nanogpt import program

program.exit_quietly_on_ctrl_c()  # before the slow imports (torch): Ctrl-C during them exits quietly

# ruff: noqa: E402
import os
from dataclasses import dataclass

from configurator import parse_args
from nanogpt.errors import UserError
from nanogpt.program import run_main


@dataclass
class ConsolidateConfig:
    out_dir: str = "out"  # where train.py --parallel=fsdp wrote ckpt.dcp
    ckpt: str = "ckpt.pt"  # which checkpoint: ckpt.pt (latest) or best.pt; its sharded form is read


def check_exists(path):
    from nanogpt.out_dir import complete_sharded, sharded_path
    if complete_sharded(path) is None and not os.path.exists(path):
        raise UserError(f"no sharded checkpoint at {sharded_path(path)}; train one first (python train.py ... "
                        f"--parallel=fsdp --out_dir={os.path.dirname(path) or '.'})")


def consolidate(path):
    """The single-file checkpoint (nanoGPT's keys, optimizer keyed by index) of path's sharded form."""
    from nanogpt.checkpoint import load_checkpoint, load_sharded, model_from_checkpoint
    from nanogpt.training.optim import OptimizerSettings, configure_optimizers
    check_exists(path)
    ckpt = load_checkpoint(path)
    if "sharded" not in ckpt:
        raise UserError(f"{path} is already a single file (its sharded form is absent or older)")
    model = model_from_checkpoint(ckpt, ckpt["sharded"])
    config = ckpt.get("config") or {}
    try:  # the optimizer train.py built for this config: its groups are the saved state's
        optimizer = configure_optimizers(model, OptimizerSettings.of(config))
    except (KeyError, TypeError, ValueError) as e:
        raise UserError(f"{path}: its config does not describe an optimizer ({type(e).__name__}: {e}); "
                        f"the checkpoint is damaged or not train.py's") from None
    load_sharded(model, optimizer, ckpt["sharded"])  # the optimizer state, keyed by index by state_dict()
    ckpt["optimizer"] = optimizer.state_dict()
    ckpt["model"] = model.state_dict()
    del ckpt["sharded"]
    return ckpt


def main(argv):
    from nanogpt.checkpoint import save_checkpoint
    from nanogpt.out_dir import OutDirLock
    cfg, _ = parse_args(ConsolidateConfig, argv)
    path = os.path.join(cfg.out_dir, cfg.ckpt)
    if not os.path.isdir(cfg.out_dir):
        raise UserError(f"no checkpoint at {path}: {cfg.out_dir} is not a directory")
    check_exists(path)  # before the lock, which writes .lock: a refusal leaves out_dir as it was
    # a writer: a run training there would save after us, or we after it, and the older state win
    lock = OutDirLock(cfg.out_dir, "consolidate.py", instead=None).acquire()
    try:
        ckpt = consolidate(path)
        if not lock.held():
            raise lock.lost()
        save_checkpoint(ckpt, path)
    finally:
        lock.release()
    print(f"wrote {path} from {os.path.splitext(path)[0]}.dcp (iter {ckpt.get('iter_num')}); "
          f"train.py, sample.py and nanoGPT read it")


if __name__ == "__main__":
    run_main(main)
