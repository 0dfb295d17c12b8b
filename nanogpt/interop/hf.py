"""Hugging Face models in and out: GPT-2 here, Llama and Qwen3 through llama.py.

load_pretrained is the programs' one entry: a Llama or Qwen3 directory goes to llama.from_llama, anything
else (gpt2, ..., gpt2-xl, a GPT-2 directory) to from_hf, each failure a one-line UserError; from_pretrained is
nanoGPT's GPT.from_pretrained (GPT-2 only). hf_architecture says which of the three computes a model exactly.

GPT-2's table, both directions: the parameter names are the same on both sides
(transformer.h.N.attn.c_attn.weight, ...), four matrices are Conv1D there and
so stored transposed, and the activations have other names. Needs the optional
transformers package.
"""
import os
import socket
from urllib.parse import urlparse

import torch

from model import GPT, GPTConfig
from nanogpt.checkpoint import check_shapes
from nanogpt.errors import UserError
from nanogpt.interop.hf_files import header_shapes, read_config
from nanogpt.interop.llama import ARCHITECTURES, from_llama, model_type

# ours (nn.Linear, (out, in)) <-> Hugging Face's Conv1D ((in, out)): the same matrix, transposed
CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
# our activation -> Hugging Face's activation_function; reading, gelu_pytorch_tanh is gelu_tanh too
ACTIVATIONS = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu"}
FROM_HF_ACTIVATIONS = {**{theirs: ours for ours, theirs in ACTIVATIONS.items()}, "gelu_pytorch_tanh": "gelu_tanh"}


def as_theirs(name, tensor):
    """A tensor of ours as Hugging Face stores it (and back: a transpose is its own inverse)."""
    return tensor.t() if name.endswith(CONV1D) else tensor


def transformers_module():
    try:
        import transformers
    except ImportError:
        raise ImportError("GPT-2 weights and export need transformers: pip install transformers") from None
    return transformers


def from_hf(name_or_path, **runtime):
    """A GPT holding the weights of gpt2, gpt2-medium, gpt2-large, gpt2-xl or a local Hugging Face GPT-2
    directory (safetensors only: a pickle can run code). runtime may set dropout and attn_impl.

    A local directory's config.json is checked against the shapes its safetensors files hold (their
    headers: nothing is loaded) before any model is built: its claimed sizes are not trusted."""
    transformers = transformers_module()
    if os.path.isdir(name_or_path):
        check_config_json(name_or_path)
        check_claims(name_or_path, config_from_hf(transformers.GPT2Config.from_pretrained(name_or_path),
                                                  name_or_path, runtime))
    offline = not os.path.isdir(name_or_path) and not hub_reachable()  # then Hugging Face's cache, at once
    hf = transformers.GPT2LMHeadModel.from_pretrained(name_or_path, use_safetensors=True, local_files_only=offline)
    model = GPT(config_from_hf(hf.config, name_or_path, runtime))
    theirs = hf.state_dict()
    with torch.no_grad():
        for name, p in model.state_dict().items():
            w = as_theirs(name, theirs[name])
            if w.shape != p.shape:
                raise ValueError(f"{name_or_path}: {name} has shape {tuple(w.shape)}, expected {tuple(p.shape)}")
            p.copy_(w)
    return model


def hub_reachable():
    """False where the Hugging Face Hub's host name does not resolve and no proxy is set: no network. Its
    client would retry for half a minute before it reads the cache or fails; HF_HUB_OFFLINE=1 skips both."""
    if any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return True  # a proxy may reach what the machine cannot resolve
    from huggingface_hub import constants
    try:
        socket.getaddrinfo(urlparse(constants.ENDPOINT).hostname, 443)
    except OSError:  # socket.gaierror: no such name, or no DNS at all
        return False
    return True


