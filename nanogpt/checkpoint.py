"""Checkpoints: written atomically, read without running code.

A checkpoint is a dict of tensors and plain types with nanoGPT's keys
(model, optimizer, model_args, iter_num, best_val_loss, config) plus the
state exact resume needs (rng, scaler). It loads with weights_only=True.

A sharded checkpoint (train.py --parallel=fsdp) is a directory beside it,
ckpt.pt's name with .dcp for .pt: each process's shards of the weights and
optimizer state, written by torch.distributed.checkpoint (DCP), and meta.pt
with the other fields. Readers take either; the one saved last wins.
"""
import collections
import os
import random
import re
import shutil
import tempfile
import typing
import warnings
from dataclasses import asdict

import numpy as np
import torch

from model import GPT, GPTConfig, rope_tables
from nanogpt.dcp import dcp_load, optimizer_list, sharded_shapes
from nanogpt.errors import UserError
from nanogpt.files import check_regular, open_regular
from nanogpt.out_dir import (discard, fsync_dir, interrupted_save, latest_form, moved_aside, sharded_path,
                             write_failure)
from nanogpt.pickles import load_error, torch_load
from nanogpt.program import describe_os_error
from nanogpt.values import convert


# prefixes torch.compile and DDP add to state_dict keys
WRAPPER_PREFIXES = ("_orig_mod.", "module.")


GPT2_NAMES = ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl")


# model_args keys that nanoGPT's GPTConfig accepts; other fields are written to
# a checkpoint only when they differ from the default, so GPT-2-style
# checkpoints stay loadable by nanoGPT's sample.py.
NANOGPT_MODEL_ARGS = ("n_layer", "n_head", "n_embd", "block_size", "bias", "vocab_size", "dropout")


# GPTConfig fields that choose how to compute, not what the weights mean: a resumed or sampled model
# may change them, and (beyond nanoGPT's dropout) no checkpoint records them
RUNTIME_FIELDS = ("dropout", "attn_impl")


def model_args(config):
    """A checkpoint's model_args: nanoGPT's keys, plus the options that differ from GPT-2."""
    default = GPTConfig()
    return {k: v for k, v in asdict(config).items()
            if k in NANOGPT_MODEL_ARGS or (k not in RUNTIME_FIELDS and v != getattr(default, k))}


