"""Distillation: a model learns from the text and from trained models' predictions of it (train.py --teacher).

Each position's target is then two things: the next token (cross-entropy, as always) and the teachers' whole
next-token distribution, the mean of their probabilities (an ensemble's prediction). The loss is

    (1 - distill) * cross_entropy(student, next token) + distill * KL(teachers' mean || student)

averaged over positions. The KL term is zero when the student predicts what the teachers predict. On a small text
an ensemble of models trained on it predicts its val split better than any one of them (errors that differ
average out), and a model distilled from the ensemble keeps part of that in one checkpoint that sample.py reads
(docs/minutes.md, "More minutes than a text is worth").
"""
import math
import os

import torch
import torch.nn.functional as F

from nanogpt.checkpoint import checked_config, load_checkpoint, model_from_checkpoint
from nanogpt.device import autocast
from nanogpt.errors import UserError
from nanogpt.source import checkpoint_file


def teacher_paths(spec, out_dir, named_by=None):
    """The checkpoint files a --teacher value names (out_dirs or files, comma-separated), as absolute paths (a resume
    started elsewhere reads the same files), each checked to exist and to lie outside out_dir, whose checkpoints
    this run writes over (through links too). named_by: the checkpoint whose saved config gave spec (a resume)."""
    source = (f" (named by {named_by}'s config: --teacher=PATH points elsewhere, --teacher= goes on without)"
              if named_by else "")
    paths = []
    for name in (s.strip() for s in spec.split(",")):
        if not name:
            raise UserError(f"--teacher={spec!r} has an empty name; give checkpoints (out_dirs or files) separated by "
                            f"commas")
        path = checkpoint_file(name)
        if path is None:
            raise UserError(f"--teacher: no training checkpoint at {name} (an out_dir holding ckpt.pt, or the file); "
                            f"train the teacher first, or correct the path{source}")
        if os.path.dirname(os.path.realpath(path)) == os.path.realpath(out_dir):
            raise UserError(f"--teacher: {path} is in this run's out_dir ({out_dir}), whose checkpoints the run writes "
                            f"over; train into another --out_dir, or copy the teacher elsewhere{source}")
        paths.append(os.path.abspath(path))
    return paths


def read_teachers(paths):
    """(path, checkpoint, config) of each teacher file, read once and its model_args checked against its weights
    (checked_config): the memory checks and the plan take their shapes, Teachers.load their weights."""
    teachers = []
    for path in paths:
        ckpt = load_checkpoint(path)
        teachers.append((path, ckpt, checked_config(ckpt, path, dropout=0.0)[0]))
    return teachers


def mean_probs(logits):
    """The mean of the models' next-token probabilities (an ensemble's prediction), from each model's logits
    (..., V), in float32, added one model at a time (one buffer of their shape, not a stack)."""
    total = None
    for t in logits:
        p = F.softmax(t.float(), -1)
        total = p if total is None else total.add_(p)
    return total.div_(len(logits))


def log_mean_probs(logits):
    """The log of mean_probs(logits), summed in logs (a probability that underflows to 0 stays finite): as logits,
    its softmax is that mean itself."""
    total = None
    for t in logits:
        logp = F.log_softmax(t.float(), -1)
        total = logp if total is None else torch.logaddexp(total, logp)
    return total - math.log(len(logits))


def distill_loss(logits, ce, teacher_logits, weight, targets=None):
    """(1 - weight) * ce + weight * the mean over positions of KL(mean of the teachers' distributions || the
    student's), from logits (B, T, V) and each teacher's (B, T, V); ce: the student's cross-entropy. targets (B, T):
    the positions whose target is -1 (a chat dataset's prompts, which the text's loss skips) are skipped here too."""
    with torch.no_grad():
        mean = mean_probs(teacher_logits).flatten(0, -2)
    student = logits.flatten(0, -2)
    if targets is not None and (targets == -1).any():
        keep = targets.reshape(-1) != -1
        student, mean = student[keep], mean[keep]
    # KL(p || q) = sum p log p - sum p log q: the teachers' entropy (no gradient) less a cross-entropy to soft
    # targets, which one fused kernel computes from the student's logits (its gradient: softmax(logits) - p);
    # summed over the vocabulary, averaged over the positions kept (none kept: nothing to learn from them)
    n = max(1, student.size(0))
    with torch.no_grad():
        entropy = torch.special.entr(mean).sum() / n
    soft = F.cross_entropy(student.float(), mean, reduction="sum") / n if student.size(0) else student.sum() * 0
    return (1 - weight) * ce + weight * (soft - entropy)


def teacher_context(device, dtype, kernels):
    """The autocast the teachers' forward passes run in: on a CPU whose training products are bfloat16, theirs are
    too (a forward pass without gradients does not go through the training kernels)."""
    return autocast(device, kernels.dtype) if kernels.dtype == torch.bfloat16 else autocast(device, dtype)


SAME_DATASET = "a teacher must be trained on this dataset (or one of its tokenizer)"


class Teachers:
    """The frozen models a run distills from, on its device, with the products training uses."""

    def __init__(self, models, weight, ctx):
        self.models, self.weight, self.ctx = models, weight, ctx

    @classmethod
    def load(cls, ckpts, weight, tokenizer_meta, data_dir, vocab_size, block_size, device, dtype, kernels, log,
             same_tokenizer):
        """The teachers of ckpts, read_teachers' (path, checkpoint, config); each must read the dataset's tokens (its
        tokenizer, and the vocabulary of the run's model: vocab_size) and see at least block_size tokens of context.
        same_tokenizer: startup's check_same_tokenizer."""
        models = []
        for path, ckpt, _ in ckpts:
            same_tokenizer(ckpt.get("tokenizer"), tokenizer_meta, path, data_dir, log, advice=SAME_DATASET)
            model = model_from_checkpoint(ckpt, path, dropout=0.0)
            if model.config.vocab_size != vocab_size:
                raise UserError(f"--teacher: {path} predicts {model.config.vocab_size:,} tokens but this run's model "
                                f"{vocab_size:,}; {SAME_DATASET}")
            if model.config.block_size < block_size:
                raise UserError(f"--teacher: {path} sees {model.config.block_size} tokens of context, fewer than this "
                                f"run's block_size ({block_size}); use --block_size={model.config.block_size}")
            model.to(device).eval().requires_grad_(False)
            models.append(model)
            log(f"teacher: {path} ({model.get_num_params() / 1e6:.2f}M parameters)")
        ctx = teacher_context(device, dtype, kernels)
        log(f"distilling: {1 - weight:g} of the loss from the text, {weight:g} from "
            + (f"the mean of {len(models)} teachers' predictions" if len(models) > 1 else "its teacher's predictions"))
        return cls(models, weight, ctx)

    def loss(self, x, y, logits, ce):
        """The distilled loss of a micro-batch (x, y), given the student's logits and cross-entropy on it."""
        with torch.no_grad(), self.ctx:
            taught = [model(x)[0] for model in self.models]
        return distill_loss(logits, ce, taught, self.weight, y)
