"""Hugging Face's Llama and Qwen3 in one place: write a RoPE + RMSNorm + SwiGLU GPT as their directory,
read such a directory back into a GPT.

One table of names; two rules the names do not show:
- RoPE's pairing. model.py rotates channel pairs (2i, 2i+1) of each head; Llama and Qwen3 rotate
  channel i with channel i + head_dim/2 (rotate_half). Both give pair i the same frequency, so the
  same model is q and k with each head's channels reordered: evens first, then odds (to_halves).
  The scores q.k are sums over channels and do not change; v and o keep their order.
- Ours has no gain in qk_norm: Qwen3's per-head q_norm and k_norm are written as ones (and a
  directory whose gains are not ones is refused on reading: ours cannot compute it).
SwiGLU's c_fc holds the gate rows, then the up rows: gate_proj and up_proj. Needs transformers.
"""
import json
import os

import torch

from model import GPT, GPTConfig
from nanogpt.errors import UserError
from nanogpt.files import check_regular, read_regular
from nanogpt.interop.hf_files import header_shapes, read_config

# our parameter suffix (per block) -> Llama's; c_attn and c_fc split into several of theirs
BLOCK = {"ln_1.weight": "input_layernorm.weight", "ln_2.weight": "post_attention_layernorm.weight",
         "attn.c_proj.weight": "self_attn.o_proj.weight", "attn.c_proj.bias": "self_attn.o_proj.bias",
         "mlp.c_proj.weight": "mlp.down_proj.weight", "mlp.c_proj.bias": "mlp.down_proj.bias"}
ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM"}


def to_halves(t, n_heads):
    """Rows of each head's q or k (a weight (n*hs, C) or bias (n*hs,)) from pairs (2i, 2i+1) to halves
    (i, i + hs/2): the evens of the head, then its odds."""
    return t.reshape(n_heads, -1, 2, *t.shape[1:]).transpose(1, 2).reshape(t.shape)


def from_halves(t, n_heads):
    """to_halves undone."""
    return t.reshape(n_heads, 2, -1, *t.shape[1:]).transpose(1, 2).reshape(t.shape)


def llama_state(model, qk_norm_gains=False):
    """model's state dict under Llama's names, q and k in halves order; Qwen3's q_norm/k_norm gains (ones)
    where qk_norm_gains."""
    c, ours = model.config, model.state_dict()
    q_dim, kv_dim = c.n_head * c.head_dim, c.kv_heads * c.head_dim
    state = {"model.embed_tokens.weight": ours["transformer.wte.weight"], "model.norm.weight": ours["transformer.ln_f.weight"]}
    if not c.tie_weights:
        state["lm_head.weight"] = ours["lm_head.weight"]
    for i in range(c.n_layer):
        mine, theirs = f"transformer.h.{i}.", f"model.layers.{i}."
        for suffix, name in BLOCK.items():
            if mine + suffix in ours:
                state[theirs + name] = ours[mine + suffix]
        for kind in ("weight", "bias"):
            if mine + "attn.c_attn." + kind in ours:
                q, k, v = ours[mine + "attn.c_attn." + kind].split([q_dim, kv_dim, kv_dim])
                state[theirs + "self_attn.q_proj." + kind] = to_halves(q, c.n_head)
                state[theirs + "self_attn.k_proj." + kind] = to_halves(k, c.kv_heads)
                state[theirs + "self_attn.v_proj." + kind] = v
            if mine + "mlp.c_fc." + kind in ours:
                gate, up = ours[mine + "mlp.c_fc." + kind].chunk(2)
                state[theirs + "mlp.gate_proj." + kind], state[theirs + "mlp.up_proj." + kind] = gate, up
        if qk_norm_gains:
            for name in ("q_norm", "k_norm"):
                state[theirs + f"self_attn.{name}.weight"] = torch.ones(c.head_dim)
    return {k: v.contiguous() for k, v in state.items()}


