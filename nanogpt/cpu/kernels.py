"""Faster CPU products for nn.Linear in training: oneDNN on packed weights, forward and backward.

PyTorch's default float32 matmul on CPUs (MKL) runs a small model's training
products at a fraction of what the same CPU does through oneDNN on a weight
reordered ("packed") for it (measured in docs/speedrun.md). packed_training(model)
sends every nn.Linear through PackedLinear while gradients are computed: the
input times the packed weight, and in backward the output's gradient times the
packed transposed weight. The weight's own gradient stays the default matmul,
the fastest kernel for its shapes when measured. A weight is packed again once
the optimizer has changed it (its version counter moved), so once per iteration
however many micro-batches use it. The numbers are float32 products like the
default's, summed in another order.

On CPUs with native bfloat16 (AVX-512 BF16, AMX), packed_training(model,
torch.bfloat16) instead runs the three products of each linear layer in
bfloat16 (BFloat16Linear): float32 weights, optimizer and everything between
the products stay as they are; the inputs of each product are rounded to
bfloat16, summed in float32, and its output rounded to bfloat16 before it is
returned in float32, as autocast's bfloat16 products are. oneDNN runs these
faster than packed float32 on such CPUs, with no packing (docs/speedrun.md,
Speedrun III). device.training_kernels decides which of the two a run uses.

Generation packs too (packed_inference, through cpu.decoding), for inference mode only; fused_step.py's
fused step reads those copies. This module is the one place that calls oneDNN. Both contexts set the layers'
forward through patched_forwards, which gives each layer back what it ran before: generating inside
packed_training leaves the training kernels in place. WeightVersion (WeightVersions for many) is the one rule for
"has this weight changed": WeightCopy makes its copies again on it, and fused_step.FusedStep steps aside on it.
"""
import operator
import weakref
from contextlib import contextmanager

import torch
import torch.nn as nn
import torch.nn.functional as F


def onednn_available():
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def packed_product(x, packed, bias=None, post=("none", [], "")):
    """x (rows, in) times a weight packed by torch.ops.mkldnn._reorder_linear_weight, plus bias, then
    oneDNN's post-op (name, scalars, algorithm): none, or an activation such as ("gelu", [], "tanh")."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, *post)


def packed_product_add(x, packed, bias, residual):
    """residual + x times a packed weight plus bias: the addition inside the product."""
    return torch.ops.mkldnn._linear_pointwise.binary(x, residual, packed, bias, "add")


class WeightVersion:
    """A tensor's values as they are now: holds(t) while t is that same tensor, at the same address (`.data =`
    moves it, and not the version counter), unchanged in place (an optimizer step moves its version counter)."""
    __slots__ = ("tensor", "address", "version")

    def __init__(self, tensor):
        self.tensor, self.address, self.version = tensor, tensor.data_ptr(), tensor._version

    def holds(self, tensor):
        return tensor is self.tensor and tensor._version == self.version and tensor.data_ptr() == self.address


class WeightVersions:
    """WeightVersion for many tensors, checked with C loops (map) rather than Python's: a decode step asks it of
    some 50 tensors every step. holds() while each is at its address and unchanged in place."""
    __slots__ = ("tensors", "versions", "addresses")
    VERSION = operator.attrgetter("_version")

    def __init__(self, tensors):
        self.tensors = tuple(tensors)
        self.versions, self.addresses = self.now()

    def now(self):
        return tuple(map(self.VERSION, self.tensors)), tuple(map(torch.Tensor.data_ptr, self.tensors))

    def holds(self):
        return self.now() == (self.versions, self.addresses)


class WeightCopy:
    """make(weight, *args) for the weight's current values: made again only once the weight has changed
    (WeightVersion) or args differ."""

    def __init__(self, make):
        self.make, self.made, self.args = make, None, None

    def get(self, weight, *args):
        if self.made is None or not self.made.holds(weight) or args != self.args:
            with torch.no_grad():
                self.value = self.make(weight, *args)
            self.made, self.args = WeightVersion(weight), args
        return self.value


def packable(weight, dtype=torch.float32):
    """True where a weight can be packed in dtype: a float32 weight on a CPU with oneDNN, for float32 products or
    (where the CPU multiplies it natively) bfloat16 ones."""
    return (weight.device.type == "cpu" and weight.dtype == torch.float32 and onednn_available()
            and (dtype == torch.float32 or dtype == torch.bfloat16 and bfloat16_products_supported()))


def pack(weight, rows, dtype=torch.float32):
    """weight (out, in) rounded to dtype and laid out by oneDNN for products with inputs of about `rows` rows:
    packed_product's `packed` (whose inputs are then of dtype)."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.to(dtype), rows)