def rng_state():
    """Every RNG a run may use, as tensors and plain types (weights_only loading accepts them)."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    return {"torch": torch.get_rng_state(), "numpy": [kind, keys.tolist(), pos, has_gauss, gauss],
            "python": random.getstate(), "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []}


def set_rng_state(state):
    torch.set_rng_state(state["torch"])
    kind, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, gauss))
    random.setstate(state["python"])
    if state.get("cuda") and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(obj, path):
    """Write to a temporary file beside path, fsync, then rename over it: never half-written.

    A failure (disk full, no permission) is a UserError; the previous file at path is intact.
    """
    directory = os.path.dirname(os.path.abspath(path))
    tmp = None
    try:
        os.makedirs(directory, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=directory, prefix="." + os.path.basename(path) + ".", suffix=".tmp")
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes it private; give it a normal file's mode
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        if tmp is not None and os.path.exists(tmp):
            os.remove(tmp)
        cause = write_failure(e)
        if cause is not None:
            previous = "the previous one is intact" if os.path.exists(path) else "nothing was written"
            raise UserError(f"saving {path} failed: {cause}; {previous}") from None
        raise
    fsync_dir(directory)


def load_checkpoint(path, map_location="cpu", weights=True):
    """The checkpoint dict, or a UserError that says what is wrong with the file.

    Where path's sharded form is the latest, its fields, with "sharded" naming the directory and
    "model" its weights gathered into whole tensors (weights=False: no "model"; load_sharded reads them).
    """
    form = latest_form(path)
    if form != path:
        return read_sharded(form, weights)
    if not os.path.exists(path):
        out_dir = os.path.dirname(path) or "."
        if interrupted_save(path):
            raise UserError(f"no checkpoint at {path}: a save was interrupted and the previous checkpoint is in "
                            f"{moved_aside(path)}; python train.py --init_from=resume --out_dir={out_dir} puts it "
                            f"back and continues")
        others = sorted(n for n in (os.listdir(out_dir) if os.path.isdir(out_dir) else ())
                        if n.endswith((".pt", ".dcp")) and n.startswith(os.path.splitext(os.path.basename(path))[0]))
        if others:  # --ckpt=best where best.pt is there
            raise UserError(f"no checkpoint at {path}; {out_dir} holds {', '.join(others)}: name the file with its "
                            f"ending ({others[0]})")
        raise UserError(f"no checkpoint at {path}; train one first (python train.py ... --out_dir={out_dir})")
    ckpt = read_tensors(path, map_location)
    if not isinstance(ckpt, dict) or "model" not in ckpt or "model_args" not in ckpt:
        raise UserError(f"{path} is not a training checkpoint (needs 'model' and 'model_args' keys)")
    check_fields(ckpt, path)
    return ckpt


def read_tensors(path, map_location="cpu"):
    """torch.load with weights_only: tensors and plain types, or a UserError; never code, and no record inflated
    past what the file holds (pickles.check_zip)."""
    try:
        with open_regular(path) as f:
            return torch_load(f, path, map_location=map_location)
    except UserError:
        raise
    except Exception as e:
        if "GLOBAL" in str(e):  # the weights-only unpickler met a class or function to import
            raise UserError(f"refusing to load {path}: it holds objects other than tensors and plain data, "
                            f"which could run code; only load checkpoints you trust from a safe format") from None
        raise UserError(f"{path} is not a readable checkpoint (truncated or corrupted?): {load_error(e)}; "
                        f"restore it from a backup or train again") from None


def check_fields(ckpt, path):
    for key, types in FIELD_TYPES.items():
        value = ckpt.get(key)
        if value is not None and (not isinstance(value, types) or isinstance(value, bool)
                                  or (isinstance(value, torch.Tensor) and value.numel() != 1)):
            raise UserError(f"{path}: {key} is a {type(value).__name__}, expected "
                            f"{' or '.join(t.__name__ for t in types)}; the file is damaged")
    if isinstance(ckpt.get("iter_num"), (int, torch.Tensor)) and int(ckpt["iter_num"]) < 0:
        raise UserError(f"{path}: iter_num is {int(ckpt['iter_num'])}, below 0; the file is damaged")


# the types of a checkpoint's fields (nanoGPT writes best_val_loss as a 0-d tensor)
FIELD_TYPES = {"model": (dict,), "model_args": (dict,), "optimizer": (dict,), "config": (dict,), "scaler": (dict,),
               "iter_num": (int, torch.Tensor), "best_val_loss": (int, float, torch.Tensor), "rng": (list,),
               "tokenizer": (dict,), "best_val_bpb": (int, float)}


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
    """Rebuild the GPT a checkpoint describes and load its weights.

    model_args are checked against the weights' names and shapes before any
    memory is allocated for the model: a file's claimed sizes are not trusted.
    """
    config, state = checked_config(ckpt, path, **runtime)
    with torch.device("meta"):  # shapes only: the weights are the file's, not an initialisation's
        model = GPT(config)
    dtypes = {name: t.dtype for name, t in model.state_dict().items()}
    shared = shared_bytes(state, config)
    state = {name: (t.clone(memory_format=torch.contiguous_format) if name in shared or not t.is_contiguous() else t)
             .to(dtypes[name]) for name, t in state.items()}  # a parameter of its own bytes, in the model's dtype
    try:
        model.load_state_dict(state, assign=True)  # the tensors read are the weights: loaded once, where they are
    except RuntimeError as e:
        raise UserError(f"{path}: weights do not match its model_args: {str(e).splitlines()[0]}") from None
    if config.tie_weights:  # assign gives each name its own Parameter: share one again, as GPT does
        model.lm_head.weight = model.transformer.wte.weight
    if config.pos_emb == "rope":  # a buffer no checkpoint holds: computed from the config, as GPT does
        model.rope = rope_tables(config).to(model.transformer.wte.weight.device)
    left = [name for name, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    assert not left, f"GPT holds state that no checkpoint holds and nothing here computes: {left}"
    bad = [name for name, p in model.named_parameters() if not torch.isfinite(p).all()]
    if bad:
        raise UserError(f"{path} holds non-finite weights ({bad[0]}): the run that wrote it diverged; "
                        f"use an earlier checkpoint (best.pt?) or train again")
    return model


def checked_config(ckpt, path="checkpoint", **runtime):
    """(config, state): the GPTConfig a checkpoint describes, checked against its weights' names, shapes and bytes,
    and those weights by name; nothing allocated. Whatever builds or sizes a model from a file's model_args asks
    here first: a file's claimed sizes are not trusted."""
    config = config_from_model_args(ckpt["model_args"], path, runtime)
    if not isinstance(ckpt["model"], dict) or not all(isinstance(v, torch.Tensor) for v in ckpt["model"].values()):
        raise UserError(f"{path}: 'model' is not a dict of tensors; the file is not a training checkpoint")
    state = clean_state_dict(ckpt["model"])
    check_storage(state, path)
    if config.tie_weights and "lm_head.weight" not in state and "transformer.wte.weight" in state:
        state["lm_head.weight"] = state["transformer.wte.weight"]
    check_shapes(config, state, path)
    return config, state


