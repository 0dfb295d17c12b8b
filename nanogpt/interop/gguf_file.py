"""A model and its tokenizer as one GGUF file (llama.cpp's format, written by its own `gguf` package), for
llama.cpp and Ollama. GPT-2, Llama and Qwen3 models; float32 weights, or (quantize="int8") the linear layers as
Q8_0 holding exactly quantize.py's int8 rows.

Rules the tensor names do not show:
- GPT-2's weights are ours as they are (out, in): llama.cpp's gpt2 reads q, k and v as one matrix (attn_qkv),
  and a model without biases gets biases of zero. Its GELU is the tanh form, computed through a float16
  table: a model trained with the exact (erf) GELU runs within about 1e-3 of ours, not exactly.
- RoPE's pairing: llama.cpp's llama rotates pairs (2i, 2i+1), as model.py does: q and k as ours are.
  Its qwen3 rotates halves (i, i + head_dim/2), as Hugging Face's: q and k reordered (llama.to_halves).
- The tokenizer is llama.cpp's byte-level BPE ("gpt2"): tokens spelled in GPT-2's byte alphabet, the merges
  in rank order, and the split pattern named by llama.cpp's name for it (tokenizer.ggml.pre). A
  character vocabulary is such a BPE too: each character's bytes merge into it (its prefixes, in turn).
  Role tokens are control tokens; the chat template goes in as Jinja.
"""
import os

import numpy as np
import torch

from nanogpt.errors import UserError
from nanogpt.interop.hf_tokenizer import bpe_merges, byte_chars
from nanogpt.interop.llama import to_halves
from nanogpt.tokenizer import GPT2BPE, CharTokenizer, ChatTokenizer

