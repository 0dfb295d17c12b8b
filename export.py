"""Write a checkpoint as a Hugging Face GPT-2 directory (model.safetensors + config.json).

    python export.py --out_dir=out-shakespeare-char --hf_dir=hf-shakespeare-char

GPT2LMHeadModel.from_pretrained(hf_dir) then gives the same logits. Only the
GPT-2 architecture exports (learned positions, LayerNorm, GELU or ReLU, as many
kv heads as heads); a bias-free model exports with zero biases. The tokenizer is
not written: GPT-2 BPE models use Hugging Face's "gpt2" tokenizer, char models
decode with their dataset's meta.json.
"""
import os
from dataclasses import dataclass

import torch

from batches import dataset_dir
from checkpoint import load_checkpoint, model_from_checkpoint
from configurator import UserError, parse_args, run_main
from model import HF_CONV1D
from tokenizer import read_meta, tokenizer_kind

GPT2_EOT = 50256  # <|endoftext|> in GPT-2's BPE

HF_ACTIVATIONS = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu"}


@dataclass
class ExportConfig:
    out_dir: str = "out"
    ckpt: str = "ckpt.pt"
    hf_dir: str = ""  # where to write the Hugging Face directory


def gpt2_incompatibilities(config):
    """Why a model cannot be a Hugging Face GPT2LMHeadModel (empty when it can)."""
    reasons = []
    if config.pos_emb != "learned":
        reasons.append(f"pos_emb={config.pos_emb}")
    if config.norm != "layernorm":
        reasons.append(f"norm={config.norm}")
    if config.activation not in HF_ACTIVATIONS:
        reasons.append(f"activation={config.activation}")
    if config.kv_heads != config.n_head:
        reasons.append(f"n_kv_head={config.n_kv_head}")
    return reasons


def end_of_text(ckpt, vocab_size):
    """The end-of-text id of the checkpoint's tokenizer, or None where it has none (characters)."""
    dataset = (ckpt.get("config") or {}).get("dataset")
    meta = read_meta(dataset_dir(dataset)) if dataset else None
    if tokenizer_kind(meta) == "gpt2" and vocab_size > GPT2_EOT:
        return GPT2_EOT
    return None


def to_hf(model, eot_token=None):
    """A transformers GPT2LMHeadModel holding model's weights.

    eot_token: the tokenizer's end-of-text id, written as bos/eos_token_id (None
    for vocabularies without one, such as characters).
    """
    try:
        from transformers import GPT2Config, GPT2LMHeadModel
    except ImportError:
        raise UserError("export needs transformers: pip install transformers") from None
    c = model.config
    hf_config = GPT2Config(vocab_size=c.vocab_size, n_positions=c.block_size, n_embd=c.n_embd, n_layer=c.n_layer,
                           n_head=c.n_head, n_inner=c.hidden, activation_function=HF_ACTIVATIONS[c.activation],
                           layer_norm_epsilon=c.norm_eps, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                           tie_word_embeddings=c.tie_weights, bos_token_id=eot_token, eos_token_id=eot_token)
    hf = GPT2LMHeadModel(hf_config).eval()
    ours = model.state_dict()
    buffers = {name for name, _ in hf.named_buffers()}  # causal-mask buffers of older transformers versions
    with torch.no_grad():
        for name, p in hf.state_dict().items():
            if name in buffers:
                continue
            if name not in ours:
                p.zero_()  # a bias-free model: zero biases compute the same
                continue
            w = ours[name]
            p.copy_(w.t() if name.endswith(HF_CONV1D) else w)
    return hf


def main(argv):
    cfg, _ = parse_args(ExportConfig, argv)
    if not cfg.hf_dir:
        raise UserError("say where to write the Hugging Face directory: --hf_dir=DIR")
    path = os.path.join(cfg.out_dir, cfg.ckpt)
    ckpt = load_checkpoint(path)
    model = model_from_checkpoint(ckpt, path)
    reasons = gpt2_incompatibilities(model.config)
    if reasons:
        raise UserError(f"{path} is not a GPT-2 architecture ({', '.join(reasons)}); only GPT-2-style models export "
                        f"to Hugging Face's GPT2LMHeadModel")
    to_hf(model, end_of_text(ckpt, model.config.vocab_size)).save_pretrained(cfg.hf_dir, safe_serialization=True)
    print(f"wrote {cfg.hf_dir}: load it with transformers.GPT2LMHeadModel.from_pretrained({cfg.hf_dir!r})")


if __name__ == "__main__":
    run_main(main)