def load_pretrained(name_or_path, **runtime):
    """GPT-2's weights (from_hf), or a Llama or Qwen3 directory's (llama.py), with their failures as one-line
    UserErrors."""
    if os.path.isdir(name_or_path) and not os.path.exists(os.path.join(name_or_path, "model.safetensors")):
        pickles = [f for f in os.listdir(name_or_path) if f.endswith((".bin", ".pt", ".pth", ".ckpt"))]
        if pickles:
            raise UserError(f"{name_or_path} holds its weights as a pickle ({pickles[0]}), which can run code when "
                            f"loaded; only model.safetensors is read: convert it where you trust the file "
                            f"(transformers: model.save_pretrained(dir, safe_serialization=True))")
    try:
        if os.path.isdir(name_or_path) and model_type(name_or_path) in ARCHITECTURES:  # export.py's Llama, Qwen3
            return from_llama(name_or_path, **runtime)
        return from_hf(name_or_path, **runtime)
    except ImportError as e:
        raise UserError(str(e)) from None
    except (OSError, ValueError) as e:
        first = str(e).strip().splitlines()[0].rstrip(".") if str(e).strip() else type(e).__name__
        raise UserError(f"cannot load GPT-2 weights {name_or_path!r}: {first}; offline, pass a local copy (a "
                        f"directory holding config.json and model.safetensors) as --init_from=DIR, or set "
                        f"HF_HUB_OFFLINE=1 to read Hugging Face's cache") from None


def from_pretrained(name_or_path, override_args=None):
    """nanoGPT's GPT.from_pretrained: GPT-2's weights (gpt2, ..., gpt2-xl, or a local Hugging Face
    directory); override_args may set dropout and attn_impl."""
    override_args = override_args or {}
    if set(override_args) - {"dropout", "attn_impl"}:
        raise ValueError(f"only dropout and attn_impl can be overridden, got {sorted(override_args)}")
    return from_hf(name_or_path, **override_args)


def config_from_hf(c, name_or_path, runtime):
    """Our GPTConfig of a transformers GPT2Config."""
    if c.activation_function not in FROM_HF_ACTIVATIONS:
        raise ValueError(f"{name_or_path}: activation {c.activation_function!r} is not supported")
    return GPTConfig(block_size=c.n_positions, vocab_size=c.vocab_size, n_layer=c.n_layer, n_head=c.n_head,
                     n_embd=c.n_embd, bias=True, norm_eps=c.layer_norm_epsilon,
                     activation=FROM_HF_ACTIVATIONS[c.activation_function], mlp_hidden=c.n_inner,
                     tie_weights=c.tie_word_embeddings, **runtime)


# config.json's fields that config_from_hf reads, and the JSON types each must have
CONFIG_TYPES = {"n_positions": int, "vocab_size": int, "n_layer": int, "n_head": int, "n_embd": int,
                "n_inner": (int, type(None)), "layer_norm_epsilon": float, "activation_function": str,
                "tie_word_embeddings": bool}


def check_config_json(directory):
    """directory's config.json is a JSON object whose fields we read have their types (transformers takes
    "n_embd": "32" as it stands) and sizes of at least 1."""
    read_config(directory, CONFIG_TYPES, positive=("n_positions", "vocab_size", "n_layer", "n_head", "n_embd"))


def check_claims(directory, config):
    """config (from directory's config.json) against the names and shapes in its safetensors headers."""
    state = {}
    for key, shape in header_shapes(directory).items():
        name = key if key.startswith(("transformer.", "lm_head.")) else "transformer." + key  # GPT2Model's
        if not name.endswith((".attn.bias", ".attn.masked_bias")):  # mask buffers, not weights: a checkpoint may hold them
            state[name] = torch.empty(shape[::-1] if name.endswith(CONV1D) else shape, device="meta")
    if not state:
        return  # no safetensors file: from_pretrained says so
    if config.tie_weights and "lm_head.weight" not in state and "transformer.wte.weight" in state:
        state["lm_head.weight"] = state["transformer.wte.weight"]
    check_shapes(config, state, directory, claims="config.json")


