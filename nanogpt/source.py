"""Where a script's model comes from, and the one loader of a model with its tokenizer.

A source is out_dir's checkpoint (init_from="resume") or GPT-2 weights (a GPT-2 name, a local Hugging
Face directory). Every script that reads a model (sample, serve, trace, export, chat, eval) extends
Source with its own keys and loads with load_model; what a file lacks or holds wrongly is one UserError.
"""
import os
from dataclasses import dataclass

from nanogpt.batches import dataset_dir
from nanogpt.checkpoint import is_pretrained, load_checkpoint, model_from_checkpoint
from nanogpt.errors import UserError
from nanogpt.hf import load_pretrained
from nanogpt.tokenizer import CharTokenizer, check_meta, read_meta, tokenizer_from_meta


@dataclass
class Source:
    # the model
    init_from: str = "resume"  # "resume" (out_dir's checkpoint) or GPT-2 weights: gpt2, ..., gpt2-xl, a local HF dir
    out_dir: str = "out"  # where train.py wrote the checkpoint
    ckpt: str = "ckpt.pt"  # ckpt.pt (latest) or best.pt (best val loss)

    def __post_init__(self):
        if self.init_from != "resume" and not is_pretrained(self.init_from):
            raise ValueError(f"init_from must be resume, gpt2, gpt2-medium, gpt2-large, gpt2-xl or a local "
                             f"Hugging Face GPT-2 directory, got {self.init_from!r}")

    @property
    def path(self):
        """The checkpoint file, or GPT-2's name or directory: what messages name."""
        return os.path.join(self.out_dir, self.ckpt) if self.init_from == "resume" else self.init_from


def load_model(source, device="cpu"):
    """The model (eval mode, on device) and tokenizer of a Source; a tokenizer that cannot decode every id the
    model can emit is refused."""
    model, meta = read_source(source, device)
    tokenizer = tokenizer_from_meta(meta)
    hint = (f"; copy the meta.json of the dataset it was trained on into {source.path} (export.py writes it)"
            if source.init_from != "resume" and os.path.isdir(source.path) else "")
    check_decodes(tokenizer, model.config.vocab_size, source.path, hint)
    return model.eval().to(device), tokenizer


def read_source(source, device="cpu"):
    """The model of a Source (dropout off) and its tokenizer's metadata: a checkpoint's own, else its dataset's;
    a directory export.py wrote holds it as meta.json; None is GPT-2 BPE."""
    path = source.path
    if source.init_from != "resume":
        return load_pretrained(path, dropout=0.0), read_meta(path) if os.path.isdir(path) else None
    ckpt = load_checkpoint(path, map_location=device)
    model = model_from_checkpoint(ckpt, path, dropout=0.0)
    meta = tokenizer_meta(ckpt, path)
    if meta is None and model.config.vocab_size < 50257:  # not a GPT-2 vocabulary: its own tokenizer is needed
        dataset = (ckpt.get("config") or {}).get("dataset")
        raise UserError(f"{path} was trained on dataset {dataset!r}, whose meta.json (or meta.pkl) is not "
                        f"found at {dataset_dir(dataset)}; re-run that dataset's prepare.py to decode its tokens")
    return model, meta


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
