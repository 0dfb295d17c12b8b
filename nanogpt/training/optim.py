"""The optimizers and the learning-rate schedule.

configure_optimizers builds AdamW (or Muon for the blocks' matrices with AdamW
for the rest), each parameter group remembering its initial_lr; lr_scale is
the schedule as a multiplier of those rates.

Muon, for the hidden weight matrices, fast on CPU and GPU alike.

The math is torch.optim.Muon's (torch 2.13): Nesterov momentum, then the
quintic Newton-Schulz iteration (a, b, c) = (3.4445, -4.7750, 2.0315) that
pushes the update's singular values towards 1, then a step of
lr * sqrt(max(1, rows/cols)) with decoupled weight decay. Two differences, in
speed only: on CPUs the iteration runs in float32 unless asked for bfloat16
(ns_dtype; train.py's matmul_dtype), and matrices of the same shape go through
it together as one batched matmul.
"""
import math
from collections import defaultdict
from dataclasses import dataclass, fields

import torch

from nanogpt.errors import UserError


@dataclass(frozen=True)
class OptimizerSettings:
    """Everything configure_optimizers needs: the run's optimizer fields (TrainConfig's, or a checkpoint's saved
    config) and Muon's Newton-Schulz dtype (None: fast_matmul_dtype), so that every caller passes all of it."""
    optimizer: str
    learning_rate: float
    weight_decay: float
    beta1: float
    beta2: float
    muon_lr: float
    muon_momentum: float
    muon_weight_decay: float
    embedding_lr: float | None = None
    ns_dtype: torch.dtype | None = None

    @classmethod
    def adamw(cls, learning_rate, weight_decay, beta1, beta2):
        """AdamW's settings alone (Muon's fields unused), for a program without train.py's optimizer keys."""
        return cls("adamw", learning_rate, weight_decay, beta1, beta2, muon_lr=0.0, muon_momentum=0.0,
                   muon_weight_decay=0.0)

    @classmethod
    def of(cls, config, ns_dtype=None):
        """The settings config holds: an object with these fields as attributes (a TrainConfig), or a dict of
        them (a checkpoint's config; a key it does not hold, such as embedding_lr, is None)."""
        values = config if isinstance(config, dict) else vars(config)
        return cls(**{f.name: values[f.name] for f in fields(cls) if f.name not in ("embedding_lr", "ns_dtype")},
                   embedding_lr=values.get("embedding_lr"), ns_dtype=ns_dtype)


