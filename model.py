"""A GPT language model in one file.

GPT-2 by default (learned positions, LayerNorm, GELU, tied head), with the
options of current small LLMs (RoPE, RMSNorm, ReLU/ReLU^2/SwiGLU, GQA/MQA,
untied head) behind GPTConfig fields whose defaults keep GPT-2's meaning.
Module names follow GPT-2 (wte, wpe, h, ln_1, attn.c_attn, ...) so GPT-2 and
nanoGPT checkpoints load key for key.
"""
import math
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields, replace

import torch
import torch.nn as nn
from torch.nn import functional as F

# model_args keys that nanoGPT's GPTConfig accepts; other fields are written to
# a checkpoint only when they differ from the default, so GPT-2-style
# checkpoints stay loadable by nanoGPT's sample.py.
NANOGPT_MODEL_ARGS = ("n_layer", "n_head", "n_embd", "block_size", "bias", "vocab_size", "dropout")
# Hugging Face GPT-2 keeps these weights as Conv1D, transposed relative to nn.Linear
HF_CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
# Fields that choose how to compute, not what: never part of a checkpoint.
RUNTIME_FIELDS = ("attn_impl",)
CHOICES = {
    "attn_impl": ("sdpa", "manual"),
    "pos_emb": ("learned", "rope"),
    "norm": ("layernorm", "rmsnorm"),
    "activation": ("gelu", "gelu_tanh", "relu", "relu2", "swiglu"),
}


