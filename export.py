"""Write a checkpoint as a Hugging Face directory (or a GGUF file) that the ecosystem runs.

    python export.py --out_dir=out-shakespeare-char --hf_dir=hf-shakespeare-char
    python export.py --out_dir=out-tangshi-sft --format=gguf --gguf_file=tangshi.gguf
    python export.py --out_dir=out-tangshi-sft --format=gguf --quantize=int8 --gguf_file=tangshi-q8_0.gguf

The architecture is the one that computes the model exactly: GPT-2's recipe (learned positions,
LayerNorm, GELU or ReLU) as GPT2LMHeadModel, RoPE + RMSNorm + SwiGLU (any kv heads, tied or not) as
LlamaForCausalLM, with qk_norm as Qwen3ForCausalLM; any other option is refused in one line naming it.
The directory holds the weights (model.safetensors, config.json), the tokenizer as Hugging Face's
(tokenizer.json, tokenizer_config.json: AutoTokenizer encodes as ours, a chat model's role tokens and
template included) and as ours (meta.json, a trained BPE's ranks), so `python sample.py --init_from=DIR`
reads it back. --format=gguf writes one file for llama.cpp and Ollama (GPT-2, Llama and Qwen3 models). docs/export.md
says how each goes to vLLM, llama.cpp, Ollama and the Hub.
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
from nanogpt.errors import UserError
from nanogpt.interop.hf import hf_architecture
from nanogpt.program import run_main
from nanogpt.source import Source, check_decodes, read_source
from nanogpt.tokenizer import tokenizer_from_meta, tokenizer_kind

FORMATS = ("hf", "gguf")
EXPORT_RANKS_FILE = "ranks.tiktoken"  # a trained BPE's merges, beside an export's meta.json (a dataset's: dataset.py)
# what an export writes: a directory holding only these is an earlier export, replaced whole
EXPORT_FILES = {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                "special_tokens_map.json", "chat_template.jinja", "meta.json", EXPORT_RANKS_FILE}


@dataclass
class ExportConfig(Source):
    format: str = "hf"  # "hf" (a Hugging Face directory) or "gguf" (one file, for llama.cpp and Ollama)
    hf_dir: str = ""  # --format=hf: the directory to write (new, empty, or an earlier export, replaced)
    gguf_file: str = ""  # --format=gguf: the file to write

    def __post_init__(self):
        super().__post_init__()
        if self.format not in FORMATS:
            raise ValueError(f"format must be one of {', '.join(FORMATS)}, got {self.format!r}")
        if self.quantize and self.format != "gguf":
            raise ValueError("--quantize=int8 writes GGUF's Q8_0 (--format=gguf); a Hugging Face directory holds the "
                             "float weights")


def check_target(cfg):
    """Refuse a target that is not ours to write: --hf_dir a file, or a directory holding other files (another
    model's, whose files would mix with ours); --gguf_file a directory."""
    if cfg.format == "gguf":
        if not cfg.gguf_file:
            raise UserError("say where to write the GGUF file: --gguf_file=FILE.gguf")
        if os.path.isdir(cfg.gguf_file):
            raise UserError(f"--gguf_file={cfg.gguf_file} is a directory; name the file to write")
        return
    if not cfg.hf_dir:
        raise UserError("say where to write the Hugging Face directory: --hf_dir=DIR")
    if os.path.exists(cfg.hf_dir) and not os.path.isdir(cfg.hf_dir):
        raise UserError(f"--hf_dir={cfg.hf_dir} is a file, not a directory; choose a directory to write the "
                        f"Hugging Face model into")
    others = sorted(set(os.listdir(cfg.hf_dir)) - EXPORT_FILES) if os.path.isdir(cfg.hf_dir) else []
    if others:
        raise UserError(f"--hf_dir={cfg.hf_dir} holds files export.py does not write ({', '.join(others[:3])}): another "
                        f"model's files would mix with this one's; choose a new or empty directory")


def write_our_tokenizer(meta, directory):
    """Our tokenizer's metadata as meta.json (and a trained BPE's ranks), read_meta's layout: --init_from=DIR
    decodes with it."""
    if tokenizer_kind(meta) == "gpt2" and not (meta or {}).get("chat"):
        return  # no metadata is GPT-2's BPE
    ranks, meta = meta.get("ranks_text"), {k: v for k, v in meta.items() if k != "ranks_text"}
    if tokenizer_kind(meta) == "char" and "chars" not in meta:  # a legacy meta.pkl's itos
        meta["chars"] = [meta.pop("itos")[i] for i in range(len(meta["itos"]))]
        meta.pop("stoi", None)
    if tokenizer_kind(meta) == "bpe":
        meta["ranks"] = EXPORT_RANKS_FILE
        with open(os.path.join(directory, EXPORT_RANKS_FILE), "w", encoding="ascii") as f:
            f.write(ranks)
    with open(os.path.join(directory, "meta.json"), "w", encoding="utf-8") as f:
        json.dump(meta, f, ensure_ascii=False)


def write_hf(model, tokenizer, meta, hf_dir, kind):
    """The Hugging Face directory, written beside hf_dir and renamed into place: an earlier export stays whole
    until this one is."""
    from nanogpt.interop.hf import to_hf
    from nanogpt.interop.hf_tokenizer import hf_tokenizer, stop_ids
    from nanogpt.interop.llama import to_llama
    stops = stop_ids(tokenizer)
    first = stops[0] if isinstance(stops, list) else stops
    hf = to_hf(model, first) if kind == "gpt2" else to_llama(model, kind, bos_token_id=first, eos_token_id=stops)
    hf.config.eos_token_id = hf.generation_config.eos_token_id = stops
    # a fresh name beside hf_dir: a fixed one could be a directory the user keeps
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(os.path.abspath(hf_dir))}.", suffix=".tmp",
                           dir=os.path.dirname(os.path.abspath(hf_dir)))
    try:
        hf.save_pretrained(tmp, safe_serialization=True)
        hf_tokenizer(tokenizer, model.config.block_size).save_pretrained(tmp)
        write_our_tokenizer(meta, tmp)
        if os.path.isdir(hf_dir):
            shutil.rmtree(hf_dir)  # only export.py's files (check_target)
        os.replace(tmp, hf_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv):
    cfg, _ = parse_args(ExportConfig, argv)
    check_target(cfg)
    model, meta, _ = read_source(cfg)  # the tokenizer's metadata: export writes it beside the weights
    kind = hf_architecture(model.config, cfg.path)
    tokenizer = tokenizer_from_meta(meta)
    check_decodes(tokenizer, model.config.vocab_size, cfg.path)
    try:
        if cfg.format == "gguf":
            from nanogpt.interop.gguf_file import write_gguf
            write_gguf(model, tokenizer, kind, cfg.gguf_file, cfg.path, cfg.quantize)
            print(f"wrote {cfg.gguf_file}: run it with llama.cpp (llama-cli -m {cfg.gguf_file}) or Ollama; see docs/export.md")
            return
        write_hf(model, tokenizer, meta, cfg.hf_dir, kind)
    except ImportError as e:
        raise UserError(f"export needs {e.name or e}: pip install -r requirements-dev.txt") from None
    arch = {"gpt2": "GPT2LMHeadModel", "llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM"}[kind]
    print(f"wrote {cfg.hf_dir}: a {arch}; load it with transformers.AutoModelForCausalLM.from_pretrained({cfg.hf_dir!r}) "
          f"and AutoTokenizer, or python sample.py --init_from={cfg.hf_dir}")


if __name__ == "__main__":
    run_main(main)