def shared_bytes(state, config):
    """The weights whose bytes another weight uses too (a tied head's are wte's by design: not counted). A
    file may lay weights out over one storage (check_storage counts bytes, not which), and parameters on
    such bytes would write each other at every step."""
    names = [n for n, t in state.items() if t.numel() and not (config.tie_weights and n == "lm_head.weight")]
    count = collections.Counter(state[n].untyped_storage().data_ptr() for n in names)
    return {n for n in names if count[state[n].untyped_storage().data_ptr()] > 1}


def check_storage(state, path):
    """Every tensor's bytes are in the file: a tensor whose storage is smaller than its shape (a stride-0
    view), or tensors sharing their bytes (other than a tied lm_head), would make loading allocate from
    sizes the file merely claims."""
    storages = {}
    for name, t in state.items():
        need, held = t.numel() * t.element_size(), t.untyped_storage().nbytes() - t.storage_offset() * t.element_size()
        if held < need:
            raise UserError(f"{path}: {name} has shape {tuple(t.shape)} ({need:,} bytes) but its storage holds "
                            f"{max(held, 0):,} bytes; the file is damaged or made to exhaust memory")
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    head, wte = state.get("lm_head.weight"), state.get("transformer.wte.weight")
    tied = head is not None and wte is not None and (head.data_ptr(), head.shape, head.stride()) == (
        wte.data_ptr(), wte.shape, wte.stride())
    claimed = sum(t.numel() * t.element_size() for name, t in state.items() if not (tied and name == "lm_head.weight"))
    if claimed > sum(storages.values()):
        raise UserError(f"{path}: its weights claim {claimed:,} bytes but hold {sum(storages.values()):,} (tensors "
                        f"share their bytes); the file is damaged or made to exhaust memory")


# a RoPE model's block_size is not visible in its weights; its rotation table grows with it
MAX_ROPE_POSITIONS = 1 << 20


def config_from_model_args(model_args, path, runtime):
    """GPTConfig from a checkpoint's model_args, each value checked against its field's type."""
    if not isinstance(model_args, dict):
        raise UserError(f"{path}: model_args is a {type(model_args).__name__}, not a dict")
    hints = typing.get_type_hints(GPTConfig)
    unknown = sorted(str(k) for k in model_args if k not in hints)
    if unknown:
        raise UserError(f"{path}: model_args has unknown keys {unknown}; was it written by a newer version?")
    args = {k: convert(v, hints[k], k, f"{path}: model_args") for k, v in model_args.items()}
    try:
        config = GPTConfig(**{**args, **runtime})
    except (TypeError, ValueError) as e:
        raise UserError(f"{path}: bad model_args: {e}") from None
    check_rope_positions(config, path, "model_args claims block_size")
    return config


