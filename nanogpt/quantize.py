"""Weight-only int8 for the linear layers: --quantize=int8 in sample.py, chat.py, serve.py and trace.py.

Each linear layer's weight becomes int8 rows, each row times one scale: w[i, j] ~ scale[i] * q[i, j], with
scale[i] = max_j |w[i, j]| / 127 (rounded to a number float16 and bfloat16 both hold exactly) and
q = round(w / scale) in [-127, 127]. A decode step then reads a byte per weight instead of four. The
layers' own forward (the prompt, and decoding where nothing faster applies) runs on PyTorch's int8 kernel
(torch.ops.aten._weight_int8pack_mm: the input rounded to bfloat16, the int8 weight converted as it is read, the
sum in float32, the output rounded to bfloat16); torchao 0.18's Int8WeightOnlyConfig instead converts the whole
weight to the input's dtype at every call, three times slower than float32 for one row (runs/int8_kernels.py). On
CPUs with AVX-512 or AVX2, decoding runs decode.c's int8 product on the same rows where it measures faster
(nanogpt/cpu/native.py: the input rounded to 16-bit integers on its row's scale, integer products summed
exactly). Biases, norms, embeddings and attention stay as they were.

The same numbers go into a GGUF file as llama.cpp's Q8_0 (export.py --quantize=int8): Q8_0 holds blocks of
32 int8 values with a float16 scale each, and every block of a row gets that row's scale, so llama.cpp
reads exactly these weights. The output layer is quantized even when it shares the embedding's weight
(tie_weights): the embedding lookup keeps the float table, as a Q8_0 file then keeps token_embd in float32
beside its own output.weight.

Quality, measured on the course's models (docs/generation.md): val bpb and greedy agreement with float32.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

from nanogpt.errors import UserError

QUANTIZE = ("int8",)  # the values --quantize takes (none: the weights as trained)
# _weight_int8pack_mm reads its rows in blocks of 16 values: with another width it crashes the process (torch 2.13,
# a segmentation fault), so a layer of another input width holds its rows padded with zeros, and its input too
INT8_ROW_MULTIPLE = 16


def check_quantize(value):
    """value, or ValueError for anything but "" (the weights as trained) and QUANTIZE."""
    if value not in ("", *QUANTIZE):
        raise ValueError(f"quantize must be int8 (weight-only int8 linear layers) or empty, got {value!r}")
    return value


def int8_available():
    """True where PyTorch has its int8 weight-only product (CPU, CUDA and MPS builds since 2.4)."""
    return hasattr(torch.ops.aten, "_weight_int8pack_mm")


def shared_scale(x):
    """x (float32) rounded to the nearest number both float16 and bfloat16 hold exactly: a row scale that
    _weight_int8pack_mm (bfloat16 scales) and Q8_0 (float16 scales) both read as it is."""
    s = x.to(torch.bfloat16).to(torch.float16).float()  # float16's subnormals keep fewer bits than bfloat16
    return s.to(torch.bfloat16).float()


def int8_rows(weight):
    """(q, scale) of a float weight (out, in): q int8 (out, in) and scale float32 (out,) with
    weight[i] ~ scale[i] * q[i], each within scale[i] / 2 (none clipped); a row of zeros has scale 1 and q 0."""
    w = weight.detach().float()
    if not torch.isfinite(w).all():
        raise ValueError("a weight is not finite and cannot be quantized")
    amax = w.abs().amax(dim=1)
    scale = shared_scale(amax / 127)
    # rounded down: one step up (a bfloat16 step, or float16's smallest), so that no value is clipped
    step = torch.clamp(scale * 2.0 ** -7, min=2.0 ** -24)
    scale = torch.where(scale < amax / 127, shared_scale(scale + step), scale)
    scale = torch.where(amax > 0, scale, 1.0)  # a row of zeros
    if not torch.isfinite(scale).all():
        raise ValueError("a weight is too large for a float16 scale (over 8e6) and cannot be quantized")
    q = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)
    return q, scale


class Int8Linear(nn.Module):
    """nn.Linear's forward on int8 rows and a scale each (int8_rows): y = (x q^T) * scale + bias, the product
    in bfloat16 with float32 sums; the output in the input's dtype."""

    def __init__(self, linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        q, scale = int8_rows(linear.weight)
        self.pad = -linear.in_features % INT8_ROW_MULTIPLE  # zeros after each row: they add nothing to a product
        self.register_buffer("qweight", F.pad(q, (0, self.pad)))
        self.register_buffer("scale", scale.to(torch.bfloat16))  # exact: shared_scale
        self.bias = linear.bias  # the same Parameter (float)

    def forward(self, x):
        rows = F.pad(x.reshape(-1, self.in_features).to(torch.bfloat16), (0, self.pad))
        y = torch.ops.aten._weight_int8pack_mm(rows, self.qweight, self.scale).to(x.dtype)
        if self.bias is not None:
            y = y + self.bias.to(x.dtype)
        return y.view(*x.shape[:-1], self.out_features)

    def dequantized(self):
        """The weight these int8 rows stand for, float32 (out, in): the reference the tests hold them to."""
        return self.qweight[:, :self.in_features].float() * self.scale.float()[:, None]

    def extra_repr(self):
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 rows"


def quantize(model, kind):
    """model with every nn.Linear replaced, in place, by its int8 form (kind "int8"; "" or None: unchanged); returns
    model. The float weights of replaced layers are dropped (a tied output layer's table stays: the embedding reads
    it)."""
    if not kind:
        return model
    if not int8_available():
        raise UserError("this PyTorch has no int8 weight-only product (torch.ops.aten._weight_int8pack_mm): "
                           "upgrade to torch 2.4 or later, or drop --quantize")
    for parent_name, parent in list(model.named_modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear:
                try:
                    setattr(parent, name, Int8Linear(child))
                except ValueError as e:
                    raise UserError(f"cannot quantize {parent_name}.{name}: {e}") from None
    return model
