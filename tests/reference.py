"""An independent GPT forward pass in numpy (float64), written from the equations.

Loops over positions and keys on purpose: each query's softmax runs over the
keys it may see and nothing else, so no mask trick is shared with model.py.
"""
import math

import numpy as np


def norm(x, weight, bias, kind, eps):
    if kind == "rmsnorm":
        return x / np.sqrt((x ** 2).mean(-1, keepdims=True) + eps) * weight
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    out = (x - mu) / np.sqrt(var + eps) * weight
    return out + bias if bias is not None else out


def rotate(vec, pos, base):
    """RoPE on one head's vector: pair (2i, 2i+1) turned by pos * base^(-2i/d)."""
    out = vec.copy()
    d = len(vec)
    for i in range(d // 2):
        angle = pos * base ** (-2 * i / d)
        a, b = vec[2 * i], vec[2 * i + 1]
        out[2 * i] = a * math.cos(angle) - b * math.sin(angle)
        out[2 * i + 1] = a * math.sin(angle) + b * math.cos(angle)
    return out


def gelu(x):
    from math import erf
    return 0.5 * x * (1 + np.vectorize(erf)(x / math.sqrt(2)))


def activation(h, kind):
    if kind == "gelu":
        return gelu(h)
    if kind == "gelu_tanh":
        return 0.5 * h * (1 + np.tanh(math.sqrt(2 / math.pi) * (h + 0.044715 * h ** 3)))
    if kind == "relu":
        return np.maximum(h, 0)
    if kind == "relu2":
        return np.maximum(h, 0) ** 2
    gate, up = np.split(h, 2, axis=-1)  # swiglu: gate rows first
    return gate / (1 + np.exp(-gate)) * up


def linear(x, sd, name):
    y = x @ sd[name + ".weight"].T
    return y + sd[name + ".bias"] if name + ".bias" in sd else y


def attention(x, sd, prefix, cfg, ve=None):
    """Causal multi-head attention on one sequence x (T, C); returns (T, C) and the weights.
    ve: (T, kv channels), the layer's value embedding of each token, mixed into v by the layer's ve_mix."""
    T = x.shape[0]
    nh, nkv, hd = cfg.n_head, cfg.kv_heads, cfg.head_dim
    qkv = linear(x, sd, prefix + "c_attn")
    q = qkv[:, :nh * hd].reshape(T, nh, hd)
    k = qkv[:, nh * hd:(nh + nkv) * hd].reshape(T, nkv, hd)
    v = qkv[:, (nh + nkv) * hd:]
    if ve is not None:
        mix = sd[prefix + "ve_mix"]
        v = mix[0] * v + mix[1] * ve
    v = v.reshape(T, nkv, hd)
    if cfg.qk_norm:  # each head's vector divided by its root mean square
        q = q / np.sqrt((q ** 2).mean(-1, keepdims=True) + cfg.norm_eps)
        k = k / np.sqrt((k ** 2).mean(-1, keepdims=True) + cfg.norm_eps)
    if cfg.pos_emb == "rope":
        q = np.stack([[rotate(q[t, h], t, cfg.rope_base) for h in range(nh)] for t in range(T)])
        k = np.stack([[rotate(k[t, h], t, cfg.rope_base) for h in range(nkv)] for t in range(T)])
    heads = np.zeros((T, nh, hd))
    weights = np.zeros((nh, T, T))
    for h in range(nh):
        g = h // (nh // nkv)  # the kv head this query head reads
        for t in range(T):
            scores = np.array([q[t, h] @ k[s, g] / math.sqrt(hd) for s in range(t + 1)])  # visible keys only
            w = np.exp(scores - scores.max())
            w /= w.sum()
            weights[h, t, :t + 1] = w
            heads[t, h] = (w[:, None] * v[:t + 1, g]).sum(0)
    merged = heads.reshape(T, nh * hd)  # concatenation: channel c = h*hd + r
    return linear(merged, sd, prefix + "c_proj"), weights


def value_tables(n, n_layer):
    """The value-embedding table each layer reads, or None: modded-nanogpt's 012...012, written as its list.

    The first n layers read tables 0, 1, ..., n-1 in that order, the middle layers none, and the last n layers
    the same tables again in the same order (not mirrored): layer i and layer n_layer - n + i share table i.
    """
    return list(range(n)) + [None] * (n_layer - 2 * n) + list(range(n))


def forward(sd, cfg, idx):
    """Logits (T, V) and the final normed hidden states (T, C) for one sequence of ids."""
    sd = {k: v.detach().double().numpy() for k, v in sd.items()}
    idx = np.asarray(idx)
    T = len(idx)
    x = sd["transformer.wte.weight"][idx]
    if cfg.pos_emb == "learned":
        x = x + sd["transformer.wpe.weight"][:T]
    tables = value_tables(cfg.value_embeds, cfg.n_layer)
    for layer, table in enumerate(tables):
        p = f"transformer.h.{layer}."
        ve = sd[f"transformer.ve.{table}.weight"][idx] if table is not None else None
        a, _ = attention(norm(x, sd[p + "ln_1.weight"], sd.get(p + "ln_1.bias"), cfg.norm, cfg.norm_eps),
                         sd, p + "attn.", cfg, ve)
        x = x + a
        h = linear(norm(x, sd[p + "ln_2.weight"], sd.get(p + "ln_2.bias"), cfg.norm, cfg.norm_eps), sd, p + "mlp.c_fc")
        x = x + linear(activation(h, cfg.activation), sd, p + "mlp.c_proj")
    final = norm(x, sd["transformer.ln_f.weight"], sd.get("transformer.ln_f.bias"), cfg.norm, cfg.norm_eps)
    head = sd.get("lm_head.weight", sd["transformer.wte.weight"])
    logits = final @ head.T
    if cfg.logit_softcap is not None:
        logits = cfg.logit_softcap * np.tanh(logits / cfg.logit_softcap)
    return logits, final


def next_token_log_probs(model, ids):
    """(len(ids), V) float64 log-probabilities of the token after each position of ids (one row): the model's
    own forward, then a log-softmax in numpy rather than the code under test's."""
    import torch
    with torch.no_grad():
        logits = model(torch.tensor([ids]))[0][0].double().numpy()
    shifted = logits - logits.max(-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
