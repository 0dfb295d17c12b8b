"""Which device and dtype to run on, and what the device can do."""
import time
from contextlib import nullcontext
from dataclasses import dataclass

import torch

from nanogpt.cpu.kernels import bfloat16_products_supported, onednn_available, packed_training
from nanogpt.errors import UserError

DEVICE_TYPES = ("cpu", "cuda", "mps")  # what the scripts run on; torch knows more (meta, xpu, ...)


@dataclass
class Device:
    """The device key, declared once: every program's config inherits it (one whose default differs overrides
    it in its own class, saying why)."""
    # system
    device: str = "auto"  # auto (cuda, else mps, else cpu), cpu, cuda, cuda:1, mps


@dataclass
class Dtype:
    """The dtype key, declared once: the configs of the programs that compute in a chosen dtype inherit it."""
    # system
    dtype: str = "auto"  # auto (bfloat16 on CUDA where supported, else float16; float32 on CPU)


def resolve_device(name, local_rank=0):
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device(f"cuda:{local_rank}")
        if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        device = None
    if device is None or device.type not in DEVICE_TYPES:
        raise UserError(f"device {name!r} is not supported; valid devices are cpu, cuda[:N], mps, auto")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"device={name} but CUDA is not available on this machine; use --device=cpu (or auto)")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise UserError(f"device={name} but MPS is not available on this machine; use --device=cpu (or auto)")
    return device


def resolve_dtype(name, device):
    if name == "auto":
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.float32
    return getattr(torch, name)


def peak_flops_for(device, dtype):
    """Dense bf16/fp16 tensor-core peaks of known GPUs; None where unknown (pass --peak_flops)."""
    if device.type != "cuda" or dtype == torch.float32:
        return None
    name = torch.cuda.get_device_name(device)
    for key, flops in (("H200", 989e12), ("H100", 989e12), ("A100", 312e12), ("L4", 121e12), ("4090", 165e12)):
        if key in name:
            return flops
    return None


def autocast(device, dtype):
    """Mixed precision in dtype on device; nothing to do for float32."""
    return torch.autocast(device.type, dtype=dtype) if dtype != torch.float32 else nullcontext()


def sync(device):
    """Wait for device's queued work: a timing on a GPU must not stop its clock before the kernels end."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def should_compile(setting, device):
    """compile=True/False as given; None means on CUDA, where it pays for itself, and not elsewhere."""
    return setting if setting is not None else device.type == "cuda"


def batch_seconds(model, x, y, ctx=nullcontext(), budget=1.0, probe=16):
    """Rough seconds of a training forward and backward of model on the batch x (B, T), targets y, on this CPU
    with its threads to itself: the CPU time of passes on one thread, over the batch's first rows and tokens
    (probe tokens of one row, then twice the tokens, then twice the rows, while the passes so far and one twice
    as long fit the budget of CPU seconds), divided among torch's threads. CPU time, unlike the wall clock,
    barely moves with what else the machine runs. The last pass's time is extended by the FLOPs still missing
    at the rate the last two passes differ by: a pass that costs mostly its operations' overhead is not scaled
    as if it were all arithmetic. Leaves no gradients and the global RNG as it was (dropout draws from it;
    training owns it: exact resume)."""
    B, T = x.shape
    flops = lambda r, t: r * t * model.flops_per_token(t)  # noqa: E731

    def timed(r, t):
        start = time.process_time()
        with ctx:
            _, loss = model(x[:r, :t], y[:r, :t])
        loss.backward()
        return time.process_time() - start

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one thread's CPU time is its work; several also count their waits for each other
    try:
        with torch.random.fork_rng(devices=[]):
            r, t = 1, min(T, probe)
            timed(r, t)  # warm-up: the first pass allocates
            passes, spent = [], 0.0
            while True:
                took = timed(r, t)
                passes.append((flops(r, t), took))
                spent += took
                if (r, t) == (B, T) or spent + 2 * took > budget:
                    break
                r, t = (r, min(T, 2 * t)) if t < T else (min(B, 2 * r), t)
    finally:
        torch.set_num_threads(threads)
        for p in model.parameters():
            p.grad = None
    f, took = passes[-1]
    per_flop = took / f  # at most as if the last pass were all arithmetic
    if len(passes) > 1:
        per_flop = min(max(took - passes[-2][1], 0.0) / (f - passes[-2][0]), per_flop)
    return (took + (flops(B, T) - f) * per_flop) / threads


@dataclass(frozen=True)
class MatmulKernels:
    """The kernels of training's products: kernels.py's in dtype (float32 on packed weights, or bfloat16),
    or PyTorch's defaults (dtype None)."""
    dtype: torch.dtype | None = None

    def applied(self, model):
        """Within: model's linear layers compute their products with these kernels while gradients are recorded."""
        return packed_training(model, self.dtype) if self.dtype is not None else nullcontext()

    @property
    def ns_dtype(self):
        """Muon's Newton-Schulz dtype to go with them: bfloat16 beside bfloat16 products, else None (its default)."""
        return torch.bfloat16 if self.dtype == torch.bfloat16 else None


def training_kernels(cfg, device, dtype, compile=False, sharded=False, log=print):
    """The MatmulKernels a run of cfg uses on device in dtype, from its two keys: matmul_dtype (float32,
    bfloat16, or auto: bfloat16 where the CPU has it natively) and packed_linear (float32 on packed weights; None:
    where it applies). kernels.py's products apply to float32 training on a CPU without compile or FSDP."""
    fits = device.type == "cpu" and dtype == torch.float32 and not compile and not sharded
    if cfg.matmul_dtype == "auto" and fits and bfloat16_products_supported():
        return MatmulKernels(torch.bfloat16)
    if cfg.matmul_dtype == "auto" and device.type == "cpu" and dtype == torch.float32:
        log("note: matmul_dtype=auto: float32 products (bfloat16 needs float32 training on a CPU with AVX-512 BF16 "
            "or AMX, without compile or FSDP)")
    if cfg.matmul_dtype == "bfloat16":
        if not fits:
            raise UserError("matmul_dtype=bfloat16 is for float32 training on a CPU without compile or FSDP "
                            "(elsewhere use --dtype=bfloat16); drop it or use --device=cpu --dtype=float32")
        if not bfloat16_products_supported():
            raise UserError("matmul_dtype=bfloat16: this CPU has no native bfloat16 (AVX-512 BF16 or AMX), so its "
                            "products would be emulated and slower; use --matmul_dtype=float32")
        return MatmulKernels(torch.bfloat16)
    if cfg.packed_linear is not False and fits and onednn_available():
        return MatmulKernels(torch.float32)
    if cfg.packed_linear:
        log("note: packed_linear applies to float32 training on a CPU with oneDNN, without compile or FSDP; "
            "training with the default matmul")
    return MatmulKernels()