@dataclass
class GPTConfig:
    block_size: int = 1024  # context length: the most positions the model sees at once
    vocab_size: int = 50304  # GPT-2's 50257 padded up to a multiple of 64 for speed
    n_layer: int = 12  # transformer blocks
    n_head: int = 12  # attention heads per block; each reads n_embd / n_head channels
    n_embd: int = 768  # width of the residual stream
    dropout: float = 0.0  # probability of zeroing an activation in training (0 for pretraining)
    bias: bool = True  # biases in Linears and LayerNorms, as GPT-2
    attn_impl: str = "sdpa"  # "sdpa" (fused kernels) or "manual" (explicit mask)
    pos_emb: str = "learned"  # "learned" (wpe) or "rope"
    rope_base: float = 10000.0  # RoPE: pair i rotates by pos * rope_base^(-2i/head_dim)
    norm: str = "layernorm"  # or "rmsnorm"
    norm_eps: float = 1e-5  # added to the variance before the square root
    activation: str = "gelu"  # or "gelu_tanh" (OpenAI's GPT-2 weights), "relu", "relu2", "swiglu"
    mlp_hidden: int | None = None  # None: 4*n_embd (swiglu: 8/3*n_embd up to a multiple of 64)
    n_kv_head: int | None = None  # None: n_head; fewer gives GQA, 1 gives MQA
    tie_weights: bool = True  # lm_head shares wte's weight

    def __post_init__(self):
        for name, allowed in CHOICES.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {', '.join(allowed)}, got {getattr(self, name)!r}")
        for name in ("block_size", "vocab_size", "n_layer", "n_head", "n_embd"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")
        if self.pos_emb == "rope" and self.head_dim % 2:
            raise ValueError(f"rope needs an even head_dim, got n_embd/n_head = {self.head_dim}")
        if self.n_kv_head is not None and (self.n_kv_head < 1 or self.n_head % self.n_kv_head):
            raise ValueError(f"n_head ({self.n_head}) must be a multiple of n_kv_head ({self.n_kv_head})")
        if self.mlp_hidden is not None and self.mlp_hidden < 1:
            raise ValueError(f"mlp_hidden must be at least 1, got {self.mlp_hidden}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        if not (self.norm_eps > 0 and self.rope_base > 0):
            raise ValueError(f"norm_eps ({self.norm_eps}) and rope_base ({self.rope_base}) must be > 0")

    @property
    def head_dim(self):
        return self.n_embd // self.n_head

    @property
    def kv_heads(self):
        return self.n_kv_head or self.n_head

    @property
    def hidden(self):
        if self.mlp_hidden is not None:
            return self.mlp_hidden
        if self.activation == "swiglu":  # same parameter count as a 4x GELU MLP
            return -(-8 * self.n_embd // (3 * 64)) * 64
        return 4 * self.n_embd

    def model_args(self):
        """The checkpoint's model_args: nanoGPT's keys, plus options that differ from GPT-2."""
        default = GPTConfig()
        return {k: v for k, v in asdict(self).items()
                if k not in RUNTIME_FIELDS and (k in NANOGPT_MODEL_ARGS or v != getattr(default, k))}

    @classmethod
    def from_model_args(cls, model_args, **runtime):
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(model_args) - known)
        if unknown:
            raise ValueError(f"checkpoint model_args has unknown keys {unknown}; was it written by a newer version?")
        return cls(**{**model_args, **runtime})


class LayerNorm(nn.Module):
    """LayerNorm with an optional bias (PyTorch's has no bias=False before 2.1)."""

    def __init__(self, ndim, bias, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None
        self.eps = eps

    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, self.eps)


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * weight: no centring, no bias."""

    def __init__(self, ndim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.eps = eps

    def forward(self, x):
        return F.rms_norm(x, self.weight.shape, self.weight, self.eps)


# bytes of linear weights GPT.stream copies into packed form; beyond this (gpt2-large
# holds 3.1 GB, gpt2-xl 6.2 GB) a second copy could exhaust a laptop's memory
PACKED_COPY_LIMIT = 2 << 30


class Linear(nn.Linear):
    """nn.Linear with a CPU fast path for generation.

    On CPU, PyTorch's float32 matmul reads a weight matrix far below memory
    bandwidth when the input has few rows, as in decoding one token per step.
    GPT.stream gives each Linear a copy of its weight laid out for oneDNN
    (pack, through packed_weights), used under inference mode for as long as the weight is unchanged:
    the same float32 numbers, 2-2.5x faster here (README, "Generation: KV cache").
    """

    packed = None  # (weight, its version, oneDNN copy) while GPT.stream runs

    def pack(self, rows):
        """Lay the weight out for inputs of about `rows` rows; False where it cannot be."""
        if self.weight.dtype != torch.float32 or self.weight.device.type != "cpu" or not onednn_available():
            return False
        with torch.no_grad():
            self.packed = (self.weight, self.weight._version, torch.ops.mkldnn._reorder_linear_weight(self.weight, rows))
        return True

    def forward(self, x):
        p = self.packed
        if (p is not None and not torch.compiler.is_compiling() and p[0] is self.weight
                and p[1] == self.weight._version and x.dtype == torch.float32 and torch.is_inference_mode_enabled()):
            return torch.ops.mkldnn._linear_pointwise(x.contiguous(), p[2], self.bias, "none", [], "")
        return F.linear(x, self.weight, self.bias)


@contextmanager
def packed_weights(model, rows):
    """Within: model's Linear layers run on packed copies of their weights (Linear.pack), freed at the end.

    Nothing is packed beyond PACKED_COPY_LIMIT bytes of weights, or where pack cannot.
    """
    linears = [m for m in model.modules() if isinstance(m, Linear)]
    if sum(m.weight.numel() * m.weight.element_size() for m in linears) > PACKED_COPY_LIMIT:
        linears = []
    try:
        for m in linears:
            m.pack(rows)
        yield
    finally:
        for m in linears:
            m.packed = None


def onednn_available():
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def make_dropout(config):
    """Dropout, or nothing at all when p is 0: a decode step makes a dozen of these calls."""
    return nn.Dropout(config.dropout) if config.dropout > 0 else nn.Identity()


def make_norm(config):
    if config.norm == "rmsnorm":
        return RMSNorm(config.n_embd, config.norm_eps)
    return LayerNorm(config.n_embd, config.bias, config.norm_eps)


def rope_tables(config, device=None):
    """exp(i * pos * base^(-2i/head_dim)) as complex numbers, (block_size, head_dim/2)."""
    inv_freq = config.rope_base ** (-torch.arange(0, config.head_dim, 2, dtype=torch.float64, device=device) / config.head_dim)
    angles = torch.outer(torch.arange(config.block_size, dtype=torch.float64, device=device), inv_freq)
    return torch.polar(torch.ones_like(angles), angles).to(torch.complex64)


def apply_rope(x, rope):
    """Rotate channel pairs (2i, 2i+1) of each head: x (B, nh, T, hs), rope (T, hs/2) complex.

    Pair (a, b) read as a + ib times e^(i angle) is (a cos - b sin) + i(a sin + b cos):
    one complex multiply instead of four real ones and a stack.
    """
    pairs = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))  # (B, nh, T, hs/2)
    return torch.view_as_real(pairs * rope).flatten(-2).type_as(x)


def window_start(n, start, block):
    """First position the cache holds when predicting token n: unchanged while the window
    fits in block, else the last half of it, recomputed once (llama.cpp's context shift)."""
    return start if n - start <= block else n - max(1, block // 2)


class KVCache:
    """Keys and values of every layer for the positions seen so far.

    Holds only the kv heads (GQA/MQA caches n_kv_head heads, not n_head).
    `pos` is the number of positions filled; GPT.forward advances it.
    """

    def __init__(self, config, batch_size, device, dtype):
        shape = (config.n_layer, batch_size, config.kv_heads, config.block_size, config.head_dim)
        # uninitialized: update() writes positions before anything reads them
        self.k = torch.empty(shape, device=device, dtype=dtype)
        self.v = torch.empty(shape, device=device, dtype=dtype)
        self.pos = 0

    def update(self, layer, k, v):
        """Store k, v (B, nkv, T, hs) at the next positions; return all positions so far."""
        end = self.pos + k.size(2)
        self.k[layer, :, :, self.pos:end] = k
        self.v[layer, :, :, self.pos:end] = v
        return self.k[layer, :, :, :end], self.v[layer, :, :, :end]  # (B, nkv, end, hs)


class CausalSelfAttention(nn.Module):

    def __init__(self, config, layer_idx=0):
        super().__init__()
        self.n_head, self.n_kv_head, self.head_dim = config.n_head, config.kv_heads, config.head_dim
        self.layer_idx = layer_idx
        # one fused projection; output rows are q (n_head*hs), then k, then v (n_kv_head*hs each)
        self.c_attn = Linear(config.n_embd, (self.n_head + 2 * self.n_kv_head) * self.head_dim, bias=config.bias)
        self.c_proj = Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.attn_dropout = make_dropout(config)
        self.resid_dropout = make_dropout(config)
        self.dropout = config.dropout
        self.impl = config.attn_impl

    def forward(self, x, rope=None, cache=None):
        B, T, C = x.size()
        q_dim, kv_dim = self.n_head * self.head_dim, self.n_kv_head * self.head_dim
        q, k, v = self.c_attn(x).split([q_dim, kv_dim, kv_dim], dim=2)
        # heads are contiguous channel blocks: channel c belongs to head c // hs
        q = q.view(B, T, self.n_head, self.head_dim).transpose(1, 2)  # (B, nh, T, hs)
        k = k.view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2)  # (B, nkv, T, hs)
        v = v.view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2)  # (B, nkv, T, hs)
        if rope is not None:
            q, k = apply_rope(q, rope), apply_rope(k, rope)
        if cache is not None:
            k, v = cache.update(self.layer_idx, k, v)  # (B, nkv, L, hs), L = positions so far
        y = self.attend(q, k, v)  # (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # merge heads by concatenation
        return self.resid_dropout(self.c_proj(y))

    def attend(self, q, k, v):
        """Causal attention of T queries over L >= T keys; the queries are the last T positions."""
        T, L = q.size(2), k.size(2)
        dropout_p = self.dropout if self.training else 0.0
        if self.impl == "sdpa" and T == 1 and dropout_p == 0.0 and q.device.type == "cpu":
            return self.attend_one(q, k, v)
        if self.impl == "sdpa":
            # is_causal aligns its mask top-left, which is right only when T == L;
            # one query (a decode step) sees every key, so it needs no mask
            # (branches, not expressions: under torch.compile(dynamic=True) T == L is symbolic)
            mask, causal = None, False
            if T == L and T > 1:
                causal = True
            elif 1 < T:
                mask = causal_mask(T, L, q.device)
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p,
                                                  is_causal=causal, enable_gqa=self.n_kv_head != self.n_head)
        # the manual path, one named step per method (trace.py records each of them)
        k, v = self.expand_kv(k), self.expand_kv(v)  # (B, nh, L, hs)
        weights = self.attn_dropout(self.softmax(self.mask(self.scores(q, k))))  # (B, nh, T, L)
        return weights @ v  # (B, nh, T, hs)

    def attend_one(self, q, k, v):
        """One query per sequence (a decode step) sees every key: no mask, two batched matmuls.

        On CPU these read the cache faster than SDPA's kernel does for one query,
        and GQA groups the query heads of each kv head instead of copying k and v.
        """
        B, nh, _, hs = q.shape
        q = q.reshape(B, self.n_kv_head, nh // self.n_kv_head, hs)  # (B, nkv, group, hs): head h reads kv head h // group
        weights = F.softmax((q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs)), dim=-1)  # (B, nkv, group, L)
        return (weights @ v).view(B, nh, 1, hs)

    def expand_kv(self, t):
        """GQA/MQA: query head h reads kv head h // (n_head / n_kv_head)."""
        return t if self.n_kv_head == self.n_head else t.repeat_interleave(self.n_head // self.n_kv_head, dim=1)

    def scores(self, q, k):
        return (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.head_dim))  # (B, nh, T, L): q.k / sqrt(hs)

    def mask(self, scores):
        """-inf where a query would see a later position: applied before the softmax."""
        T, L = scores.shape[-2:]
        return scores.masked_fill(~causal_mask(T, L, scores.device), float("-inf"))

    def softmax(self, scores):
        return F.softmax(scores, dim=-1)  # each row sums to 1 over the keys it may see


def causal_mask(T, L, device):
    """(T, L) bool, True where query i (at position L-T+i) may see key j."""
    return torch.ones(T, L, dtype=torch.bool, device=device).tril(diagonal=L - T)


class MLP(nn.Module):

    def __init__(self, config):
        super().__init__()
        self.activation = config.activation
        hidden = config.hidden
        # swiglu: c_fc produces gate rows first, then up rows
        self.c_fc = Linear(config.n_embd, 2 * hidden if self.activation == "swiglu" else hidden, bias=config.bias)
        self.c_proj = Linear(hidden, config.n_embd, bias=config.bias)
        self.dropout = make_dropout(config)

    def forward(self, x):
        h = self.c_fc(x)
        if self.activation == "gelu":
            h = F.gelu(h)
        elif self.activation == "gelu_tanh":
            h = F.gelu(h, approximate="tanh")
        elif self.activation == "relu":
            h = F.relu(h)
        elif self.activation == "relu2":
            h = F.relu(h).square()
        else:
            gate, up = h.chunk(2, dim=-1)
            h = F.silu(gate) * up
        return self.dropout(self.c_proj(h))


class Block(nn.Module):

    def __init__(self, config, layer_idx=0):
        super().__init__()
        self.ln_1 = make_norm(config)
        self.attn = CausalSelfAttention(config, layer_idx)
        self.ln_2 = make_norm(config)
        self.mlp = MLP(config)

    def forward(self, x, rope=None, cache=None):
        x = x + self.attn(self.ln_1(x), rope, cache)
        x = x + self.mlp(self.ln_2(x))
        return x


class GPT(nn.Module):

    def __init__(self, config):
        super().__init__()
        self.config = config = replace(config)  # our own copy: crop_block_size changes it
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            drop=make_dropout(config),
            h=nn.ModuleList([Block(config, i) for i in range(config.n_layer)]),
            ln_f=make_norm(config),
        ))
        if config.pos_emb == "learned":
            self.transformer.wpe = nn.Embedding(config.block_size, config.n_embd)
        self.lm_head = Linear(config.n_embd, config.vocab_size, bias=False)
        if config.tie_weights:
            self.lm_head.weight = self.transformer.wte.weight
        if config.pos_emb == "rope":  # not persistent: recomputed, never in a checkpoint
            self.register_buffer("rope", rope_tables(config), persistent=False)
        self.apply(self._init_weights)
        # GPT-2: residual projections scaled by 1/sqrt(number of residual additions)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    def _init_weights(self, module):
        if isinstance(module, nn.Linear):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def get_num_params(self, non_embedding=True):
        """Parameters, each shared tensor once; position embeddings excluded by default."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding and "wpe" in self.transformer:
            n -= self.transformer.wpe.weight.numel()
        return n

    def forward(self, idx, targets=None, kv_cache=None, last_only=False):
        """Logits (B, T, V) where position t scores token t+1, and the mean loss if targets.

        kv_cache: continue from the positions it holds (and add these).
        last_only: compute logits for the last position only (generation).
        """
        B, T = idx.size()
        start = kv_cache.pos if kv_cache is not None else 0
        if start + T > self.config.block_size:
            raise ValueError(f"sequence of {start + T} tokens is longer than block_size ({self.config.block_size}); "
                             f"crop the input to its last {self.config.block_size} tokens")
        x = self.transformer.wte(idx)  # (B, T, C)
        rope = None
        if self.config.pos_emb == "learned":
            x = x + self.transformer.wpe(torch.arange(start, start + T, device=idx.device))
        else:
            rope = self.rope[start:start + T]
        x = self.transformer.drop(x)
        for block in self.transformer.h:
            x = block(x, rope, kv_cache)
        x = self.transformer.ln_f(x)
        if kv_cache is not None:
            kv_cache.pos += T
        if targets is not None:
            logits = self.lm_head(x)
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-1)
            return logits, loss
        return self.lm_head(x[:, [-1], :] if last_only else x), None

    def crop_block_size(self, block_size):
        """Shrink the context window, e.g. to fine-tune GPT-2 (1024) on shorter blocks."""
        if not 0 < block_size <= self.config.block_size:
            raise ValueError(f"block_size can only shrink: {block_size} > {self.config.block_size}")
        self.config.block_size = block_size
        if "wpe" in self.transformer:
            self.transformer.wpe.weight = nn.Parameter(self.transformer.wpe.weight[:block_size])
        else:
            self.rope = self.rope[:block_size]

    @classmethod
    def from_pretrained(cls, name_or_path, override_args=None):
        """GPT-2 weights: gpt2, gpt2-medium, gpt2-large, gpt2-xl, or a local Hugging Face GPT-2 directory.

        Needs the optional transformers package. override_args may set dropout and attn_impl.
        """
        override_args = override_args or {}
        if set(override_args) - {"dropout", "attn_impl"}:
            raise ValueError(f"only dropout and attn_impl can be overridden, got {sorted(override_args)}")
        try:
            from transformers import GPT2LMHeadModel
        except ImportError:
            raise ImportError("loading GPT-2 weights needs transformers: pip install transformers") from None
        hf = GPT2LMHeadModel.from_pretrained(name_or_path, use_safetensors=True)  # never a pickle: it can run code
        c = hf.config
        activations = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu", "relu": "relu"}
        if c.activation_function not in activations:
            raise ValueError(f"{name_or_path}: activation {c.activation_function!r} is not supported")
        config = GPTConfig(block_size=c.n_positions, vocab_size=c.vocab_size, n_layer=c.n_layer, n_head=c.n_head,
                           n_embd=c.n_embd, bias=True, norm_eps=c.layer_norm_epsilon,
                           activation=activations[c.activation_function], mlp_hidden=c.n_inner,
                           tie_weights=c.tie_word_embeddings, **override_args)
        model = cls(config)
        theirs = hf.state_dict()
        with torch.no_grad():
            for name, p in model.state_dict().items():
                w = theirs[name]
                if name.endswith(HF_CONV1D):  # Hugging Face's Conv1D stores (in, out): ours is (out, in)
                    w = w.t()
                if w.shape != p.shape:
                    raise ValueError(f"{name_or_path}: {name} has shape {tuple(w.shape)}, expected {tuple(p.shape)}")
                p.copy_(w)
        return model

    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type, optimizer="adamw",
                             muon_lr=0.02, muon_momentum=0.95, muon_weight_decay=0.0):
        """AdamW, decaying matrices and embeddings (2+ dims) but not biases and gains.

        optimizer="muon": Muon (optim.py) for the hidden matrices of the blocks,
        AdamW for embeddings, the head, biases and gains, as modded-nanogpt does.
        Each group remembers its initial_lr so a schedule can scale them together.
        """
        params = [p for p in self.parameters() if p.requires_grad]
        hidden = {id(p) for p in self.transformer.h.parameters() if p.dim() == 2} if optimizer == "muon" else set()
        adam_groups = [
            {"params": [p for p in params if p.dim() >= 2 and id(p) not in hidden], "weight_decay": weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
        ]
        adamw = torch.optim.AdamW(adam_groups, lr=learning_rate, betas=betas, fused=device_type == "cuda")
        if optimizer == "adamw":
            opt = adamw
        elif optimizer == "muon":
            from optim import Muon, Optimizers
            muon = Muon([p for p in params if id(p) in hidden], lr=muon_lr, momentum=muon_momentum,
                        weight_decay=muon_weight_decay)
            opt = Optimizers(muon=muon, adamw=adamw)
        else:
            raise ValueError(f"optimizer must be adamw or muon, got {optimizer!r}")
        for group in opt.param_groups:
            group["initial_lr"] = group["lr"]
        return opt

    def flops_per_token(self):
        """Training FLOPs per token: 6 per parameter (fwd + bwd) plus attention's 12*L*H*hs*T."""
        c = self.config
        return 6 * self.get_num_params() + 12 * c.n_layer * c.n_head * c.head_dim * c.block_size

    def estimate_mfu(self, fwdbwd_per_iter, dt, peak_flops):
        """Model FLOPs utilization: achieved FLOP/s over the device's peak (the caller knows it)."""
        flops_per_iter = self.flops_per_token() * self.config.block_size * fwdbwd_per_iter
        return flops_per_iter / dt / peak_flops

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, top_p=None, stop=None,
                 generator=None, use_cache=True):
        """Continue idx (B, T) by max_new_tokens; returns (B, T + n).

        stop: token-id sequences; a sample ends at its first match, which is
        not included, and its row is padded with -1 after its end. n is the
        number of steps taken: it is smaller than max_new_tokens when every
        sample stopped early.
        """
        stops = [list(s) for s in (stop or []) if len(s)]
        if not stops:  # no host sync per step: the tokens stay on the device until the end
            steps = list(self.stream(idx, max_new_tokens, temperature, top_k, top_p, generator, use_cache))
            return torch.cat([idx] + [t[:, None] for t in steps], dim=1)
        rows = [[] for _ in range(idx.size(0))]
        done = [False] * idx.size(0)
        for tok in self.stream(idx, max_new_tokens, temperature, top_k, top_p, generator, use_cache):
            for b, t in enumerate(tok.tolist()):
                if not done[b]:
                    rows[b].append(t)
                    match = next((s for s in stops if rows[b][-len(s):] == s), None)
                    if match:
                        del rows[b][-len(match):]
                        done[b] = True
            if all(done):
                break
        n = max(len(r) for r in rows)
        new = torch.tensor([r + [-1] * (n - len(r)) for r in rows], dtype=idx.dtype, device=idx.device)
        return torch.cat((idx, new.view(idx.size(0), n)), dim=1)

    @torch.inference_mode()  # entered per step, not while the caller holds a token
    def stream(self, idx, max_new_tokens, temperature=1.0, top_k=None, top_p=None, generator=None, use_cache=True):
        """Yield the next token of every sample, (B,), one step at a time. Serial by nature.

        With the cache: one prefill of the prompt, then one position per step.
        When the context would pass block_size, the cached path keeps the last
        half of the window, recomputes it once and continues, as llama.cpp's
        context shift does (the uncached path slides the window by one each
        step, so the two differ beyond block_size). On CPU the linear layers
        run on packed float32 weights (packed_weights), a second copy of them
        held while the generator runs, up to PACKED_COPY_LIMIT bytes.
        The yielded tensors are inference tensors: call .tolist() or .clone().
        """
        check_sampling(max_new_tokens, temperature, top_k, top_p)
        block = self.config.block_size
        B, T = idx.shape
        was_training = self.training
        self.eval()
        try:
            with packed_weights(self, B):  # decoding feeds B rows per step
                # the last `block` tokens are all any forward reads: nothing grows with max_new_tokens
                window = torch.empty(B, block, dtype=idx.dtype, device=idx.device)  # tokens n - block .. n - 1
                held = min(T, block)
                window[:, block - held:] = idx[:, T - held:]
                cache, start = None, max(0, T - block)  # the cache holds tokens start .. n - 2
                for n in range(T, T + max_new_tokens):
                    if not use_cache:
                        logits, _ = self(window[:, block - min(n, block):], last_only=True)
                    elif cache is None or n - start > block:  # prefill, or shift a full window
                        if cache is None:
                            cache = KVCache(self.config, B, idx.device, self.lm_head.weight.dtype)
                        else:  # keep half: the fewer recomputations, the faster
                            start, cache.pos = window_start(n, start, block), 0
                        logits, _ = self(window[:, block - (n - start):], kv_cache=cache, last_only=True)
                    else:
                        logits, _ = self(window[:, -1:], kv_cache=cache)
                    tok = sample_next(logits[:, -1, :], temperature, top_k, top_p, generator)  # (B,)
                    window = torch.roll(window, -1, dims=1)
                    window[:, -1] = tok
                    yield tok
        finally:
            self.train(was_training)