# a trained BPE's split pattern -> llama.cpp's name for it (the pre-tokenizers it implements)
GPT4_PATTERN = r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+"""
PRE_TOKENIZERS = {GPT4_PATTERN: "llama-bpe"}  # a trained BPE's (rustbpe's): llama.cpp's llama-bpe (Llama 3's)


def char_merges(chars, spelled):
    """A character vocabulary as byte-level BPE merges: each multi-byte character's bytes joined in turn
    (b1 + b2, then b1b2 + b3, ...). Merges only ever extend a character from its first byte, so no two
    characters merge into one."""
    merges, seen = [], set()
    for c in chars:
        data = c.encode("utf-8")
        for i in range(1, len(data)):
            pair = (spelled(data[:i]), spelled(data[i:i + 1]))
            if pair not in seen:
                seen.add(pair)
                merges.append(pair)
    return merges


def vocabulary(tokenizer, vocab_size):
    """(tokens, token types, merges, pre-tokenizer name) of tokenizer for a model of vocab_size ids; ids no
    text has (padding) are unused tokens."""
    import gguf
    chars = byte_chars()

    def spelled(data):
        return "".join(chars[b] for b in data)
    base = tokenizer.base if isinstance(tokenizer, ChatTokenizer) else tokenizer
    tokens = [f"[PAD{i}]" for i in range(vocab_size)]
    types = [gguf.TokenType.UNUSED] * vocab_size
    if isinstance(base, CharTokenizer):
        for i, c in enumerate(base.chars):
            tokens[i], types[i] = spelled(c.encode("utf-8")), gguf.TokenType.NORMAL
        merges, pre = char_merges(base.chars, spelled), "gpt-2"  # every pattern splits between characters
    else:
        pattern = base.enc._pat_str
        if not isinstance(base, GPT2BPE) and pattern not in PRE_TOKENIZERS:
            raise UserError(f"the BPE's split pattern {pattern!r} is not one llama.cpp implements "
                            f"({', '.join(PRE_TOKENIZERS.values())}); export with --format=hf")
        for token, rank in base.enc._mergeable_ranks.items():
            tokens[rank], types[rank] = spelled(token), gguf.TokenType.NORMAL
        for name, i in base.enc._special_tokens.items():
            tokens[i], types[i] = name, gguf.TokenType.CONTROL
        merges = [(spelled(a), spelled(b)) for a, b in bpe_merges(base.enc._mergeable_ranks)]
        pre = "gpt-2" if isinstance(base, GPT2BPE) else PRE_TOKENIZERS[pattern]  # GPT-2's is tiktoken's r50k_base
    if isinstance(tokenizer, ChatTokenizer):
        for name, i in tokenizer.ids.items():
            tokens[i], types[i] = name, gguf.TokenType.CONTROL
    check_spellings(tokens)
    if not merges:  # llama.cpp needs some (an ASCII vocabulary has none): one no UTF-8 text holds, bytes 0xFE 0xFF
        merges = [(spelled(b"\xfe"), spelled(b"\xff"))]
    return tokens, types, [f"{a} {b}" for a, b in merges], pre


def check_spellings(tokens):
    """llama.cpp aborts loading a vocabulary in which two tokens are spelled alike (one text, one id): such a one
    (a ranks file holding a role token's name) is refused here, in one line."""
    first = {}
    for i, token in enumerate(tokens):
        if first.setdefault(token, i) != i:
            raise UserError(f"tokens {first[token]} and {i} are both {token!r}: llama.cpp cannot load a vocabulary "
                            f"with two tokens of one spelling; re-run the dataset's prepare.py")


def gpt2_tensors(model):
    """(GGUF name, tensor) of each weight of a GPT-2-style model, for llama.cpp's gpt2: a bias of zeros where the
    model has none."""
    c, ours = model.config, {k: v.detach().float().cpu() for k, v in model.state_dict().items()}

    def bias(name, size):
        return ours.get(name, torch.zeros(size))
    out = {"token_embd.weight": ours["transformer.wte.weight"], "position_embd.weight": ours["transformer.wpe.weight"],
           "output_norm.weight": ours["transformer.ln_f.weight"],
           "output_norm.bias": bias("transformer.ln_f.bias", c.n_embd)}
    if not c.tie_weights:
        out["output.weight"] = ours["lm_head.weight"]
    names = {"attn_norm": "ln_1", "attn_qkv": "attn.c_attn", "attn_output": "attn.c_proj", "ffn_norm": "ln_2",
             "ffn_up": "mlp.c_fc", "ffn_down": "mlp.c_proj"}
    for i in range(c.n_layer):
        for theirs, mine in names.items():
            weight = ours[f"transformer.h.{i}.{mine}.weight"]
            out[f"blk.{i}.{theirs}.weight"] = weight
            out[f"blk.{i}.{theirs}.bias"] = bias(f"transformer.h.{i}.{mine}.bias", weight.size(0))
    return out


def tensors(model, kind):
    """(GGUF name, float32 array) of each weight of model, for llama.cpp's gpt2, llama or qwen3."""
    if kind == "gpt2":
        return {name: np.ascontiguousarray(t.numpy(), dtype=np.float32) for name, t in gpt2_tensors(model).items()}
    c, ours = model.config, {k: v.detach().float().cpu() for k, v in model.state_dict().items()}
    q_dim, kv_dim = c.n_head * c.head_dim, c.kv_heads * c.head_dim
    out = {"token_embd.weight": ours["transformer.wte.weight"], "output_norm.weight": ours["transformer.ln_f.weight"]}
    if not c.tie_weights:
        out["output.weight"] = ours["lm_head.weight"]
    reorder = (lambda t, n: to_halves(t, n)) if kind == "qwen3" else (lambda t, n: t)
    for i in range(c.n_layer):
        mine, blk = f"transformer.h.{i}.", f"blk.{i}."
        out[blk + "attn_norm.weight"] = ours[mine + "ln_1.weight"]
        out[blk + "ffn_norm.weight"] = ours[mine + "ln_2.weight"]
        for kind_ in ("weight", "bias"):
            if mine + "attn.c_attn." + kind_ not in ours:
                continue
            q, k, v = ours[mine + "attn.c_attn." + kind_].split([q_dim, kv_dim, kv_dim])
            gate, up = ours[mine + "mlp.c_fc." + kind_].chunk(2)
            out.update({blk + "attn_q." + kind_: reorder(q, c.n_head), blk + "attn_k." + kind_: reorder(k, c.kv_heads),
                        blk + "attn_v." + kind_: v, blk + "attn_output." + kind_: ours[mine + "attn.c_proj." + kind_],
                        blk + "ffn_gate." + kind_: gate, blk + "ffn_up." + kind_: up,
                        blk + "ffn_down." + kind_: ours[mine + "mlp.c_proj." + kind_]})
        if kind == "qwen3":
            out[blk + "attn_q_norm.weight"] = out[blk + "attn_k_norm.weight"] = np.ones(c.head_dim, dtype=np.float32)
    return {name: np.ascontiguousarray(np.asarray(t, dtype=np.float32)) for name, t in out.items()}


# the GGUF names of the tensors that are linear layers in model.py: the ones --quantize=int8 writes as Q8_0
LINEAR_TENSORS = ("attn_qkv", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_up", "ffn_gate", "ffn_down")
Q8_0_BLOCK = 32  # values per Q8_0 block, each block a float16 scale and 32 int8


def is_linear(name):
    return name == "output.weight" or name.endswith(".weight") and name.split(".")[-2] in LINEAR_TENSORS


def q8_0(array):
    """A float32 matrix (rows, k) as Q8_0's bytes (rows, k / 32 * 34): quantize.int8_rows's numbers, every block
    of a row scaled by that row's scale (a float16 that holds it exactly)."""
    from nanogpt.quantize import int8_rows
    q, scale = int8_rows(torch.from_numpy(array))
    rows, k = q.shape
    d = scale.numpy().astype(np.float16).view(np.uint8).reshape(rows, 1, 2)
    blocks = q.numpy().view(np.uint8).reshape(rows, k // Q8_0_BLOCK, Q8_0_BLOCK)
    return np.concatenate([np.broadcast_to(d, (rows, k // Q8_0_BLOCK, 2)), blocks], axis=2).reshape(rows, -1)


def bf16(array):
    """A float32 matrix (rows, k) as BF16's bytes (rows, 2k): rounded as torch's .bfloat16() rounds (to nearest
    even), the weights generation reads under bfloat16 autocast."""
    return torch.from_numpy(array).bfloat16().view(torch.int16).numpy().view(np.uint8)


def write_gguf(model, tokenizer, kind, path, source, quantize=None):
    """model (of Hugging Face model_type kind) and tokenizer as the GGUF file path, written beside it and renamed
    into place; quantize "int8": the linear layers as Q8_0, "bfloat16" (bench.py's comparison): as BF16; "" or None:
    float32."""
    import gguf
    c = model.config
    if quantize == "int8" and (c.n_embd % Q8_0_BLOCK or c.mlp_width % Q8_0_BLOCK):
        raise UserError(f"{source} has n_embd={c.n_embd} and an MLP {c.mlp_width} wide: Q8_0 needs rows of a "
                        f"multiple of {Q8_0_BLOCK} values; export it without --quantize")
    if kind == "gpt2" and c.activation not in ("gelu", "gelu_tanh"):
        raise UserError(f"{source} has activation={c.activation}: llama.cpp's gpt2 computes GELU only; export it with "
                        f"--format=hf, or train with --activation=gelu")
    if kind != "gpt2" and c.bias:
        raise UserError(f"{source} has biases (bias=True): llama.cpp's llama has no MLP biases; train with "
                        f"--bias=False, or export with --format=hf")
    tokens, types, merges, pre = vocabulary(tokenizer, c.vocab_size)
    tmp = os.path.join(os.path.dirname(os.path.abspath(path)), f".{os.path.basename(path)}.tmp")
    writer = gguf.GGUFWriter(tmp, kind)
    writer.add_name(os.path.basename(path).removesuffix(".gguf"))
    writer.add_context_length(c.block_size)
    writer.add_embedding_length(c.n_embd)
    writer.add_block_count(c.n_layer)
    writer.add_feed_forward_length(c.mlp_width)
    writer.add_head_count(c.n_head)
    writer.add_head_count_kv(c.kv_heads)
    if kind == "gpt2":
        writer.add_layer_norm_eps(c.norm_eps)
    else:
        writer.add_key_length(c.head_dim)
        writer.add_value_length(c.head_dim)
        writer.add_rope_dimension_count(c.head_dim)
        writer.add_rope_freq_base(c.rope_base)
        writer.add_layer_norm_rms_eps(c.norm_eps)
    writer.add_file_type({None: gguf.LlamaFileType.ALL_F32, "int8": gguf.LlamaFileType.MOSTLY_Q8_0,
                          "bfloat16": gguf.LlamaFileType.MOSTLY_BF16}[quantize or None])
    writer.add_vocab_size(c.vocab_size)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_add_bos_token(False)
    if isinstance(tokenizer, ChatTokenizer):
        writer.add_bos_token_id(tokenizer.end)
        writer.add_eos_token_id(tokenizer.end)
        writer.add_eot_token_id(tokenizer.end)
        writer.add_chat_template(tokenizer.chat_template())
    elif tokenizer.eot is not None:
        writer.add_bos_token_id(tokenizer.eot)
        writer.add_eos_token_id(tokenizer.eot)
    arrays = tensors(model, kind)
    if quantize and "output.weight" not in arrays:  # tied: token_embd stays float32, the output layer is int8
        arrays["output.weight"] = arrays["token_embd.weight"]
    for name, array in arrays.items():
        if quantize == "int8" and is_linear(name):
            writer.add_tensor(name, q8_0(array), raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        elif quantize == "bfloat16" and is_linear(name):
            writer.add_tensor(name, bf16(array), raw_dtype=gguf.GGMLQuantizationType.BF16)
        else:
            writer.add_tensor(name, array)
    try:
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
