"""The cached decode step for CPUs, fused: GPT.forward's math for one new token per row, in fewer operations.

A cached decode step is a matrix-vector product per weight plus ~200 small
operations around them. On CPU the products run on the kernel cpu.decoding
measured faster at close to the memory bandwidth, so the small operations and
the Python around them are what is left to remove: module calls, hook points,
dropout no-ops, the views of the general path. This step is the forward of
model.py for one position, written flat over the model's own parameters. Each
linear layer is a Product: packed float32 weights with the bias, the GELU or
ReLU and the residual addition fused into oneDNN's products, the plain float32
weights through PyTorch's matmul, packed bfloat16 weights (under bfloat16
autocast), or int8 rows (quantize.py). In float32 it is the same math summed
in another order (tests/test_fused_step.py holds it to the model's cached and
uncached paths for every GPTConfig option, with both float32 kernels).

FusedStep.build returns None wherever it does not apply, and callers then run
the model itself: a model not float32 on a CPU with oneDNN, weights not packed
where the kernel needs them, hooks on any module (trace.py observes the model
through them), the manual attention path asked for, or a GPTConfig field this
step does not know.
"""
import operator

import torch
import torch.nn.functional as F
from torch.nn.modules import module as nn_module

from model import apply_rope, value_embedded
import nanogpt.cpu.native as native
from nanogpt.cpu.kernels import WeightVersions, packed_product, packed_product_add
from nanogpt.quantize import Int8Linear

# every GPTConfig field and what this step supports of it (None: any value); a field added to
# GPTConfig and not here turns the step off until it is written here (tests/test_fused_step.py checks)
SUPPORTED = {
    "block_size": None, "vocab_size": None, "n_layer": None, "n_head": None, "n_embd": None,
    "dropout": None,  # generation runs in eval mode: dropout is the identity
    "bias": None, "attn_impl": ("sdpa",), "pos_emb": None, "rope_base": None, "norm": None, "norm_eps": None,
    "activation": None, "mlp_hidden": None, "n_kv_head": None, "tie_weights": None, "qk_norm": None,
    "logit_softcap": None, "zero_init_proj": None, "value_embeds": None,
}
# oneDNN post-ops applied inside the up-projection: (name, scalars, algorithm)
FUSED_ACTIVATION = {"gelu": ("gelu", [], "none"), "gelu_tanh": ("gelu", [], "tanh"), "relu": ("relu", [], ""),
                    "relu2": ("relu", [], ""), None: ("none", [], "")}
# the activations decode.c applies inside its product (relu2 squared after it, as oneDNN's)
NATIVE_ACTIVATION = {"gelu": "gelu", "gelu_tanh": "gelu_tanh", "relu": "relu", "relu2": "relu", None: None}
NATIVE_BLOCK_ACTIVATIONS = ("gelu", "gelu_tanh", "relu", "relu2")  # decode.c's model_step (no swiglu)
# the same activations after a product that cannot fuse them (bfloat16 or int8 products)
ACTIVATION = {"gelu": F.gelu, "gelu_tanh": lambda h: F.gelu(h, approximate="tanh"), "relu": F.relu, "relu2": F.relu,
              None: lambda h: h}