class PackedWeight(WeightCopy):
    """A linear layer's weight packed for oneDNN for `rows` rows, and its transpose: get(weight, rows)."""

    def __init__(self):
        super().__init__(lambda weight, rows: (pack(weight, rows), pack(weight.t().contiguous(), rows)))


class PackedLinear(torch.autograd.Function):
    """y = x W^T + b with both products that involve W on its packed copies."""

    @staticmethod
    def forward(ctx, x, weight, bias, packed):
        rows = x.reshape(-1, x.size(-1))  # (N, in)
        forward, backward = packed.get(weight, rows.size(0))
        ctx.save_for_backward(rows, weight)
        ctx.backward_weight, ctx.input_shape, ctx.has_bias = backward, x.shape, bias is not None
        return packed_product(rows, forward, bias).view(*x.shape[:-1], weight.size(0))

    @staticmethod
    def backward(ctx, grad):
        rows, weight = ctx.saved_tensors
        grad = grad.reshape(-1, grad.size(-1)).contiguous()  # (N, out)
        dx = dw = db = None
        if ctx.needs_input_grad[0]:
            dx = packed_product(grad, ctx.backward_weight).view(ctx.input_shape)  # (N, out) @ W
        if ctx.needs_input_grad[1]:
            dw = grad.t() @ rows  # (out, in)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            db = grad.sum(0)
        return dx, dw, db, None


class BFloat16Linear(torch.autograd.Function):
    """y = x W^T + b with its three products (y, the input's and the weight's gradients) in bfloat16."""

    @staticmethod
    def forward(ctx, x, weight, bias, cast):
        rows = x.reshape(-1, x.size(-1)).bfloat16()  # (N, in), saved in bfloat16: half the memory
        w = cast.get(weight)
        ctx.save_for_backward(rows, w)
        ctx.input_shape, ctx.has_bias = x.shape, bias is not None
        y = (rows @ w.t()).float()
        if bias is not None:
            y = y + bias
        return y.view(*x.shape[:-1], weight.size(0))

    @staticmethod
    def backward(ctx, grad):
        rows, w = ctx.saved_tensors
        grad = grad.reshape(-1, grad.size(-1))  # (N, out)
        g = grad.bfloat16()
        dx = dw = db = None
        if ctx.needs_input_grad[0]:
            dx = (g @ w).float().view(ctx.input_shape)
        if ctx.needs_input_grad[1]:
            dw = (g.t() @ rows).float()
        if ctx.has_bias and ctx.needs_input_grad[2]:
            db = grad.sum(0)
        return dx, dw, db, None


class BFloat16Weight(WeightCopy):
    """A weight rounded to bfloat16: get(weight)."""

    def __init__(self):
        super().__init__(lambda weight: weight.detach().bfloat16())


def bfloat16_products_supported():
    """True where this CPU multiplies bfloat16 natively (elsewhere it is emulated, several times slower)."""
    return torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()


# module -> what it ran before any open patch (NO_FORWARD: its class's forward), then each open patch's forward
_forward_stacks = weakref.WeakKeyDictionary()
NO_FORWARD = object()