def check_sampling(max_new_tokens, temperature, top_k, top_p):
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    if not (temperature >= 0 and math.isfinite(temperature)):  # not: NaN fails every comparison
        raise ValueError(f"temperature must be a finite number >= 0 (0 is greedy), got {temperature}")
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k must be >= 1 (or None for no limit), got {top_k}")
    if top_p is not None and not 0 < top_p <= 1:  # also refuses NaN
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")


def sample_next(logits, temperature=1.0, top_k=None, top_p=None, generator=None):
    """One token per row of logits (B, V). Temperature 0 is greedy (argmax).

    Otherwise one uniform draw u per row from the generator (or the row's own,
    given a list of B generators) picks the token
    whose cumulative probability first passes u (inverse-CDF sampling).
    """
    if temperature == 0:
        return logits.argmax(dim=-1)
    logits = logits.float()
    # subtract the maximum first: a tiny temperature then sends the others to -inf, not inf - inf = nan,
    # and the distribution reaches its limit, the argmax (shared equally among tied maxima). Below 1e-30
    # (where a float32 logit gap of 1e-7 already scales to -1e23) the limit is reached: stop dividing there
    scaled = (logits - logits.max(dim=-1, keepdim=True).values) / max(temperature, 1e-30)
    probs = F.softmax(filter_logits(scaled, top_k, top_p), dim=-1)
    return pick(probs, uniform_draws(probs.size(0), generator, probs.device))


