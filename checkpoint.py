"""Checkpoints: written atomically, read without running code.

A checkpoint is a dict of tensors and plain types with nanoGPT's keys
(model, optimizer, model_args, iter_num, best_val_loss, config) plus the
state exact resume needs (rng, scaler). It loads with weights_only=True.
"""
import os
import tempfile

import torch

from configurator import UserError
from model import GPT, GPTConfig

# prefixes torch.compile and DDP add to state_dict keys
WRAPPER_PREFIXES = ("_orig_mod.", "module.")
GPT2_NAMES = ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl")


def save_checkpoint(obj, path):
    """Write to a temporary file beside path, fsync, then rename over it: never half-written."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix="." + os.path.basename(path) + ".", suffix=".tmp")
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes it private; give it a normal file's mode
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # make the rename itself durable
    finally:
        os.close(dir_fd)


def load_checkpoint(path, map_location="cpu"):
    """The checkpoint dict, or a UserError that says what is wrong with the file."""
    if not os.path.exists(path):
        raise UserError(f"no checkpoint at {path}; train one first (python train.py ... --out_dir={os.path.dirname(path) or '.'})")
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:
        if "GLOBAL" in str(e):  # the weights-only unpickler met a class or function to import
            raise UserError(f"refusing to load {path}: it holds objects other than tensors and plain data, "
                            f"which could run code; only load checkpoints you trust from a safe format") from None
        raise UserError(f"{path} is not a readable checkpoint (truncated or corrupted?): "
                        f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}; "
                        f"restore it from a backup or train again") from None
    if not isinstance(ckpt, dict) or "model" not in ckpt or "model_args" not in ckpt:
        raise UserError(f"{path} is not a training checkpoint (needs 'model' and 'model_args' keys)")
    return ckpt


def clean_state_dict(state_dict):
    """Strip torch.compile/DDP prefixes and drop nanoGPT's causal-mask buffers."""
    out = {}
    for key, value in state_dict.items():
        for prefix in WRAPPER_PREFIXES:
            if key.startswith(prefix):
                key = key[len(prefix):]
        if key.endswith(".attn.bias") and value.dim() == 4:  # nanoGPT's non-flash mask buffer
            continue
        out[key] = value
    return out


def model_from_checkpoint(ckpt, path="checkpoint", **runtime):
    """Rebuild the GPT a checkpoint describes and load its weights."""
    try:
        config = GPTConfig.from_model_args(ckpt["model_args"], **runtime)
    except (TypeError, ValueError) as e:
        raise UserError(f"{path}: bad model_args: {e}") from None
    model = GPT(config)
    state = clean_state_dict(ckpt["model"])
    if config.tie_weights and "lm_head.weight" not in state and "transformer.wte.weight" in state:
        state["lm_head.weight"] = state["transformer.wte.weight"]
    try:
        model.load_state_dict(state)
    except RuntimeError as e:
        raise UserError(f"{path}: weights do not match its model_args: {str(e).splitlines()[0]}") from None
    return model


def is_pretrained(init_from):
    """True for a GPT-2 name or a local Hugging Face directory."""
    return init_from in GPT2_NAMES or os.path.isfile(os.path.join(init_from, "config.json"))


def load_pretrained(name_or_path, **override_args):
    """GPT.from_pretrained, with its failures as one-line UserErrors."""
    try:
        return GPT.from_pretrained(name_or_path, override_args)
    except ImportError as e:
        raise UserError(str(e)) from None
    except (OSError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UserError(f"cannot load GPT-2 weights {name_or_path!r}: {first}; offline, download them where there "
                        f"is internet and pass the local directory") from None
