"""A GPT language model in one file, in the order a course teaches it.

GPTConfig (the model's shape); CausalSelfAttention (heads, the causal mask,
the softmax, merging the heads); the norms and rotary position embeddings it
uses; the MLP; the Pre-LN Block; and GPT: embeddings, blocks, the final norm
and the head, whose logits at position t score token t+1.

GPT-2 by default (learned positions, LayerNorm, GELU, tied head), with the
options of current small LLMs (RoPE, RMSNorm, ReLU/ReLU^2/SwiGLU, GQA/MQA,
untied head) behind GPTConfig fields whose defaults keep GPT-2's meaning.
Module names follow GPT-2 (wte, wpe, h, ln_1, attn.c_attn, ...) so GPT-2 and
nanoGPT checkpoints load key for key. Generation (the KV cache, sampling)
lives in generate.py, Hugging Face interchange in hf.py, the optimizers in
optim.py.
"""
import math
from dataclasses import dataclass, replace

import torch
import torch.nn as nn
from torch.nn import functional as F

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
    qk_norm: bool = False  # RMS-normalize each head's q and k (no gain) before RoPE and the scores
    logit_softcap: float | None = None  # logits = cap * tanh(logits / cap): none beyond +-cap
    zero_init_proj: bool = False  # residual projections (c_proj) start at zero: each Block starts as identity
    value_embeds: int = 0  # tables of value embeddings, for the first and the last this many layers

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
        if self.logit_softcap is not None and not self.logit_softcap > 0:
            raise ValueError(f"logit_softcap must be > 0 (or None), got {self.logit_softcap}")
        if not 0 <= 2 * self.value_embeds <= self.n_layer:
            raise ValueError(f"value_embeds ({self.value_embeds}) must be in [0, n_layer / 2] (n_layer = {self.n_layer}): "
                             f"the first and the last value_embeds layers each read a table")
        if not (self.norm_eps > 0 and self.rope_base > 0):
            raise ValueError(f"norm_eps ({self.norm_eps}) and rope_base ({self.rope_base}) must be > 0")

    @property
    def head_dim(self):
        return self.n_embd // self.n_head

    @property
    def kv_heads(self):
        return self.n_kv_head or self.n_head

    @property
    def mlp_width(self):
        if self.mlp_hidden is not None:
            return self.mlp_hidden
        if self.activation == "swiglu":  # same parameter count as a 4x GELU MLP
            return -(-8 * self.n_embd // (3 * 64)) * 64
        return 4 * self.n_embd


class HookPoint(nn.Identity):
    """An observation point: returns its input unchanged. A tool (trace.py) sees the tensor passing
    through with a standard forward hook; unhooked, it costs one function call."""


class CausalSelfAttention(nn.Module):
    """Multi-head attention in which each position sees itself and the positions before it.

    Heads are contiguous blocks of channels: head h reads channels h*hs .. (h+1)*hs - 1 of q, k
    and v. Each head scores its query against every key, q.k / sqrt(hs), masks the later keys to
    -inf before the softmax (so each row renormalizes over the keys it may see), and averages the
    values with those weights; the heads' outputs are concatenated and projected (c_proj).
    """

    def __init__(self, config, layer_idx=0):
        super().__init__()
        self.n_head, self.n_kv_head, self.head_dim = config.n_head, config.kv_heads, config.head_dim
        self.layer_idx = layer_idx  # this layer's slot in a KV cache
        # one fused projection; output rows are q (n_head*hs), then k, then v (n_kv_head*hs each)
        self.c_attn = nn.Linear(config.n_embd, (self.n_head + 2 * self.n_kv_head) * self.head_dim, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.attn_dropout = make_dropout(config)
        self.resid_dropout = make_dropout(config)
        self.dropout = config.dropout
        self.impl = config.attn_impl
        self.qk_norm, self.norm_eps = config.qk_norm, config.norm_eps
        # value embeddings (modded-nanogpt): v = ve_mix[0] * v + ve_mix[1] * (the token's own vector), learned
        self.ve_mix = None
        if value_embedded(config, layer_idx) is not None:
            self.ve_mix = nn.Parameter(torch.tensor([0.5, 0.5]))
        # observation points, in the order the tensors are made (the scores exist on the manual path only)
        self.hook_q, self.hook_k, self.hook_v = HookPoint(), HookPoint(), HookPoint()  # (B, nh or nkv, T, hs)
        self.hook_q_rot, self.hook_k_rot = HookPoint(), HookPoint()  # after RoPE, where it is used
        self.hook_scores, self.hook_masked, self.hook_weights = HookPoint(), HookPoint(), HookPoint()  # (B, nh, T, L)
        self.hook_heads = HookPoint()  # (B, nh, T, hs): each head's output, before the merge

    def forward(self, x, rope=None, cache=None, ve=None, mask=None):
        B, T, C = x.size()
        q_dim, kv_dim = self.n_head * self.head_dim, self.n_kv_head * self.head_dim
        q, k, v = self.c_attn(x).split([q_dim, kv_dim, kv_dim], dim=2)
        if ve is not None:  # (B, T, kv_dim): this layer's value embedding of each token
            v = self.ve_mix[0] * v + self.ve_mix[1] * ve
        # heads are contiguous channel blocks: channel c belongs to head c // hs
        q = q.view(B, T, self.n_head, self.head_dim).transpose(1, 2)  # (B, nh, T, hs)
        k = k.view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2)  # (B, nkv, T, hs)
        if self.qk_norm:  # every q and k of length sqrt(hs): the scores' scale no longer grows with training
            q, k = F.rms_norm(q, (self.head_dim,), eps=self.norm_eps), F.rms_norm(k, (self.head_dim,), eps=self.norm_eps)
        q, k = self.hook_q(q), self.hook_k(k)
        v = self.hook_v(v.view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2))  # (B, nkv, T, hs)
        if rope is not None:
            q, k = self.hook_q_rot(apply_rope(q, rope)), self.hook_k_rot(apply_rope(k, rope))
        if cache is not None:
            k, v = cache.update(self.layer_idx, k, v)  # (B, nkv, L, hs), L = positions so far
        y = self.hook_heads(self.attend(q, k, v, mask))  # (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # merge heads by concatenation
        return self.resid_dropout(self.c_proj(y))

    def attend(self, q, k, v, mask=None):
        """Causal attention of T queries over L >= T keys. mask None: the queries are the last T positions;
        else (B, 1, T, L) bool, True where a query may see a key (rows of a batch at different positions)."""
        T, L = q.size(2), k.size(2)
        dropout_p = self.dropout if self.training else 0.0
        if self.impl == "sdpa":
            # without a mask: is_causal aligns its mask top-left, which is right only when T == L;
            # one query (a decode step) sees every key, so it needs no mask
            # (branches, not expressions: under torch.compile(dynamic=True) T == L is symbolic)
            causal = False
            if mask is None and T == L and T > 1:
                causal = True
            elif mask is None and 1 < T:
                mask = causal_mask(T, L, q.device)
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p,
                                                  is_causal=causal, enable_gqa=self.n_kv_head != self.n_head)
        # the manual path: each step written out
        k, v = self.expand_kv(k), self.expand_kv(v)  # (B, nh, L, hs)
        scores = self.hook_scores((q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.head_dim)))  # (B, nh, T, L)
        if mask is None:
            mask = causal_mask(T, L, q.device)
        masked = self.hook_masked(scores.masked_fill(~mask, float("-inf")))
        weights = self.hook_weights(F.softmax(masked, dim=-1))  # each row sums to 1 over the keys it may see
        return self.attn_dropout(weights) @ v  # (B, nh, T, hs)

    def expand_kv(self, t):
        """GQA/MQA: query head h reads kv head h // (n_head / n_kv_head)."""
        return t if self.n_kv_head == self.n_head else t.repeat_interleave(self.n_head // self.n_kv_head, dim=1)


def value_embedded(config, layer):
    """The value-embedding table layer reads, or None: the first and the last value_embeds layers read tables
    0, 1, ..., in that order (modded-nanogpt's 012...012)."""
    n, L = config.value_embeds, config.n_layer
    return layer if layer < n else layer - (L - n) if layer >= L - n else None


def causal_mask(T, L, device):
    """(T, L) bool, True where query i (at position L-T+i) may see key j."""
    return torch.ones(T, L, dtype=torch.bool, device=device).tril(diagonal=L - T)


def rope_tables(config, device=None):
    """exp(i * pos * base^(-2i/head_dim)) as complex numbers, (block_size, head_dim/2)."""
    inv_freq = config.rope_base ** (-torch.arange(0, config.head_dim, 2, dtype=torch.float64, device=device) / config.head_dim)
    angles = torch.outer(torch.arange(config.block_size, dtype=torch.float64, device=device), inv_freq)
    return torch.polar(torch.ones_like(angles), angles).to(torch.complex64)


def apply_rope(x, rope):
    """Rotate channel pairs (2i, 2i+1) of each head: x (B, nh, T, hs), rope (T, hs/2) complex, or
    (B, 1, T, hs/2) for rows at different positions.

    Pair (a, b) read as a + ib times e^(i angle) is (a cos - b sin) + i(a sin + b cos):
    one complex multiply instead of four real ones and a stack.
    """
    pairs = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))  # (B, nh, T, hs/2)
    return torch.view_as_real(pairs * rope).flatten(-2).type_as(x)