def our_state(state, config):
    """A Llama/Qwen3 state dict (llama_state's names) as GPT(config)'s."""
    c = config
    ours = {"transformer.wte.weight": state["model.embed_tokens.weight"], "transformer.ln_f.weight": state["model.norm.weight"]}
    ours["lm_head.weight"] = ours["transformer.wte.weight"] if c.tie_weights else state.get("lm_head.weight")
    for i in range(c.n_layer):
        mine, theirs = f"transformer.h.{i}.", f"model.layers.{i}."
        for suffix, name in BLOCK.items():
            if theirs + name in state:
                ours[mine + suffix] = state[theirs + name]
        for kind in ("weight", "bias"):
            if theirs + "self_attn.q_proj." + kind in state:
                ours[mine + "attn.c_attn." + kind] = torch.cat([
                    from_halves(state[theirs + "self_attn.q_proj." + kind], c.n_head),
                    from_halves(state[theirs + "self_attn.k_proj." + kind], c.kv_heads),
                    state[theirs + "self_attn.v_proj." + kind]])
            if theirs + "mlp.gate_proj." + kind in state:
                ours[mine + "mlp.c_fc." + kind] = torch.cat([state[theirs + "mlp.gate_proj." + kind],
                                                            state[theirs + "mlp.up_proj." + kind]])
    return {k: v for k, v in ours.items() if v is not None}


def to_llama(model, model_type, bos_token_id=None, eos_token_id=None):
    """A transformers LlamaForCausalLM (model_type "llama") or Qwen3ForCausalLM ("qwen3") holding model's weights."""
    import transformers  # ImportError: the caller says what to install
    c = model.config
    common = dict(vocab_size=c.vocab_size, hidden_size=c.n_embd, intermediate_size=c.mlp_width, num_hidden_layers=c.n_layer,
                  num_attention_heads=c.n_head, num_key_value_heads=c.kv_heads, head_dim=c.head_dim, hidden_act="silu",
                  max_position_embeddings=c.block_size, rms_norm_eps=c.norm_eps, tie_word_embeddings=c.tie_weights,
                  rope_parameters={"rope_type": "default", "rope_theta": float(c.rope_base)}, attention_bias=c.bias,
                  bos_token_id=bos_token_id, eos_token_id=eos_token_id, pad_token_id=None)
    if model_type == "llama":
        hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(**common, mlp_bias=c.bias))
    else:
        hf = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**common, use_sliding_window=False))
    state = llama_state(model, qk_norm_gains=model_type == "qwen3")
    if c.tie_weights:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    hf.load_state_dict(state, strict=True)
    return hf.eval()


def model_type(directory):
    """config.json's model_type in a Hugging Face directory ("gpt2", "llama", ...), or None where it names none."""
    try:
        config = json.loads(read_regular(os.path.join(directory, "config.json")))  # a FIFO: one line, never a wait
    except (OSError, ValueError, RecursionError):
        return None  # the GPT-2 reader reports what is wrong with it
    kind = config.get("model_type") if isinstance(config, dict) else None
    return kind if isinstance(kind, str) else None


# config.json's fields that config_from_llama reads, and the JSON types each must have; the sizes at least 1
CONFIG_TYPES = {"vocab_size": int, "hidden_size": int, "intermediate_size": int, "num_hidden_layers": int,
                "num_attention_heads": int, "num_key_value_heads": (int, type(None)), "head_dim": (int, type(None)),
                "max_position_embeddings": int, "rms_norm_eps": float, "rope_theta": (int, float),
                "rope_parameters": (dict, type(None)), "hidden_act": str, "attention_bias": bool, "mlp_bias": bool,
                "tie_word_embeddings": bool, "use_sliding_window": bool}
SIZES = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
         "num_key_value_heads", "head_dim", "max_position_embeddings")


def config_from_llama(hf, path, runtime):
    """Our GPTConfig of a transformers LlamaConfig or Qwen3Config; what ours cannot compute is a UserError."""
    from nanogpt.checkpoint import check_rope_positions
    rope = getattr(hf, "rope_parameters", None) or {}
    head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads
    mlp_bias = getattr(hf, "mlp_bias", False)
    differences = []
    if hf.hidden_act != "silu":
        differences.append(f"hidden_act={hf.hidden_act} (ours: silu)")
    if rope.get("rope_type", "default") != "default":
        differences.append(f"rope_type={rope.get('rope_type')} (ours: default)")
    if head_dim * hf.num_attention_heads != hf.hidden_size:
        differences.append(f"head_dim={head_dim} with {hf.num_attention_heads} heads of width {hf.hidden_size}")
    if bool(mlp_bias) != bool(hf.attention_bias):
        differences.append(f"attention_bias={hf.attention_bias} with mlp_bias={mlp_bias}")
    if getattr(hf, "use_sliding_window", False):
        differences.append("use_sliding_window=True")
    if differences:
        raise UserError(f"{path}: {', '.join(differences)}: model.py cannot compute this model")
    try:
        config = GPTConfig(block_size=hf.max_position_embeddings, vocab_size=hf.vocab_size,
                           n_layer=hf.num_hidden_layers, n_head=hf.num_attention_heads, n_embd=hf.hidden_size,
                           n_kv_head=hf.num_key_value_heads, bias=bool(hf.attention_bias), pos_emb="rope",
                           rope_base=float(rope.get("rope_theta", 10000.0)), norm="rmsnorm", norm_eps=hf.rms_norm_eps,
                           activation="swiglu", mlp_hidden=hf.intermediate_size,
                           tie_weights=bool(hf.tie_word_embeddings), qk_norm=hf.model_type == "qwen3", **runtime)
    except (TypeError, ValueError) as e:
        raise UserError(f"{path}/config.json: {e}; download or export the model again") from None
    check_rope_positions(config, f"{path}/config.json", "max_position_embeddings")
    return config


