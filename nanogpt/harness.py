"""lm-evaluation-harness's model "nanogpt": a checkpoint of this repository scored in process, no server.

    from nanogpt.harness import NanoGPT; lm_eval.simple_evaluate(NanoGPT(out_dir="out-tangshi"), tasks=[...])

The three request types, with the semantics of lm-eval's Hugging Face model:
loglikelihood sums the log-probabilities of the continuation's tokens given the
context (context and continuation tokenized as lm-eval's TemplateLM does) and says
whether greedy decoding would have written it; loglikelihood_rolling scores a
whole text in windows of block_size tokens, each token predicted once, the first
one after a prefix token; generate_until decodes with the KV cache (generate.py)
until a stop string. Inputs longer than block_size keep their last block_size
tokens. Requests are sorted by length (longest first) and run several to a forward.
"""
import logging
import os
import zlib

import torch
import torch.nn.functional as F
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.models.utils import Collator, handle_stop_sequences, normalize_gen_kwargs
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

from nanogpt.errors import UserError, nearest
from nanogpt.generate import GREEDY_RUN, Continuation, continue_rows, stream
from nanogpt.source import Source, load_model

MAX_GEN_TOKS = 256  # lm-eval's default when a task names no max_gen_toks


@register_model("nanogpt")
class NanoGPT(TemplateLM):
    """A GPT of model.py and its tokenizer, as lm-eval's LM: give model and tokenizer, or out_dir (or
    init_from=gpt2...); by name, simple_evaluate(model="nanogpt", model_args={"out_dir": DIR}) once this
    module is imported."""

    def __init__(self, model=None, tokenizer=None, out_dir="out", ckpt="ckpt.pt", device="cpu", batch_size=16,
                 init_from="resume"):
        super().__init__()
        if model is None:
            model, tokenizer = load_model(Source(init_from, out_dir, ckpt), device)
        self.model, self.tokenizer = model, tokenizer
        self.batch_size = int(batch_size)
        self._device = next(model.parameters()).device
        self.block_size = model.config.block_size

    @property
    def eot_token_id(self):
        return self.tokenizer.eot

    @property
    def prefix_token_id(self):
        """What a text's first token is predicted after: end-of-text, or for character models (which
        have none) a newline, as sample.py starts from one."""
        if self.tokenizer.eot is not None:
            return self.tokenizer.eot
        if "\n" not in getattr(self.tokenizer, "stoi", {}):
            raise UserError("the tokenizer has neither an end-of-text token nor a newline to begin a text with")
        return self.tokenizer.stoi["\n"]

    @property
    def max_length(self):
        return self.block_size

    def tok_encode(self, string, add_special_tokens=None, **kwargs):
        return self.tokenizer.encode(string)

    def check_vocabulary(self, requests, texts):
        """A character model encodes only the characters it was trained on: name the task and the others."""
        stoi = getattr(self.tokenizer, "stoi", None)
        if stoi is None:
            return
        missing = {}  # task -> characters
        for request in requests:
            chars = {c for text in texts(request) for c in text}.difference(stoi)
            if chars:
                missing.setdefault(request.task_name, set()).update(chars)
        for task, chars in missing.items():  # the first: one line
            shown = " ".join(repr(c) for c in sorted(chars)[:20])
            raise UserError(f"task {task}: its text has {len(chars)} characters outside the model's vocabulary "
                            f"of {len(stoi)} ({shown}{' ...' if len(chars) > 20 else ''}); "
                            f"evaluate this model on tasks in its training data's language")

    def loglikelihood(self, requests, disable_tqdm=False):
        self.check_vocabulary(requests, lambda r: r.args)
        return super().loglikelihood(requests, disable_tqdm=disable_tqdm)

    def loglikelihood_rolling(self, requests, disable_tqdm=False):
        """Each text's log-likelihood: windows of block_size tokens, each token scored once."""
        self.check_vocabulary(requests, lambda r: r.args[:1])
        windows, owner = [], []
        for i, request in enumerate(requests):
            for context, continuation in map(make_disjoint_window, get_rolling_token_windows(
                    token_list=self.tok_encode(request.args[0]), prefix_token=self.prefix_token_id,
                    max_seq_len=self.block_size, context_len=1)):
                windows.append((None, context, continuation))
                owner.append(i)
        totals = [0.0] * len(requests)
        for i, (logprob, _) in zip(owner, self._loglikelihood_tokens(windows, disable_tqdm=True)):
            totals[i] += logprob
        return totals

    @torch.no_grad()
    def _loglikelihood_tokens(self, requests, disable_tqdm=False):
        """(sum of the continuation's log-probs, whether each of its tokens is the argmax) per request."""
        for _, context, continuation in requests:
            if len(continuation) > self.block_size:
                raise UserError(f"a continuation of {len(continuation)} tokens is longer than the model's "
                                f"block_size ({self.block_size}); it cannot be scored")
        order = Collator(requests, sort_fn=lambda r: (-len(r[1] + r[2]), tuple(r[1] + r[2])))
        results = []
        for chunk in order.get_batched(n=self.batch_size):
            # the last block_size + 1 tokens: inputs are all but the last, targets all but the first
            rows = [(c + t)[-(self.block_size + 1):] for _, c, t in chunk]
            width = max(len(r) - 1 for r in rows)
            x = torch.zeros(len(rows), width, dtype=torch.long, device=self._device)  # right padding: causal
            for i, r in enumerate(rows):
                x[i, :len(r) - 1] = torch.tensor(r[:-1])
            logits, _ = self.model(x)
            logprobs = F.log_softmax(logits.float(), dim=-1)  # (B, T, V)
            for (_, _, cont), row, lp in zip(chunk, rows, logprobs):
                n = len(row) - 1
                lp = lp[n - len(cont):n]  # the positions that predict the continuation
                target = torch.tensor(cont, device=lp.device)
                picked = lp.gather(1, target[:, None]).sum()
                results.append((picked.item(), bool((lp.argmax(-1) == target).all())))
        return order.get_original(results)

    def generate_until(self, requests, disable_tqdm=False):
        """Decode each context until one of its stop strings, greedily or at the request's temperature."""
        self.check_vocabulary(requests, lambda r: r.args[:1])
        eos = self.tokenizer.decode([self.eot_token_id]) if self.eot_token_id is not None else None
        groups = {}  # rows decoded together share their arguments and their context's length
        for i, (context, gen_kwargs) in enumerate(r.args for r in requests):
            ids = (self.tok_encode(context) or [self.prefix_token_id])[-self.block_size:]
            kwargs = normalize_gen_kwargs(gen_kwargs, MAX_GEN_TOKS)
            until = handle_stop_sequences(kwargs.pop("until", None), eos=eos)
            key = (repr(sorted(kwargs.items())), repr(until), len(ids))
            groups.setdefault(key, (kwargs, until, []))[2].append((i, context, ids))
        out = [None] * len(requests)
        for key in sorted(groups, key=lambda k: -k[2]):
            kwargs, until, rows = groups[key]
            for start in range(0, len(rows), self.batch_size):
                batch = rows[start:start + self.batch_size]
                for (i, _, _), text in zip(batch, self.decode_batch(batch, kwargs, until)):
                    out[i] = text
        return out

    def decode_batch(self, batch, kwargs, until):
        x = torch.tensor([ids for _, _, ids in batch], dtype=torch.long, device=self._device)
        temperature = float(kwargs.get("temperature") or 0.0) if kwargs.get("do_sample") else 0.0
        generators = None
        if temperature > 0:  # each row's own seed: the same text whatever the batch
            generators = [torch.Generator(device=self._device).manual_seed(zlib.crc32(c.encode())) for _, c, _ in batch]
        texts = continue_rows([Continuation(self.tokenizer, until) for _ in batch],
                              stream(self.model, x, int(kwargs["max_gen_toks"]), temperature, kwargs.get("top_k"),
                                     kwargs.get("top_p"), generator=generators, run_ahead=GREEDY_RUN))
        return [text.text for text in texts]