def uniform_draws(rows, generator, device):
    """(rows, 1) uniforms in [0, 1): from one generator, or one per row from a list of generators,
    so that each row's draws depend on its own seed alone, whatever else is in the batch."""
    if isinstance(generator, (list, tuple)):
        if len(generator) != rows:
            raise ValueError(f"{len(generator)} generators for {rows} rows; give one per row")
        return torch.cat([torch.rand(1, 1, generator=g, device=device) for g in generator])
    return torch.rand(rows, 1, generator=generator, device=device)


def pick(probs, draw):
    """The token of each row whose cumulative probability first exceeds draw (B, 1) in [0, 1)."""
    cdf = probs.cumsum(dim=-1)
    tok = torch.searchsorted(cdf, draw * cdf[:, -1:], right=True)  # right: a zero-probability token is never picked
    return tok.clamp(max=probs.size(-1) - 1).squeeze(-1)


def filter_logits(logits, top_k=None, top_p=None):
    """Set to -inf the logits outside top-k (ties at the threshold kept) and outside the nucleus."""
    if top_k is not None and top_k < logits.size(-1):
        kth = torch.topk(logits, top_k, dim=-1).values[:, [-1]]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = F.softmax(sorted_logits, dim=-1)
        before = probs.cumsum(dim=-1) - probs  # mass of the tokens ranked above each one
        drop_sorted = before >= top_p  # the smallest set reaching top_p; the first is always kept
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits
