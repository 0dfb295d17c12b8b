"""Write a checkpoint as a Hugging Face GPT-2 directory (model.safetensors + config.json).

    python export.py --out_dir=out-shakespeare-char --hf_dir=hf-shakespeare-char

GPT2LMHeadModel.from_pretrained(hf_dir) then gives the same logits. Only the
GPT-2 architecture exports (learned positions, LayerNorm, GELU or ReLU, as many
kv heads as heads); a bias-free model exports with zero biases. GPT-2 BPE models
use Hugging Face's "gpt2" tokenizer; a model with a tokenizer of its own (characters,
a trained BPE) gets its meta.json (and BPE merges) beside the weights, as a dataset
holds them, so that `python sample.py --init_from=hf_dir` decodes its tokens.
"""
from nanogpt import program

program.exit_quietly_on_ctrl_c()  # before the slow imports (torch): Ctrl-C during them exits quietly

# ruff: noqa: E402
import json
import os
import shutil
import tempfile
from dataclasses import dataclass

from configurator import parse_args

from nanogpt.program import run_main
from nanogpt.errors import UserError
from nanogpt.hf import GPT2_EOT, incompatibilities, to_hf
from nanogpt.source import Source, read_source
from nanogpt.tokenizer import tokenizer_kind


@dataclass
class ExportConfig(Source):
    hf_dir: str = ""  # where to write the Hugging Face directory


def end_of_text(meta, vocab_size):
    """The end-of-text id of the checkpoint's tokenizer, or None where it has none (characters)."""
    if tokenizer_kind(meta) == "gpt2" and vocab_size > GPT2_EOT:
        return GPT2_EOT
    if tokenizer_kind(meta) == "bpe":
        eot = (meta.get("special_tokens") or {}).get("<|endoftext|>")
        return eot if isinstance(eot, int) and 0 <= eot < vocab_size else None
    return None


def write_tokenizer(meta, hf_dir):
    """A tokenizer of the model's own as a dataset's meta.json (and ranks file) in hf_dir: read_meta(hf_dir)
    then rebuilds it. GPT-2 BPE (meta None or "gpt2") needs nothing written."""
    kind = tokenizer_kind(meta)
    if kind == "gpt2":
        return
    if kind == "char":  # chars, also from a legacy meta.pkl's itos
        chars = meta.get("chars") or [meta["itos"][i] for i in range(len(meta["itos"]))]
        meta = {"tokenizer": "char", "chars": chars, "vocab_size": len(chars)}
    else:
        meta = dict(meta)
        with open(os.path.join(hf_dir, meta["ranks"]), "w", encoding="ascii") as f:
            f.write(meta.pop("ranks_text"))
    with open(os.path.join(hf_dir, "meta.json"), "w", encoding="utf-8") as f:
        json.dump(meta, f, ensure_ascii=False)


def write_export(hf, meta, hf_dir):
    """The model and tokenizer files in hf_dir, written into a new directory inside it and renamed into place:
    a rename replaces a link planted at a file's name instead of writing through it."""
    os.makedirs(hf_dir, exist_ok=True)
    tmp = tempfile.mkdtemp(dir=hf_dir, prefix=".export.")
    try:
        hf.save_pretrained(tmp, safe_serialization=True)
        write_tokenizer(meta, tmp)
        for name in sorted(os.listdir(tmp)):
            os.replace(os.path.join(tmp, name), os.path.join(hf_dir, name))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv):
    cfg, _ = parse_args(ExportConfig, argv)
    if not cfg.hf_dir:
        raise UserError("say where to write the Hugging Face directory: --hf_dir=DIR")
    if os.path.exists(cfg.hf_dir) and not os.path.isdir(cfg.hf_dir):
        raise UserError(f"--hf_dir={cfg.hf_dir} is a file, not a directory; choose a directory to write the "
                        f"Hugging Face model into")
    model, meta = read_source(cfg)  # the tokenizer's metadata: export writes it beside the weights
    reasons = incompatibilities(model.config)
    if reasons:
        raise UserError(f"{cfg.path} is not a GPT-2 architecture ({', '.join(reasons)}); only GPT-2-style models "
                        f"export to Hugging Face's GPT2LMHeadModel")
    try:
        hf = to_hf(model, end_of_text(meta, model.config.vocab_size))
    except ImportError as e:
        raise UserError(f"export needs transformers: {e}") from None
    write_export(hf, meta, cfg.hf_dir)
    print(f"wrote {cfg.hf_dir}: load it with transformers.GPT2LMHeadModel.from_pretrained({cfg.hf_dir!r})")


if __name__ == "__main__":
    run_main(main)
