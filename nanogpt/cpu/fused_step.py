"""The cached decode step for CPUs, fused: GPT.forward's math for one new token per row, in fewer operations.

A cached decode step is a matrix-vector product per weight plus ~200 small
operations around them. On CPU the products run on packed weights
(cpu.decoding) at close to the memory bandwidth, so the small
operations and the Python around them are what is left to remove: module
calls, hook points, dropout no-ops, the views of the general path. This step
is the forward of model.py for one position, written flat over the model's own
parameters, with the bias, the GELU or ReLU and the residual addition fused
into oneDNN's products. It is the same float32 math summed in another order
(tests/test_fused_step.py holds it to the model's cached and uncached paths for
every GPTConfig option).

FusedStep.build returns None wherever it does not apply, and callers then run
the model itself: not float32 on a CPU with oneDNN, weights not packed, hooks on
any module (trace.py observes the model through them), the manual attention
path asked for, or a GPTConfig field this step does not know.
"""
import torch
import torch.nn.functional as F
from torch.nn.modules import module as nn_module

from model import apply_rope, value_embedded
from nanogpt.cpu.kernels import WeightVersion, packed_product, packed_product_add

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
                    "relu2": ("relu", [], "")}


def supported(config):
    """True when every field of config is one this step computes, with a value it computes."""
    fields = vars(config)
    return set(fields) <= set(SUPPORTED) and all(
        allowed is None or fields[name] in allowed for name, allowed in SUPPORTED.items() if name in fields)


def hooked(modules):
    """True when a forward hook could observe or change any module's forward (global hooks included)."""
    if (nn_module._global_forward_hooks or nn_module._global_forward_pre_hooks
            or nn_module._global_forward_hooks_always_called):
        return True
    return any(m._forward_hooks or m._forward_pre_hooks for m in modules)


class FusedStep:
    """One cached step of a model for its packed weights: step(tokens, cache) as model(tokens[:, None],
    kv_cache=cache)[0]."""

    @classmethod
    def build(cls, model, packed):
        """The fused step for model (eval mode) and packed ({linear: packed weight}, from kernels.packed_inference),
        or None where the model's own forward must run (see the module's docstring)."""
        linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
        weight = model.lm_head.weight
        if (weight.device.type != "cpu" or weight.dtype != torch.float32 or not supported(model.config)
                or not all(m in packed for m in linears)):
            return None
        step = cls(model, packed)
        return step if step.valid() else None

    def __init__(self, model, packed):
        self.model, self.config = model, model.config
        self.modules = list(model.modules())
        t, c = model.transformer, self.config
        norm = (lambda n: (n.weight,)) if c.norm == "rmsnorm" else (lambda n: (n.weight, n.bias))
        weights = lambda m: (packed[m], m.bias)  # noqa: E731: (packed weight, bias), as packed_product takes them
        # each block's tensors in the order __call__ reads them, gathered once: module attribute lookups
        # cost more than this step's small operations
        self.blocks = [(norm(b.ln_1), weights(b.attn.c_attn), weights(b.attn.c_proj), norm(b.ln_2),
                        weights(b.mlp.c_fc), weights(b.mlp.c_proj), self.value_embedding(model, i))
                       for i, b in enumerate(t.h)]
        self.wte, self.wpe = t.wte.weight, t.wpe.weight if c.pos_emb == "learned" else None
        self.ln_f, self.head = norm(t.ln_f), weights(model.lm_head)
        # every parameter as read: one replaced since sends the step back (the others are read live)
        self.params = [(m._parameters, name, p) for m in self.modules for name, p in m._parameters.items()
                       if p is not None]
        # the weights behind the packed copies: one changed in place or given new data since does too
        self.packed_from = [WeightVersion(m.weight) for m in packed]
        self.attns = [block.attn for block in t.h]  # a tool may switch one to the manual path

    @staticmethod
    def value_embedding(model, layer):
        """(its table's weight, its ve_mix) for a layer with value embeddings, else None."""
        table = value_embedded(model.config, layer)
        return None if table is None else (model.transformer.ve[table].weight, model.transformer.h[layer].attn.ve_mix)

    def valid(self):
        """Still the model it was built for: weights unchanged and not replaced, no hook added since, eval
        mode, and no autocast (the model's forward would compute in another dtype)."""
        return (not self.model.training and not torch.is_autocast_enabled("cpu")
                and all(attn.impl == "sdpa" for attn in self.attns)
                and all(params.get(name) is p for params, name, p in self.params)
                and all(version.holds(version.tensor) for version in self.packed_from)
                and not hooked(self.modules))

    def norm(self, x, params):
        c = self.config
        if c.norm == "rmsnorm":
            return F.rms_norm(x, (c.n_embd,), *params, c.norm_eps)
        return F.layer_norm(x, (c.n_embd,), *params, c.norm_eps)

    def activation(self, x, c_fc):
        """The MLP's hidden activation (B, hidden) of its input x (B, C): c_fc with the activation fused."""
        act = self.config.activation
        if act == "swiglu":
            gate, up = packed_product(x, *c_fc).chunk(2, dim=-1)  # gate rows first, as MLP.forward reads them
            return F.silu(gate) * up
        h = packed_product(x, *c_fc, FUSED_ACTIVATION[act])
        return h.square() if act == "relu2" else h

    @torch.inference_mode()
    def __call__(self, tokens, cache):
        """Logits (B, 1, V) for tokens (B,), one new position per row where the cache places it (a KVCache's
        next position, or a engine.SlotCache's rows each at its own, with its mask); stores their keys and
        values in cache and advances it, as GPT.forward does with a kv_cache."""
        c = self.config
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

    def blocks_and_head(self, tokens, x, rope, attend):
        """Logits (B, V) of one new position per row from its embedding x (B, C); rope: the rows' rotations
        (or None); attend(layer, q, k, v): stores k, v (B, nkv, 1, hs) and returns attention's output."""
        c = self.config
        B, nh, nkv, hs = x.size(0), c.n_head, c.kv_heads, c.head_dim
        for i, (ln_1, c_attn, c_proj, ln_2, c_fc, mlp_proj, ve) in enumerate(self.blocks):
            qkv = packed_product(self.norm(x, ln_1), *c_attn)  # (B, (nh + 2 nkv) hs): q, then k, then v
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
            x = packed_product_add(y.reshape(B, c.n_embd), *c_proj, x)  # heads concatenated, projected, added
            x = packed_product_add(self.activation(self.norm(x, ln_2), c_fc), *mlp_proj, x)
        return self.model.softcap(packed_product(self.norm(x, self.ln_f), *self.head))