def configure_optimizers(model, settings):
    """AdamW, decaying matrices and embeddings (2+ dims) but not biases and gains; settings: OptimizerSettings.

    optimizer="muon": Muon for the hidden matrices of the blocks, AdamW for embeddings,
    the head, biases and gains, as modded-nanogpt does. embedding_lr: AdamW's rate for the
    token (and value) embeddings, in a third group without weight decay (None: learning_rate,
    and two groups, as nanoGPT's checkpoints hold). Each group remembers its initial_lr: the
    schedule scales them together (lr_scale). AdamW is fused where the model is on CUDA.
    """
    s = settings
    optimizer, embedding_lr = s.optimizer, s.embedding_lr
    params = [p for p in model.parameters() if p.requires_grad]
    block_matrices = {id(p) for p in model.transformer.h.parameters() if p.dim() == 2} if optimizer == "muon" else set()
    embeddings = {id(p) for name, p in model.named_parameters() if embedding_lr is not None and
                  (name == "transformer.wte.weight" or name.startswith("transformer.ve."))}
    adam_groups = [
        {"params": [p for p in params if p.dim() >= 2 and id(p) not in block_matrices | embeddings],
         "weight_decay": s.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    if embeddings:  # not decayed: at such rates decay would shrink every step the rows of tokens the batch lacks
        adam_groups.append({"params": [p for p in params if id(p) in embeddings], "weight_decay": 0.0,
                            "lr": embedding_lr})
    # no empty group: torch's distributed optimizer state (sharded checkpoints) refuses one beside another optimizer
    adam_groups = [g for g in adam_groups if g["params"]]
    device_type = next(model.parameters()).device.type
    adamw = torch.optim.AdamW(adam_groups, lr=s.learning_rate, betas=(s.beta1, s.beta2), fused=device_type == "cuda")
    if optimizer == "adamw":
        opt = adamw
    elif optimizer == "muon":
        muon = Muon([p for p in params if id(p) in block_matrices], lr=s.muon_lr, momentum=s.muon_momentum,
                    weight_decay=s.muon_weight_decay, ns_dtype=s.ns_dtype)
        opt = Optimizers(muon=muon, adamw=adamw)
    else:
        raise ValueError(f"optimizer must be adamw or muon, got {optimizer!r}")
    for group in opt.param_groups:
        group["initial_lr"] = group["lr"]
    return opt


@dataclass(frozen=True)
class Schedule:
    """What lr_scale reads, for a program without train.py's schedule keys (a TrainConfig has each of them)."""
    learning_rate: float
    min_lr: float
    warmup_iters: int
    lr_decay_iters: int
    decay_lr: bool = True
    lr_schedule: str = "cosine"
    cooldown_iters: int = 0


def lr_scale(it, cfg):
    """The schedule at iteration it, as a multiplier of each group's initial rate:
    group["lr"] = group["initial_lr"] * lr_scale(it, cfg). cfg: a TrainConfig, or a Schedule.

    Linear warmup for warmup_iters; then cosine decay to min_lr / learning_rate at lr_decay_iters,
    or (wsd) 1 until cooldown_iters before lr_decay_iters and a linear decay to the floor there;
    then the floor.
    """
    if not cfg.decay_lr:
        return 1.0
    floor = cfg.min_lr / cfg.learning_rate if cfg.learning_rate else 0.0
    if it < cfg.warmup_iters:
        return (it + 1) / (cfg.warmup_iters + 1)
    if it >= cfg.lr_decay_iters:
        return floor
    if cfg.lr_schedule == "wsd":
        left = cfg.lr_decay_iters - it  # > 0
        if left >= cfg.cooldown_iters:
            return 1.0
        return floor + (1.0 - floor) * left / cfg.cooldown_iters
    ratio = (it - cfg.warmup_iters) / (cfg.lr_decay_iters - cfg.warmup_iters)  # > 0: it < lr_decay_iters
    return floor + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (1.0 - floor)


# what loading a damaged optimizer, scaler or RNG state raises
DAMAGED = (ValueError, KeyError, TypeError, IndexError, RuntimeError, AttributeError, OverflowError)


def restore_optimizer(model, optimizer, load, path, what):
    """A checkpoint's optimizer state put into optimizer by load() (optimizer.load_state_dict, or a sharded
    loader), checked against the model's shapes, or a UserError naming what (the optimizer this run builds).
    The rates stay this run's: initial_lr, the schedule's peaks, is put back over the saved one."""
    peaks = [group.get("initial_lr") for group in optimizer.param_groups]
    try:
        load()
    except DAMAGED as e:
        raise UserError(f"{path}: its optimizer state does not fit {what} ({e})") from None
    check_optimizer_state(model, optimizer, path)
    for group, peak in zip(optimizer.param_groups, peaks):
        group["initial_lr"] = peak


def check_optimizer_state(model, optimizer, path):
    """Each parameter's state (AdamW's exp_avg and exp_avg_sq, Muon's momentum_buffer) has the parameter's
    shape: loading does not check it, and a wrong one would fail only in the first step."""
    names = {p: name for name, p in model.named_parameters()}
    state = optimizer.state
    for group in optimizer.param_groups:
        for p in group["params"]:
            for key, value in state.get(p, {}).items():
                if isinstance(value, torch.Tensor) and value.dim() and value.shape != p.shape:
                    raise UserError(f"{path}: its optimizer state does not fit the model: {key} of {names.get(p)} "
                                    f"has shape {tuple(value.shape)}, the parameter {tuple(p.shape)}; the file is "
                                    f"damaged: resume from another checkpoint (best.pt?) or train anew")


NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)


def orthogonalize(g, steps=5, eps=1e-7, dtype=torch.float32):
    """Newton-Schulz approximation of U V^T for each matrix of g (..., rows, cols) = U S V^T."""
    a, b, c = NS_COEFFICIENTS
    x = g.to(dtype)
    tall = g.size(-2) > g.size(-1)
    if tall:  # iterate on the smaller Gram matrix
        x = x.mT
    x = x / x.norm(dim=(-2, -1), keepdim=True).clamp(min=eps)
    for _ in range(steps):
        gram = x @ x.mT
        x = a * x + (b * gram + c * gram @ gram) @ x
    return (x.mT if tall else x).to(g.dtype)


def fast_matmul_dtype(device):
    """Muon's default iteration dtype: bfloat16 on GPUs; float32 on CPUs.

    Without native support bfloat16 matmuls are emulated and several times slower than float32;
    where a CPU has it, bfloat16 pays only when the run's other products are bfloat16 too
    (matmul_dtype, docs/speed.md), which then passes ns_dtype.
    """
    return torch.float32 if device.type == "cpu" else torch.bfloat16


class Muon(torch.optim.Optimizer):
    """Muon on 2-D parameters; same-shaped matrices are orthogonalized in one batch."""

    def __init__(self, params, lr=0.02, weight_decay=0.0, momentum=0.95, nesterov=True, ns_steps=5, ns_dtype=None):
        defaults = dict(lr=lr, weight_decay=weight_decay, momentum=momentum, nesterov=nesterov, ns_steps=ns_steps)
        super().__init__(params, defaults)
        for group in self.param_groups:
            for p in group["params"]:
                if p.dim() != 2:
                    raise ValueError(f"Muon takes 2-D parameters only, got shape {tuple(p.shape)}")
        self.ns_dtype = ns_dtype

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            by_shape = defaultdict(list)
            for p in group["params"]:
                if p.grad is not None:
                    by_shape[p.shape].append(p)
            for shape, params in by_shape.items():
                self._update(group, shape, params)
        return loss

    def _update(self, group, shape, params):
        updates = []
        for p in params:
            state = self.state[p]
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(p)
            buf = state["momentum_buffer"]
            buf.lerp_(p.grad, 1 - group["momentum"])
            updates.append(whole(p.grad.lerp(buf, group["momentum"]) if group["nesterov"] else buf))
        dtype = self.ns_dtype or fast_matmul_dtype(updates[0].device)
        update = orthogonalize(torch.stack(updates), group["ns_steps"], dtype=dtype)  # (n, rows, cols)
        lr = group["lr"] * math.sqrt(max(1.0, shape[0] / shape[1]))
        for p, u in zip(params, update):
            p.mul_(1 - group["lr"] * group["weight_decay"])
            p.add_(part_of(u, p), alpha=-lr)


def whole(t):
    """The whole matrix of a parameter's shard (FSDP): Newton-Schulz needs all of it. Every process
    gathers and orthogonalizes each matrix, the cost of Muon on sharded parameters."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def part_of(full, p):
    """The piece of a whole matrix that p holds: its shard under FSDP (no communication), else all of it."""
    if not hasattr(p, "device_mesh"):
        return full
    from torch.distributed.tensor import distribute_tensor
    return distribute_tensor(full, p.device_mesh, p.placements, src_data_rank=None)


class Optimizers:
    """Several optimizers used as one: Muon for the hidden matrices, AdamW for the rest."""

    def __init__(self, **optimizers):
        self.optimizers = optimizers

    @property
    def param_groups(self):
        return [group for opt in self.optimizers.values() for group in opt.param_groups]

    @property
    def state(self):
        return {p: s for opt in self.optimizers.values() for p, s in opt.state.items()}

    def step(self, closure=None):
        for opt in self.optimizers.values():
            opt.step(closure)

    def zero_grad(self, set_to_none=True):
        for opt in self.optimizers.values():
            opt.zero_grad(set_to_none=set_to_none)

    def state_dict(self):
        return {name: opt.state_dict() for name, opt in self.optimizers.items()}

    def load_state_dict(self, state):
        if set(state) != set(self.optimizers):
            raise ValueError(f"optimizer state holds {sorted(state)}, this run uses {sorted(self.optimizers)}")
        for name, opt in self.optimizers.items():
            opt.load_state_dict(state[name])