@contextmanager
def patched_forwards(forwards):
    """Within: each module of forwards ({module: forward}) runs forward, an instance attribute that shadows its
    class's. On exit each runs what it would without this patch: the forward of a patch opened later and still
    open, else what it had before (its own instance forward, or none). Patches nest in any order, and one may
    close before a patch opened within it (a generator closed late)."""
    for module, forward in forwards.items():
        _forward_stacks.setdefault(module, [module.__dict__.get("forward", NO_FORWARD)]).append(forward)
        module.forward = forward
    try:
        yield
    finally:
        for module, forward in forwards.items():
            unpatch(module, forward)


def unpatch(module, forward):
    """Take forward, a patch's, off module: it then runs the newest patch still open, or what it had before."""
    stack = _forward_stacks[module]
    del stack[max(i for i in range(1, len(stack)) if stack[i] is forward)]
    if len(stack) == 1:
        del _forward_stacks[module]
    if stack[-1] is NO_FORWARD:
        module.__dict__.pop("forward", None)
    else:
        module.forward = stack[-1]


@contextmanager
def packed_training(model, dtype=torch.float32):
    """Within: model's linear layers compute through PackedLinear (dtype float32) or BFloat16Linear
    (bfloat16) while gradients are recorded (float32 inputs); without gradients (evaluation,
    generation) they are unchanged."""
    def forward_of(linear):
        bfloat16 = dtype == torch.bfloat16
        function, weight = (BFloat16Linear, BFloat16Weight()) if bfloat16 else (PackedLinear, PackedWeight())

        def forward(x):
            if torch.is_grad_enabled() and x.dtype == torch.float32 and linear.weight.requires_grad:
                return function.apply(x, linear.weight, linear.bias, weight)
            return F.linear(x, linear.weight, linear.bias)
        return forward
    with patched_forwards({m: forward_of(m) for m in model.modules() if isinstance(m, nn.Linear)}):
        yield


@contextmanager
def packed_inference(linears, rows, dtype=torch.float32):
    """Within: each of linears whose weight is packable computes in inference mode on a copy of its weight packed
    for inputs of about `rows` rows (packed again once the weight changed), elsewhere (autograd, torch.compile,
    other dtypes) as before. Yields {linear: its packed weight}.

    On CPU, PyTorch's default float32 matmul reads a weight matrix far below memory bandwidth when the input
    has few rows, as in decoding one token per step; the packed copy gives the same float32 numbers faster.
    dtype bfloat16 (generation under bfloat16 autocast) packs the weights rounded to bfloat16, half the bytes
    to read: the products are autocast's (bfloat16 inputs, float32 sums, a bfloat16 output)."""
    copies = {m: WeightCopy(lambda weight, rows: pack(weight, rows, dtype) if packable(weight, dtype) else None)
              for m in linears if packable(m.weight, dtype)}
    packed = {m: copy.get(m.weight, rows) for m, copy in copies.items()}
    with patched_forwards({m: inference_forward(m, copy, rows, dtype) for m, copy in copies.items()}):
        yield packed


def inference_forward(linear, copy, rows, dtype):
    """linear's forward on copy.get(its weight, rows) (a WeightCopy of pack) in inference mode: float32 inputs
    (dtype float32), or under bfloat16 autocast float32 or bfloat16 inputs (dtype bfloat16)."""
    def forward(x):
        if not torch.compiler.is_compiling() and torch.is_inference_mode_enabled() and (
                x.dtype == torch.float32 if dtype == torch.float32 else
                x.dtype in (torch.float32, torch.bfloat16) and torch.is_autocast_enabled("cpu")
                and torch.get_autocast_dtype("cpu") == torch.bfloat16):
            packed = copy.get(linear.weight, rows)
            if packed is not None:
                bias = linear.bias if linear.bias is None else linear.bias.to(dtype)
                return packed_product(x.to(dtype).contiguous(), packed, bias)
        return F.linear(x, linear.weight, linear.bias)
    return forward