class Product:
    """One linear layer's product in a fused step: product(x, act) is act(x W^T + b) and add(x, residual) is
    residual + x W^T + b, for x and the result float32 (B, in) and (B, out). kernel says how W is read:
    - "packed": float32 packed for oneDNN, bias, activation and addition inside its product;
    - "plain": the layer's own float32 weight, through PyTorch's default matmul (MKL's on x86);
    - "native": decode.c's product (native.py) on the layer's own float32 weight, its bfloat16 copy or its
      int8 rows, the sums in float32 and bias, activation and addition inside it;
    - "bfloat16": packed in bfloat16 for oneDNN, the input rounded to bfloat16 and the output back to float32;
    - "int8": int8 rows (quantize.py) through PyTorch's int8 product, the input rounded to bfloat16 and the
      output back to float32.
    copies: {layer: its weight as the kernel reads it} for "packed", "bfloat16" and a bfloat16 "native"."""
    __slots__ = ("kind", "weight", "bias", "pad", "scale", "width", "sources")

    def __init__(self, module, copies, kernel):
        self.bias, self.pad, self.scale, self.width = module.bias, 0, None, module.in_features
        # the module's own tensors this product reads (or copied): `.data =` moves theirs, not a detached view's
        self.sources = (module.qweight, module.scale) if isinstance(module, Int8Linear) else (module.weight,)
        if isinstance(module, Int8Linear):
            self.kind, self.pad = kernel, module.pad
            self.weight = module.qweight if kernel == "native" else (module.qweight, module.scale)
            self.scale = module.scale.float() if kernel == "native" else None
        else:
            self.kind = kernel
            self.weight = module.weight if kernel == "plain" or kernel == "native" and module not in copies \
                else copies[module]
        if self.kind == "native":
            self.weight = native.Weight(self.weight.detach(), self.scale, self.bias, self.width)

    def __call__(self, x, act=None):
        kind = self.kind
        if kind == "native":
            return self.weight(x, NATIVE_ACTIVATION[act])
        if kind == "packed":
            return packed_product(x, self.weight, self.bias, FUSED_ACTIVATION[act])
        if kind == "plain":
            y = F.linear(x, self.weight, self.bias)
        else:
            y = self.low(x).float()
            if self.bias is not None:
                y = y.add_(self.bias)
        return y if act is None else ACTIVATION[act](y)

    def low(self, x):
        """x W^T in bfloat16, without the bias: the int8 or bfloat16 product of x rounded to bfloat16."""
        if self.kind == "int8":
            x = x.to(torch.bfloat16)
            return torch.ops.aten._weight_int8pack_mm(F.pad(x, (0, self.pad)) if self.pad else x, *self.weight)
        return packed_product(x.to(torch.bfloat16), self.weight)

    def add(self, x, residual):
        if self.kind == "native":
            return self.weight(x, None, residual)
        if self.kind == "packed":
            return packed_product_add(x, self.weight, self.bias, residual)
        if self.bias is None and self.kind == "plain":
            return torch.addmm(residual, x, self.weight.t())
        if self.bias is None:
            return torch.add(residual, self.low(x))  # float32 + bfloat16: one operation, a float32 sum
        return residual + self(x)


def supported(config):
    """True when every field of config is one this step computes, with a value it computes."""
    fields = vars(config)
    return set(fields) <= set(SUPPORTED) and all(
        allowed is None or fields[name] in allowed for name, allowed in SUPPORTED.items() if name in fields)


def global_hooks():
    """True when a global forward hook (torch.nn.modules.module.register_module_forward_hook) is set."""
    return bool(nn_module._global_forward_hooks or nn_module._global_forward_pre_hooks
                or nn_module._global_forward_hooks_always_called)