def incompatibilities(config):
    """Why a model cannot be a Hugging Face GPT2LMHeadModel (empty when it can)."""
    reasons = []
    if config.pos_emb != "learned":
        reasons.append(f"pos_emb={config.pos_emb}")
    if config.norm != "layernorm":
        reasons.append(f"norm={config.norm}")
    if config.activation not in ACTIVATIONS:
        reasons.append(f"activation={config.activation}")
    if config.kv_heads != config.n_head:
        reasons.append(f"n_kv_head={config.n_kv_head}")
    if config.qk_norm:
        reasons.append("qk_norm=True")
    if config.logit_softcap is not None:
        reasons.append(f"logit_softcap={config.logit_softcap}")
    if config.value_embeds:
        reasons.append(f"value_embeds={config.value_embeds}")
    return reasons


def to_hf(model, eot_token=None):
    """A transformers GPT2LMHeadModel holding model's weights.

    eot_token: the tokenizer's end-of-text id, written as bos/eos_token_id (None
    for vocabularies without one, such as characters).
    """
    transformers = transformers_module()
    c = model.config
    hf_config = transformers.GPT2Config(
        vocab_size=c.vocab_size, n_positions=c.block_size, n_embd=c.n_embd, n_layer=c.n_layer, n_head=c.n_head,
        n_inner=c.mlp_width, activation_function=ACTIVATIONS[c.activation], layer_norm_epsilon=c.norm_eps,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, tie_word_embeddings=c.tie_weights,
        bos_token_id=eot_token, eos_token_id=eot_token)
    hf = transformers.GPT2LMHeadModel(hf_config).eval()
    ours = model.state_dict()
    buffers = {name for name, _ in hf.named_buffers()}  # causal-mask buffers of older transformers versions
    with torch.no_grad():
        for name, p in hf.state_dict().items():
            if name in buffers:
                continue
            if name not in ours:
                p.zero_()  # a bias-free model: zero biases compute the same
                continue
            p.copy_(as_theirs(name, ours[name]))
    return hf


# what exports to which architecture
RECIPES = ("GPT-2's recipe (learned positions, LayerNorm, GELU or ReLU, n_kv_head = n_head) exports as GPT2LMHeadModel; "
           "--pos_emb=rope --norm=rmsnorm --activation=swiglu (any n_kv_head, tied or not) as LlamaForCausalLM, "
           "with --qk_norm=True as Qwen3ForCausalLM; none with value_embeds or logit_softcap")


def hf_architecture(config, path):
    """The Hugging Face model_type that computes config's model exactly: "gpt2", "llama" or "qwen3"; else a
    UserError naming each option none expresses and the recipes that export."""
    reasons = []
    if config.value_embeds:
        reasons.append(f"value_embeds={config.value_embeds} (no Hugging Face architecture has value embeddings)")
    if config.logit_softcap is not None:
        reasons.append(f"logit_softcap={config.logit_softcap} (Gemma 2, the architecture with a final softcap, also "
                       f"scales the embeddings and normalizes every sublayer's output)")
    if config.pos_emb == "learned":
        reasons += [r for r in incompatibilities(config) if not r.startswith(("value_embeds", "logit_softcap"))]
        if not reasons:
            return "gpt2"
    else:
        if config.norm != "rmsnorm":
            reasons.append(f"norm={config.norm} with RoPE (Llama and Qwen3 use RMSNorm)")
        if config.activation != "swiglu":
            reasons.append(f"activation={config.activation} with RoPE (Llama and Qwen3 use SwiGLU)")
        if config.qk_norm and config.bias:
            reasons.append("qk_norm=True with bias=True (Qwen3 has no MLP biases)")
        if not reasons:
            return "qwen3" if config.qk_norm else "llama"
    raise UserError(f"{path} cannot export: {'; '.join(reasons)}. {RECIPES}")