def check_claims(directory, config):
    """config (from directory's config.json) against the names and shapes in its safetensors headers, on the
    meta device: nothing is loaded or built from a claimed size."""
    from nanogpt.checkpoint import check_shapes
    shapes = header_shapes(directory)
    if not shapes:
        raise UserError(f"{directory} has no model.safetensors; export it again")
    if config.tie_weights and "lm_head.weight" in shapes and shapes["lm_head.weight"] == shapes.get(
            "model.embed_tokens.weight"):
        del shapes["lm_head.weight"]  # a tied head saved twice: from_llama checks it is the same tensor
    state = {name: torch.empty(shape, device="meta") for name, shape in shapes.items()}
    check_shapes(config, state, directory, claims="config.json",
                 layout=lambda model: llama_state(model, qk_norm_gains=config.qk_norm))


def safetensors_state(directory):
    """Every tensor of directory's *.safetensors files (safetensors only: a pickle can run code)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file
    state = {}
    for file in sorted(f for f in os.listdir(directory) if f.endswith(".safetensors")):
        check_regular(os.path.join(directory, file))  # a FIFO would block safetensors' open forever
        try:
            state.update(load_file(os.path.join(directory, file)))
        except (SafetensorError, OSError) as e:
            raise UserError(f"{os.path.join(directory, file)} is not a readable safetensors file ({e}); "
                            f"export it again") from None
    if not state:
        raise UserError(f"{directory} has no model.safetensors; export it again")
    return state


def from_llama(directory, **runtime):
    """A GPT holding the weights of a Llama or Qwen3 directory (export.py's, or any that model.py computes
    exactly); runtime may set dropout and attn_impl."""
    import transformers  # ImportError: the caller says what to install

    from nanogpt.checkpoint import check_layer_count
    claims = read_config(directory, CONFIG_TYPES, positive=SIZES)
    if "num_hidden_layers" in claims:  # before transformers, which makes a list as long as the claim
        check_layer_count(claims["num_hidden_layers"], header_shapes(directory), directory, "config.json")
    try:
        hf_config = transformers.AutoConfig.from_pretrained(directory)
    except Exception as e:  # transformers' validation errors are classes of their own, over several lines
        raise UserError(f"{directory}/config.json cannot be read ({' '.join(str(e).split())[:300]}); download or "
                        f"export the model again") from None
    config = config_from_llama(hf_config, directory, runtime)
    check_claims(directory, config)
    state = safetensors_state(directory)
    if "lm_head.weight" in state and config.tie_weights:
        if not torch.equal(state.pop("lm_head.weight"), state["model.embed_tokens.weight"]):
            raise UserError(f"{directory}: config.json ties lm_head to embed_tokens but lm_head.weight differs; "
                            f"export it again")
    for i in range(config.n_layer):  # Qwen3's gains: ours are ones
        for name in ("q_norm", "k_norm"):
            gain = state.pop(f"model.layers.{i}.self_attn.{name}.weight", None)
            if gain is not None and not torch.equal(gain, torch.ones_like(gain)):
                raise UserError(f"{directory}: model.layers.{i}.self_attn.{name}.weight is not all ones; model.py's "
                                f"qk_norm has no gain and cannot compute this model")
    ours = our_state(state, config)
    model = GPT(config)
    model.load_state_dict(ours, strict=True)
    return model