def check_rope_positions(config, path, claim):
    """A RoPE model's positions at most MAX_ROPE_POSITIONS: its rotation table is built from the claim alone."""
    if config.pos_emb == "rope" and config.block_size > MAX_ROPE_POSITIONS:
        raise UserError(f"{path}: {claim}={config.block_size}, beyond {MAX_ROPE_POSITIONS} positions (RoPE's "
                        f"table grows with it, and no weight shows it); the file is damaged, or set it to the "
                        f"context the model was trained for")


# a block's weights: ours (transformer.h.N.) and Llama's (model.layers.N.)
BLOCK_NAME = re.compile(r"(?:transformer\.h|model\.layers)\.([0-9]{1,9})\.")


def check_layer_count(n_layer, names, path, claims="model_args"):
    """The weights' names hold blocks 0 to n_layer - 1: counted from the names, so a claim builds nothing."""
    layers = {int(m.group(1)) for m in map(BLOCK_NAME.match, names) if m}
    if len(layers) != n_layer or max(layers, default=-1) != n_layer - 1:  # layers is range(n_layer)
        raise UserError(f"{path}: {claims} claims n_layer={n_layer} but the weights hold "
                        f"{len(layers)} blocks; the file is damaged or its {claims} were edited")


def check_shapes(config, state, path, claims="model_args", layout=lambda model: model.state_dict()):
    """Every weight GPT(config) expects is in state with its shape, and nothing else is: compared with the
    model built on the meta device (shapes only, no memory), under layout's names (a file's own: Llama's),
    once the blocks are counted. claims: what config was read from."""
    check_layer_count(config.n_layer, state, path, claims)
    try:
        with torch.device("meta"):
            expected = {name: tuple(t.shape) for name, t in layout(GPT(config)).items()}
    except (RuntimeError, TypeError, ValueError, OverflowError) as e:  # sizes past what a tensor can hold
        reason = str(e).split("\n")[0][:160]
        raise UserError(f"{path}: {claims} describe a model no tensor can hold ({type(e).__name__}: {reason}); the "
                        f"file is damaged or its {claims} were edited") from None
    missing = [k for k in expected if k not in state]
    extra = [k for k in state if k not in expected]
    wrong = [k for k in expected if k in state and tuple(state[k].shape) != expected[k]]
    if missing or extra or wrong:
        what = (f"{wrong[0]} has shape {tuple(state[wrong[0]].shape)}, {claims} make it {expected[wrong[0]]}"
                if wrong else f"missing {missing[0]}" if missing else f"unexpected {extra[0]}")
        raise UserError(f"{path}: weights do not match its {claims} ({what}; {len(missing)} missing, "
                        f"{len(extra)} unexpected, {len(wrong)} of another shape)")