class FusedStep:
    """One cached step of a model for its packed weights: step(tokens, cache) as model(tokens[:, None],
    kv_cache=cache)[0]."""

    @classmethod
    def build(cls, model, copies, dtype=torch.float32, kernel=None, int8_kernel="int8"):
        """The fused step for model (eval mode), or None where the model's own forward must run (see the module's
        docstring). dtype: float32, or bfloat16 under bfloat16 autocast. kernel: how the linear layers' weights are
        read (Product): "packed" (float32's default) or "bfloat16" (bfloat16's) on copies ({linear: its weight
        packed for oneDNN}, kernels.packed_inference's), "plain" (float32), or "native" on the layers' own
        float32 weights or copies in bfloat16. int8_kernel: "int8" or "native", for int8 layers (quantize.py),
        which need no copy."""
        kernel = kernel or ("bfloat16" if dtype == torch.bfloat16 else "packed")
        linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
        weight = model.transformer.wte.weight
        copied = kernel in ("packed", "bfloat16") or kernel == "native" and dtype == torch.bfloat16
        if (weight.device.type != "cpu" or weight.dtype != torch.float32 or not supported(model.config)
                or kernel not in (("packed", "plain", "native") if dtype == torch.float32 else ("bfloat16", "native"))
                or copied and not all(m in copies for m in linears)
                or "native" in (kernel, int8_kernel) and not native.available()):
            return None
        step = cls(model, copies if copied else {}, dtype, kernel, int8_kernel)
        return step if step.valid() else None

    def __init__(self, model, copies, dtype, kernel, int8_kernel):
        self.model, self.config, self.dtype = model, model.config, dtype
        self.modules = list(model.modules())
        t, c = model.transformer, self.config
        norm = (lambda n: (n.weight,)) if c.norm == "rmsnorm" else (lambda n: (n.weight, n.bias))
        weights = lambda m: Product(m, copies, int8_kernel if isinstance(m, Int8Linear) else kernel)  # noqa: E731
        # each block's tensors in the order __call__ reads them, gathered once: module attribute lookups
        # cost more than this step's small operations
        self.blocks = [(norm(b.ln_1), weights(b.attn.c_attn), weights(b.attn.c_proj), norm(b.ln_2),
                        weights(b.mlp.c_fc), weights(b.mlp.c_proj), self.value_embedding(model, i))
                       for i, b in enumerate(t.h)]
        self.wte, self.wpe = t.wte.weight, t.wpe.weight if c.pos_emb == "learned" else None
        self.ln_f, self.head = norm(t.ln_f), weights(model.lm_head)
        # every parameter and buffer as read: one replaced since sends the step back (the others are read live),
        # as (the modules' dicts, the names, the tensors): checked with C loops (map), not Python's
        held = [(d, name, p) for m in self.modules for d in (m._parameters, m._buffers) for name, p in d.items()
                if p is not None]  # buffers too: an int8 layer's rows, RoPE's table (crop_block_size replaces it)
        self.params = tuple(zip(*held)) or ((), (), ())
        # the weights behind the copies: one changed in place or given new data since does too
        self.copied_from = WeightVersions([m.weight for m in copies] + [
            m.scale for m in self.modules if isinstance(m, Int8Linear) and int8_kernel == "native"])  # Product's copy
        # decode.c's whole blocks, where every product is native and the block has nothing it leaves out
        self.layers = None
        products = [p for b in self.blocks for p in (b[1], b[2], b[4], b[5])]
        if (all(p.kind == "native" for p in products) and c.activation in NATIVE_BLOCK_ACTIVATIONS
                and all(b[6] is None for b in self.blocks)):
            self.layers = [native.layer_of(c, b[0], b[1].weight, b[2].weight, b[3], b[4].weight, b[5].weight)
                           for b in self.blocks]
            self.rope = torch.view_as_real(model.rope) if self.wpe is None else None  # (block, hs/2, 2): cos, sin
            self.native_model = native.model_of(c, self.wte, self.wpe, self.rope, self.ln_f, self.layers,
                                                self.head.weight)
        # the model's tensors the native code reads by address (or copied): one given new data (.data =) since
        # sends the step back, as reading its old memory would give the old model's numbers
        self.addressed = tuple(t for t in [self.wte, self.wpe, *self.ln_f, getattr(model, "rope", None),
                                           *(t for b in self.blocks for t in (*b[0], *b[3])), *(
            x for p in products + [self.head] if p.kind == "native" for x in (*p.sources, p.bias))]
            if t is not None)
        self.addresses = tuple(map(torch.Tensor.data_ptr, self.addressed))
        self.attns = [block.attn for block in t.h]  # a tool may switch one to the manual path
        # every module's hook dicts (a hook registered later lands in them)
        self.hook_dicts = [d for m in self.modules for d in (m._forward_hooks, m._forward_pre_hooks)]

    @staticmethod
    def value_embedding(model, layer):
        """(its table's weight, its ve_mix) for a layer with value embeddings, else None."""
        table = value_embedded(model.config, layer)
        return None if table is None else (model.transformer.ve[table].weight, model.transformer.h[layer].attn.ve_mix)

    def valid(self):
        """Still the model it was built for: weights unchanged and not replaced, no hook added since, eval
        mode, and the autocast it was built for (none, or bfloat16's). Run before every step: kept to a few
        microseconds, each check a loop over what __init__ gathered."""
        if self.model.training or torch.is_autocast_enabled("cpu") != (self.dtype == torch.bfloat16):
            return False
        if self.dtype == torch.bfloat16 and torch.get_autocast_dtype("cpu") != torch.bfloat16:
            return False
        return (all(attn.impl == "sdpa" for attn in self.attns)
                and all(map(operator.is_, map(dict.get, *self.params[:2]), self.params[2]))
                and self.copied_from.holds()
                and tuple(map(torch.Tensor.data_ptr, self.addressed)) == self.addresses
                and not any(self.hook_dicts) and not global_hooks())

    def norm(self, x, params):
        c = self.config
        if c.norm == "rmsnorm":
            return F.rms_norm(x, (c.n_embd,), *params, c.norm_eps)
        return F.layer_norm(x, (c.n_embd,), *params, c.norm_eps)

    def activation(self, x, c_fc):
        """The MLP's hidden activation (B, hidden) of its input x (B, C): c_fc with the activation fused."""
        act = self.config.activation
        if act == "swiglu":
            gate, up = c_fc(x).chunk(2, dim=-1)  # gate rows first, as MLP.forward reads them
            return F.silu(gate) * up
        h = c_fc(x, act)
        return h.square() if act == "relu2" else h

    @torch.inference_mode()
    def __call__(self, tokens, cache):
        """Logits (B, 1, V) for tokens (B,), one new position per row where the cache places it (a KVCache's
        next position, or a engine.SlotCache's rows each at its own, with its mask); stores their keys and
        values in cache and advances it, as GPT.forward does with a kv_cache. Under bfloat16 autocast only the
        products are bfloat16's (Product): autocast is off for the rest, which stays float32."""
        if self.dtype == torch.bfloat16:
            with torch.autocast("cpu", enabled=False):
                return self.step(tokens, cache)
        return self.step(tokens, cache)

    def step(self, tokens, cache):
        c = self.config
        if self.native_applies(cache):
            return self.native_step(tokens, cache)
        pos, mask = cache.positions(1), cache.mask(1)  # (1,) or (B, 1); None or (B, 1, 1, L)
        x = F.embedding(tokens, self.wte)  # (B, C)
        rope = None
        if self.wpe is not None:
            x = x + F.embedding(pos, self.wpe).view(-1, c.n_embd)  # (1, C) or (B, C)
        else:
            rope = self.model.rope[pos].unsqueeze(-3)  # (1, 1, hs/2) or (B, 1, 1, hs/2)

        def attend(i, q, k, v):
            keys, values = cache.update(i, k, v)  # (B, nkv, L, hs)
            return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=c.kv_heads != c.n_head)
        logits = self.blocks_and_head(tokens, x, rope, attend)
        cache.advance(1)
        return logits.view(tokens.size(0), 1, -1)

    @torch.inference_mode()
    def run(self, tokens, cache, n, temperature=0.0, draws=None):
        """(tokens (s, B), logits (B, V) or None): up to n steps from tokens (B,) in one call to decode.c
        (native.model_run), each row's token the one sample_next takes: at temperature 0 the argmax, else with its
        draw (draws (n, B)) and no top-k, top-p or penalty; the cache advanced by the steps run. Where s < n, step
        s ran too and its logits, capped as the model caps them, are returned: its choice could go either way
        between decode.c's rounding and PyTorch's, and is sample_next's. None where the step is not decode.c's."""
        if not self.native_applies(cache):
            return None
        rows = self.decode_rows(tokens, cache)
        if int(rows[0].max()) + n > self.layers[0].block:
            raise ValueError(f"{n} steps from position {int(rows[0].max())} pass the block ({self.layers[0].block})")
        out, logits = native.model_run(self.native_model[0], tokens, rows, cache.k, cache.v, n, temperature, draws,
                                       self.config.logit_softcap)
        if out.size(0) == n:
            cache.advance(n)
            return out, None
        cache.advance(out.size(0) + 1)
        return out, self.model.softcap(logits)

    def native_applies(self, cache):
        """decode.c runs the step: every block's products are its own, and the cache says where each row goes."""
        return self.layers is not None and hasattr(cache, "decode_rows") and cache.k.dtype == torch.float32

    def decode_rows(self, tokens, cache):
        """int32 (2, B): each row's position and slot, checked against the cache's shape and the tokens'."""
        rows = torch.tensor(cache.decode_rows(), dtype=torch.int32)
        k, v, layer = cache.k, cache.v, self.layers[0]
        if (tokens.dim() != 1 or tokens.size(0) != rows.size(1) or k.shape != v.shape or not k.is_contiguous()
                or not v.is_contiguous() or k.shape[0] != len(self.layers)
                or k.shape[2:] != (layer.nkv, layer.block, layer.hs)):
            raise ValueError(f"a cache of shape {tuple(k.shape)} for {tokens.size(0)} token(s) does not fit a step "
                             f"of {len(self.layers)} layers, {layer.nkv} kv heads, block {layer.block}")
        return rows

    def native_step(self, tokens, cache):
        """step() in decode.c, one call, for a cache that says where each row's token goes (decode_rows:
        generate.KVCache, engine.SlotCache)."""
        logits = native.model_step(self.native_model[0], tokens, self.decode_rows(tokens, cache), cache.k, cache.v)
        cache.advance(1)
        return self.model.softcap(logits).view(tokens.size(0), 1, -1)

    def blocks_and_head(self, tokens, x, rope, attend):
        """Logits (B, V) of one new position per row from its embedding x (B, C); rope: the rows' rotations
        (or None); attend(layer, q, k, v): stores k, v (B, nkv, 1, hs) and returns attention's output."""
        c = self.config
        B, nh, nkv, hs = x.size(0), c.n_head, c.kv_heads, c.head_dim
        for i, (ln_1, c_attn, c_proj, ln_2, c_fc, mlp_proj, ve) in enumerate(self.blocks):
            qkv = c_attn(self.norm(x, ln_1))  # (B, (nh + 2 nkv) hs): q, then k, then v
            q = qkv[:, :nh * hs].view(B, nh, 1, hs)
            k = qkv[:, nh * hs:(nh + nkv) * hs].view(B, nkv, 1, hs)
            v = qkv[:, (nh + nkv) * hs:]
            if ve is not None:
                table, mix = ve
                v = mix[0] * v + mix[1] * F.embedding(tokens, table)
            v = v.view(B, nkv, 1, hs)
            if c.qk_norm:
                q, k = F.rms_norm(q, (hs,), eps=c.norm_eps), F.rms_norm(k, (hs,), eps=c.norm_eps)
            if rope is not None:
                q, k = apply_rope(q, rope), apply_rope(k, rope)
            y = attend(i, q, k, v)  # (B, nh, 1, hs)
            x = c_proj.add(y.reshape(B, c.n_embd), x)  # heads concatenated, projected, added
            x = mlp_proj.add(self.activation(self.norm(x, ln_2), c_fc), x)
        return self.model.softcap(self.head(self.norm(x, self.ln_f)))