def quiet_logging():
    logging.getLogger("lm_eval").setLevel(logging.WARNING)  # its per-task INFO lines drown the table
    logging.getLogger("huggingface_hub").setLevel(logging.ERROR)  # offline: the one line below says it
    # a note for task authors, logged each time a task with its own loader (ours) is built
    logging.getLogger("lm_eval.api.task").addFilter(lambda record: "Custom kwargs" not in record.getMessage())


def task_manager(include_path, names):
    """lm-eval's TaskManager with include_path's tasks; every name checked, with the nearest as a hint."""
    from lm_eval.tasks import TaskManager
    if include_path is not None and not os.path.isdir(include_path):
        raise UserError(f"--include_path={include_path} is not a folder of task YAMLs (ours: --include_path=tasks)")
    if include_path is not None:  # lm-eval's own thousands of YAMLs are indexed only when a name needs them
        manager = TaskManager(include_path=include_path, include_defaults=False)
        if all(name in manager.all_tasks for name in names):
            return manager
    manager = TaskManager(include_path=include_path)
    check_names(names, set(manager.all_tasks), include_path)
    return manager


def check_names(names, known, include_path):
    for name in names:
        if name not in known:
            hint = nearest(name, known) or ("" if include_path else "; ours need --include_path=tasks")
            raise UserError(f"unknown task {name!r}{hint}; lm-eval's list: python -m lm_eval ls tasks")