def save_sharded(meta, model, optimizer, path, rank=0, world=1):
    """Write model and optimizer, sharded or not, as a DCP directory at path; meta (the other fields)
    goes into its meta.pt. Every process calls it together and writes its own shards; the directory
    is written beside path and renamed into place, so path always holds a complete checkpoint."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict import get_state_dict
    parent, name = os.path.split(os.path.abspath(path))
    tmp, old = os.path.join(parent, f".{name}.tmp"), os.path.join(parent, f".{name}.old")
    try:
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
            os.makedirs(tmp)
        if world > 1:
            dist.barrier()
        model_state, optim_state = get_state_dict(model, optimizer_list(optimizer))
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*single process")  # one process: nothing to coordinate
            dcp.save({"model": model_state, "optimizer": optim_state}, checkpoint_id=tmp)
        if rank == 0:
            missing = [r for r in range(world) if not os.path.exists(os.path.join(tmp, f"__{r}_0.distcp"))]
            if missing:
                raise UserError(f"saving {path}: the shards of rank {missing[0]} are not in {tmp}: out_dir must be "
                                f"on a filesystem every node shares (NFS, a cluster filesystem); the previous "
                                f"checkpoint is intact")
            save_checkpoint(meta, os.path.join(tmp, "meta.pt"))  # last: a directory with meta.pt is complete
            shutil.rmtree(old, ignore_errors=True)
            moved = os.path.exists(path)
            if moved:
                os.replace(path, old)  # a directory cannot be renamed over another: move the old one aside first
            os.replace(tmp, path)
            if moved:
                shutil.rmtree(old)
            fsync_dir(parent)
    except (OSError, CheckpointException) as e:
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        cause = describe_os_error(e) if isinstance(e, OSError) else str(e).strip().splitlines()[-1]
        previous = ("the previous one is intact" if os.path.exists(path) else
                    f"the previous one is in {old}" if os.path.exists(old) else "nothing was written")
        raise UserError(f"saving {path} failed: {cause}; {previous}") from None
    if world > 1:
        dist.barrier()  # no process goes on (or exits) before the checkpoint is in place


def save_training(meta, model, optimizer, path, sharded=False, rank=0, world=1):
    """A training run's checkpoint at path (ckpt.pt, best.pt) or, sharded (every process calls it), its
    directory (ckpt.dcp, best.dcp): weights, optimizer state and meta's fields. The other form of the same
    checkpoint, older now, is removed, so that readers find the one just saved."""
    if sharded:
        save_sharded(meta, model, optimizer, sharded_path(path), rank, world)
        stale = path
    else:
        if rank == 0:
            save_checkpoint({"model": model.state_dict(), "optimizer": optimizer.state_dict(), **meta}, path)
        stale = sharded_path(path)
    if rank == 0 and os.path.exists(stale):
        discard(stale)


def read_sharded(directory, weights=True):
    """A sharded checkpoint's fields; with weights, "model" holds its weights as whole tensors, read
    from every shard by this one process. Claimed sizes are checked before memory is allocated."""
    meta_path = os.path.join(directory, "meta.pt")
    if not os.path.exists(meta_path):
        raise UserError(f"{directory} is not a sharded checkpoint (it has no meta.pt); restore it from a backup "
                        f"or train again")
    ckpt = read_tensors(meta_path)
    if not isinstance(ckpt, dict) or "model_args" not in ckpt:
        raise UserError(f"{meta_path} is not a checkpoint's metadata (needs a 'model_args' key)")
    check_fields(ckpt, directory)
    ckpt["sharded"] = directory
    shapes = sharded_shapes(directory)
    config = config_from_model_args(ckpt["model_args"], directory, {})
    check_shapes(config, {k: torch.empty(size, device="meta") for k, (size, _) in shapes.items()}, directory)
    if weights:
        from nanogpt.memory import check_fits
        claimed = sum(size.numel() * dtype.itemsize for size, dtype in shapes.values())
        shards = [e.path for e in os.scandir(directory) if e.name.endswith(".distcp")]
        for shard in shards:
            check_regular(shard)  # a FIFO's size is 0, and reading it would wait forever
        held = sum(os.path.getsize(shard) for shard in shards)
        if claimed > held:
            raise UserError(f"{directory}: a shard is missing or damaged (the metadata claims {claimed:,} bytes of "
                            f"weights, the shard files hold {held:,}); restore the directory from a backup or train "
                            f"again")
        check_fits(claimed, torch.device("cpu"),
                   f"reading the weights of {directory}", "free some memory")
        state = {k: torch.empty(size, dtype=dtype) for k, (size, dtype) in shapes.items()}
        dcp_load({"model": state}, directory)
        ckpt["model"] = state
    return ckpt


def load_sharded(model, optimizer, directory):
    """Load a sharded checkpoint's weights and optimizer state into model and optimizer, sharded or not,
    whatever the number of processes that wrote it. Every process calls it together."""
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    model_state, optim_state = get_state_dict(model, optimizer_list(optimizer))  # the shapes to fill
    state = {"model": model_state, "optimizer": optim_state}
    dcp_load(state, directory)
    set_state_dict(model, optimizer_list(optimizer), model_state_dict=state["model"],
                   optim_state_dict=state["optimizer"])
