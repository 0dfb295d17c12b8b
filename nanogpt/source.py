"""Where a program's model comes from: one reading of init_from for every program, and the one loader of a
model with its tokenizer.

init_from means the same in train, sample, chat, serve, eval, trace, export and rl:
- "resume": out_dir's own checkpoint (train.py and rl.py continue it; the readers read it);
- a checkpoint: an out_dir holding ckpt.pt (or ckpt.dcp), or the file (train.py fine-tunes it, rl.py starts
  from it, the readers read it);
- pretrained weights: gpt2, gpt2-medium, gpt2-large, gpt2-xl, or a local Hugging Face directory;
- "scratch": a new model (train.py only).
Every program that reads a model extends Source with its own keys and loads with load_model; what a file
lacks or holds wrongly is one UserError.
"""
import os
from dataclasses import dataclass

from nanogpt.checkpoint import GPT2_NAMES, load_checkpoint, model_from_checkpoint
from nanogpt.dataset import dataset_dir
from nanogpt.errors import UserError
from nanogpt.interop.hf import load_pretrained
from nanogpt.out_dir import latest_form
from nanogpt.quantize import check_quantize, quantize
from nanogpt.tokenizer import CharTokenizer, check_meta, read_meta, tokenizer_from_meta


# what each kind of init_from is, in the words every program's message uses
KINDS = {"scratch": "scratch (a new model)",
         "resume": "resume (out_dir's checkpoint)",
         "checkpoint": "a checkpoint (an out_dir holding ckpt.pt, or the file)",
         "pretrained": "gpt2, gpt2-medium, gpt2-large, gpt2-xl or a local Hugging Face directory"}


def init_from_kind(init_from):
    """Which of KINDS init_from names; None where it names nothing that exists."""
    if init_from in ("scratch", "resume"):
        return init_from
    if is_pretrained(init_from):
        return "pretrained"
    return "checkpoint" if checkpoint_file(init_from) is not None else None


def check_init_from(init_from, accepted):
    """init_from's kind, or a ValueError that lists the kinds this program accepts."""
    kind = init_from_kind(init_from)
    if kind not in accepted:
        forms = [KINDS[k] for k in accepted]
        raise ValueError(f"init_from must be {', '.join(forms[:-1])} or {forms[-1]}, got {init_from!r}"
                         + ("" if kind is not None else " (no such checkpoint or directory)"))
    return kind


def checkpoint_file(init_from, name="ckpt.pt"):
    """The checkpoint init_from names (a training checkpoint file, or an out_dir holding name or its sharded
    form); None for the other kinds and for what does not exist."""
    if init_from in ("scratch", "resume") or is_pretrained(init_from):
        return None
    if os.path.isdir(init_from):
        path = os.path.join(init_from, name)
        return path if os.path.exists(latest_form(path)) else None
    return init_from if os.path.isfile(init_from) else None


def is_pretrained(init_from):
    """True for a GPT-2 name or a local Hugging Face directory."""
    return init_from in GPT2_NAMES or os.path.exists(os.path.join(init_from, "config.json"))  # a FIFO: hf.py says so


@dataclass
class Source:
    # the model
    init_from: str = "resume"  # resume (out_dir's checkpoint), a checkpoint (an out_dir or file), or gpt2, ..., a local HF dir
    out_dir: str = "out"  # where train.py wrote the checkpoint
    ckpt: str = "ckpt.pt"  # ckpt.pt (latest) or best.pt (best val loss)
    quantize: str = ""  # int8: the linear layers' weights as int8 rows, a quarter of the bytes (docs/generation.md)

    def __post_init__(self):
        check_init_from(self.init_from, ("resume", "checkpoint", "pretrained"))
        check_quantize(self.quantize)

    @property
    def kind(self):
        return init_from_kind(self.init_from)

    @property
    def path(self):
        """The checkpoint file, or GPT-2's name or directory: what messages name."""
        if self.init_from == "resume":
            return os.path.join(self.out_dir, self.ckpt)
        return os.path.join(self.init_from, self.ckpt) if self.kind == "checkpoint" and os.path.isdir(
            self.init_from) else self.init_from


def load_model(source, device="cpu"):
    """The model (eval mode, on device) and tokenizer of a Source; a tokenizer that cannot decode every id the
    model can emit is refused."""
    return load_trained(source, device)[:2]


def load_trained(source, device="cpu"):
    """load_model's model and tokenizer, and the directory of the dataset the checkpoint was trained on (None
    where it names none: GPT-2, a Hugging Face directory): where --copies looks for what it copied."""
    model, meta, dataset = read_source(source, device)
    tokenizer = tokenizer_from_meta(meta)
    hint = (f"; copy the meta.json of the dataset it was trained on into {source.path} (export.py writes it)"
            if source.kind == "pretrained" and os.path.isdir(source.path) else "")
    check_decodes(tokenizer, model.config.vocab_size, source.path, hint)
    return quantize(model.eval().to(device), source.quantize), tokenizer, dataset


def read_source(source, device="cpu"):
    """The model of a Source (dropout off), its tokenizer's metadata (a checkpoint's own, else its dataset's; a
    directory export.py wrote holds it as meta.json; None is GPT-2 BPE) and its dataset's directory (or None)."""
    path = source.path
    if source.kind == "pretrained":
        return load_pretrained(path, dropout=0.0), read_meta(path) if os.path.isdir(path) else None, None
    ckpt = load_checkpoint(path, map_location=device)
    model = model_from_checkpoint(ckpt, path, dropout=0.0)
    meta = tokenizer_meta(ckpt, path)
    dataset = (ckpt.get("config") or {}).get("dataset")
    if meta is None and model.config.vocab_size < 50257:  # not a GPT-2 vocabulary: its own tokenizer is needed
        raise UserError(f"{path} was trained on dataset {dataset!r}, whose meta.json (or meta.pkl) is not "
                        f"found at {dataset_dir(dataset)}; re-run that dataset's prepare.py to decode its tokens")
    return model, meta, dataset_dir(dataset) if isinstance(dataset, str) and dataset else None


def tokenizer_meta(ckpt, path):
    """The metadata of a checkpoint's tokenizer: carried in the checkpoint, or (older and nanoGPT
    checkpoints) its dataset's; None where neither has one (GPT-2 BPE)."""
    if ckpt.get("tokenizer") is not None:
        return check_meta(ckpt["tokenizer"], f"{path}: its tokenizer")
    dataset = (ckpt.get("config") or {}).get("dataset")
    return read_meta(dataset_dir(dataset)) if dataset else None


def check_decodes(tokenizer, vocab_size, path, hint=""):
    """Refuse a tokenizer that cannot decode every id below the model's vocab_size (all of which it can emit),
    or that has ids the model has not. A BPE decodes the ids past its own as nothing, for GPT-2's 50,257
    tokens padded to 50,304 in nanoGPT's models; a char tokenizer has no padding, as train.py demands."""
    short = isinstance(getattr(tokenizer, "base", tokenizer), CharTokenizer) and tokenizer.vocab_size < vocab_size
    if short or tokenizer.vocab_size > vocab_size:
        raise UserError(f"{path} has a vocabulary of {vocab_size} tokens but its tokenizer has "
                        f"{tokenizer.vocab_size}; sample with the tokenizer (dataset) it was trained on{hint}")