class LayerNorm(nn.Module):
    """LayerNorm whose bias is optional (bias=False: weight only), as GPT-2-style checkpoints without biases need."""

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


def make_norm(config):
    if config.norm == "rmsnorm":
        return RMSNorm(config.n_embd, config.norm_eps)
    return LayerNorm(config.n_embd, config.bias, config.norm_eps)


def make_dropout(config):
    """Dropout, or nothing at all when p is 0: a decode step makes a dozen of these calls."""
    return nn.Dropout(config.dropout) if config.dropout > 0 else nn.Identity()


class MLP(nn.Module):

    def __init__(self, config):
        super().__init__()
        self.activation = config.activation
        hidden = config.mlp_width
        # swiglu: c_fc produces gate rows first, then up rows
        self.c_fc = nn.Linear(config.n_embd, 2 * hidden if self.activation == "swiglu" else hidden, bias=config.bias)
        self.c_proj = nn.Linear(hidden, config.n_embd, bias=config.bias)
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
    """Pre-LN: each sublayer reads a normalized copy of the residual stream and adds its output back."""

    def __init__(self, config, layer_idx=0):
        super().__init__()
        self.ln_1 = make_norm(config)
        self.attn = CausalSelfAttention(config, layer_idx)
        self.ln_2 = make_norm(config)
        self.mlp = MLP(config)

    def forward(self, x, rope=None, cache=None, ve=None, mask=None):
        x = x + self.attn(self.ln_1(x), rope, cache, ve, mask)
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
        if config.value_embeds:  # outside the blocks: Muon takes the blocks' matrices, embeddings go to AdamW
            self.transformer.ve = nn.ModuleList([nn.Embedding(config.vocab_size, config.kv_heads * config.head_dim)
                                                 for _ in range(config.value_embeds)])
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        if config.tie_weights:
            self.lm_head.weight = self.transformer.wte.weight
        if config.pos_emb == "rope":  # not persistent: recomputed, never in a checkpoint
            self.register_buffer("rope", rope_tables(config), persistent=False)
        self.apply(self._init_weights)
        # GPT-2: residual projections scaled by 1/sqrt(number of residual additions)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))
                if config.zero_init_proj:
                    torch.nn.init.zeros_(p)

    def _init_weights(self, module):
        if isinstance(module, nn.Linear):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx, targets=None, kv_cache=None, last_only=False):
        """Logits (B, T, V) where position t scores token t+1, and the mean loss if targets.

        Training sees every position at once (the mask keeps each from the later ones).
        kv_cache: continue from the positions it holds (and add these): generate.py's KVCache, or
        engine.py's SlotCache, whose rows sit at different positions. The cache says where the new
        tokens go: their positions, (T,) or (B, T), and the mask, None for the causal rule or (B, 1, T, L).
        last_only: compute logits for the last position only (generation).
        """
        B, T = idx.size()
        if T > self.config.block_size:
            raise ValueError(f"sequence of {T} tokens is longer than block_size ({self.config.block_size}); "
                             f"crop the input to its last {self.config.block_size} tokens")
        pos, mask = torch.arange(T, device=idx.device), None
        if kv_cache is not None:  # after the positions it holds
            pos, mask = kv_cache.positions(T), kv_cache.mask(T)
        x = self.transformer.wte(idx)  # (B, T, C)
        rope = None
        if self.config.pos_emb == "learned":
            x = x + self.transformer.wpe(pos)  # (T, C) or (B, T, C)
        else:
            rope = self.rope[pos].unsqueeze(-3)  # (1, T, hs/2) or (B, 1, T, hs/2): the same for every head
        x = self.transformer.drop(x)
        for i, block in enumerate(self.transformer.h):
            table = value_embedded(self.config, i)
            x = block(x, rope, kv_cache, None if table is None else self.transformer.ve[table](idx), mask)
        x = self.transformer.ln_f(x)
        if kv_cache is not None:
            kv_cache.advance(T)
        if targets is not None:
            logits = self.softcap(self.lm_head(x))
            # in float32 whatever the logits' dtype: a bfloat16 loss near 4 moves in steps of 1/64
            loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-1)
            return logits, loss
        return self.softcap(self.lm_head(x[:, [-1], :] if last_only else x)), None

    def softcap(self, logits):
        cap = self.config.logit_softcap
        return logits if cap is None else cap * torch.tanh(logits / cap)

    def get_num_params(self, non_embedding=True):
        """Parameters, each shared tensor once; position and value embeddings (lookups) excluded by default."""
        n = sum(p.numel() for p in self.parameters())
        for name in ("wpe", "ve"):
            if non_embedding and name in self.transformer:
                n -= sum(p.numel() for p in self.transformer[name].parameters())
        return n

    def flops_per_token(self, T=None):
        """Training FLOPs per token of a T-token row (block_size by default): 6 per parameter (fwd + bwd)
        plus attention's 12*L*H*hs*T."""
        c = self.config
        return 6 * self.get_num_params() + 12 * c.n_layer * c.n_head * c.head_dim * (T or c.block_size)

    def estimate_mfu(self, fwdbwd_per_iter, dt, peak_flops):
        """Model FLOPs utilization: achieved FLOP/s over the device's peak (the caller knows it)."""
        flops_per_iter = self.flops_per_token() * self.config.block_size * fwdbwd_per_iter
        return flops_per_iter / dt / peak_flops

    def crop_block_size(self, block_size):
        """Shrink the context window, e.g. to fine-tune GPT-2 (1024) on shorter blocks."""
        if not 0 < block_size <= self.config.block_size:
            raise ValueError(f"block_size can only shrink: {block_size} > {self.config.block_size}")
        self.config.block_size = block_size
        if "wpe" in self.transformer:
            self.transformer.wpe.weight = nn.Parameter(self.transformer.wpe.weight[:block_size])
        else:
            self.rope = self.rope[:block_size]

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None):
        """Continue idx (B, T) by max_new_tokens tokens, one at a time: nanoGPT's loop, the reference.

        Each step runs the whole context (its last block_size tokens) and samples the last position's
        next token. generate.py does the same far faster (a KV cache, packed weights, top-p, stops, a
        generator per sample); the tests hold its greedy text to this loop's.
        """
        for _ in range(max_new_tokens):
            idx_cond = idx if idx.size(1) <= self.config.block_size else idx[:, -self.config.block_size:]
            logits, _ = self(idx_cond, last_only=True)
            logits = logits[:, -1, :]  # (B, V): scores of the next token
            if temperature == 0:  # greedy
                idx_next = logits.argmax(dim=-1, keepdim=True)
            else:
                logits = logits / temperature  # the order stays; lower temperatures sharpen
                if top_k is not None:
                    v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
                    logits[logits < v[:, [-1]]] = -float("inf")  # ties at the k-th score are kept
                idx_next = torch.multinomial(F.softmax(logits, dim=-1), num_samples=1)
            idx = torch.cat((idx, idx_next), dim=1)
        return idx
