"""Faster CPU products for nn.Linear in training: oneDNN on packed weights, forward and backward.

PyTorch's default float32 matmul on CPUs (MKL) runs a small model's training
products at a fraction of what the same CPU does through oneDNN on a weight
reordered ("packed") for it: for 1,536 rows through a 128 x 384 weight, 0.70
ms against 0.31 (2026-11-30, 2 cores). packed_training(model) sends every
nn.Linear through PackedLinear while gradients are computed: the input times
the packed weight, and in backward the output's gradient times the packed
transposed weight. The weight's own gradient stays the default matmul, the
fastest kernel for its shape here. A weight is packed again once the
optimizer has changed it (its version counter moved), so once per iteration
however many micro-batches use it. The numbers are float32 products like the
default's, summed in another order.
"""
from contextlib import contextmanager

import torch
import torch.nn as nn
import torch.nn.functional as F


def onednn_available():
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def packed_product(x, packed, bias=None):
    """x (rows, in) times a weight packed by torch.ops.mkldnn._reorder_linear_weight, plus bias."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


class PackedWeight:
    """A linear layer's weight packed for oneDNN, and its transpose, for the weight's current values."""

    def __init__(self):
        self.key = None

    def get(self, weight, rows):
        key = (weight.data_ptr(), weight._version, rows)
        if key != self.key:
            with torch.no_grad():
                self.forward = torch.ops.mkldnn._reorder_linear_weight(weight, rows)  # (out, in)
                self.backward = torch.ops.mkldnn._reorder_linear_weight(weight.t().contiguous(), rows)  # (in, out)
            self.key = key
        return self.forward, self.backward


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


def can_pack(model):
    """True where packed training applies: float32 weights on a CPU with oneDNN."""
    weight = next(model.parameters())
    return weight.device.type == "cpu" and weight.dtype == torch.float32 and onednn_available()


@contextmanager
def packed_training(model):
    """Within: model's linear layers compute through PackedLinear while gradients are recorded (float32
    inputs); without gradients (evaluation, generation) they are unchanged."""
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]

    def forward_of(linear):
        packed = PackedWeight()

        def forward(x):
            if torch.is_grad_enabled() and x.dtype == torch.float32 and linear.weight.requires_grad:
                return PackedLinear.apply(x, linear.weight, linear.bias, packed)
            return F.linear(x, linear.weight, linear.bias)
        return forward
    try:
        for m in linears:
            m.forward = forward_of(m)  # an instance attribute: shadows nn.Linear.forward until the end
        yield
    finally:
        for m in linears:
            m.__dict__.pop("forward", None)
