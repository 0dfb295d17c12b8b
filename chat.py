"""Talk to a fine-tuned model: a conversation in the terminal, each answer streamed as it is written.

    python chat.py --out_dir=out-tangshi-sft
    python chat.py --out_dir=out-tangshi-sft -p "藏頭詩：春江花月"      # one answer, then exit
    python chat.py --out_dir=out-tangshi-sft --system="..." --temperature=0

The checkpoint must have been fine-tuned on a chat dataset (data/chat/prepare.py): its tokenizer
carries the role tokens of the template. Type /reset to start over, /quit (or Ctrl-D) to leave;
Ctrl-C stops an answer, not the session. A character outside the vocabulary is written in a form the
vocabulary has (simplified Chinese as the Tang poems' traditional characters, with OpenCC) or left out,
with a note (tokenizer.CharTokenizer.fit; docs/generation.md).
"""
import sys
from dataclasses import dataclass

import torch

from configurator import parse_args, report_overrides
from nanogpt.copies import report, training_of
from nanogpt.device import Device, Dtype, autocast, resolve_device, resolve_dtype
from nanogpt.errors import UserError
from nanogpt.generate import GREEDY_RUN, Continuation, Sampling, check_sampling, stream
from nanogpt.program import run_main
from nanogpt.source import Source, load_trained
from nanogpt.tokenizer import ChatTokenizer


@dataclass
class ChatConfig(Source, Sampling, Device, Dtype):
    system: str = ""  # a system message that opens every conversation
    prompt: str = ""  # -p: answer this one message and exit
    max_new_tokens: int = 500  # an answer's length at most
    copies: bool = False  # after each answer, the spans it copied verbatim from the training text, and the share

    def __post_init__(self):
        Source.__post_init__(self)
        Sampling.__post_init__(self)
        check_sampling(self.max_new_tokens, self.temperature, self.top_k, self.top_p)


def load_chat_model(source, device):
    """The model and its chat tokenizer; a one-line refusal for a checkpoint without a chat template."""
    model, tokenizer, dataset = load_trained(source, device)
    if not isinstance(tokenizer, ChatTokenizer):
        where = f"--out_dir={source.out_dir}" if source.init_from == "resume" else f"--init_from={source.init_from}"
        raise UserError(f"{source.path} has no chat template (it was not fine-tuned on conversations); sample from "
                        f"it with python sample.py {where}, or fine-tune it: see docs/chat.md")
    return model, tokenizer, dataset


class Session:
    """A conversation: its messages, and the model that answers them."""

    def __init__(self, model, tokenizer, cfg, device, training=None):
        self.model, self.tokenizer, self.cfg, self.device = model, tokenizer, cfg, device
        self.training = training  # where copies are looked for (--copies=True), else None
        self.generator = torch.Generator(device=device).manual_seed(cfg.seed)
        self.reset()

    def reset(self):
        self.messages = [{"role": "system", "content": self.fit(self.cfg.system, "--system")}] if self.cfg.system else []

    def fit(self, text, what):
        """text in the vocabulary's characters, with a note of what was converted or left out."""
        fitted = self.tokenizer.fit(text)
        if fitted.note():
            print(fitted.note(what), file=sys.stderr)
        return fitted.text

    def prompt_ids(self):
        """The conversation so far and <|assistant|>; the oldest turns (never the system message) are left
        out until it fits the context with room for an answer (max_new_tokens, or half the context)."""
        block = self.model.config.block_size
        room = block - min(self.cfg.max_new_tokens, block // 2)
        first = 1 if self.cfg.system else 0
        while True:
            ids, _ = self.tokenizer.render(self.messages)
            if len(ids) <= room or len(self.messages) - first <= 1:
                return ids
            del self.messages[first:first + 2]  # one user message and its answer
            print("(the oldest turn no longer fits the context and was left out)", file=sys.stderr)

    def answer(self, text, out=sys.stdout):
        """Stream the answer to text; returns it. Ctrl-C stops the answer, keeping what was written."""
        self.messages.append({"role": "user", "content": self.fit(text, "your message")})
        ids = self.prompt_ids()
        x = torch.tensor([ids], dtype=torch.long, device=self.device)
        reply = Continuation(self.tokenizer, stop_ids=self.tokenizer.answer_stops)
        cfg = self.cfg
        try:
            with autocast(self.device, resolve_dtype(cfg.dtype, self.device)):
                for tok in stream(self.model, x, cfg.max_new_tokens, generator=[self.generator],
                                  run_ahead=GREEDY_RUN, **cfg.settings()):
                    out.write(reply.add(tok.item()))
                    out.flush()
                    if reply.done:
                        break
        except KeyboardInterrupt:
            out.write(" [stopped]")
        out.write(reply.finish() + "\n")
        if self.training:
            out.write("".join(line + "\n" for line in report(self.training.find(reply.text))))
        out.flush()
        self.messages.append({"role": "assistant", "content": reply.text})
        return reply.text


def repl(session):
    print("chat: /reset starts over, /quit (or Ctrl-D) leaves; Ctrl-C stops an answer", file=sys.stderr)
    while True:
        try:
            text = input("> ")
        except (EOFError, KeyboardInterrupt):
            print(file=sys.stderr)
            return
        if text.strip() in ("/quit", "/exit"):
            return
        if text.strip() == "/reset":
            session.reset()
            print("(a new conversation)", file=sys.stderr)
            continue
        if text.strip():
            session.answer(text)


def main(argv):
    argv = ["--prompt=" + argv[i + 1] if a == "-p" and i + 1 < len(argv) else a for i, a in enumerate(argv)
            if not (i > 0 and argv[i - 1] == "-p")]
    cfg, overrides = parse_args(ChatConfig, argv)
    report_overrides({k: v for k, v in overrides.items() if k != "prompt"}, ChatConfig(),
                     log=lambda line: print(line, file=sys.stderr))
    device = resolve_device(cfg.device)
    model, tokenizer, dataset = load_chat_model(cfg, device)
    session = Session(model, tokenizer, cfg, device, training_of(dataset, cfg.path) if cfg.copies else None)
    if cfg.prompt:
        session.answer(cfg.prompt)
    else:
        repl(session)


if __name__ == "__main__":
    run_main(main)
