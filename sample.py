"""Sample text from a trained model.

    python sample.py --out_dir=out-shakespeare-char
    python sample.py --out_dir=out-shakespeare-char --start="ROMEO:" --num_samples=1 --temperature=0
    python sample.py --out_dir=out --start=FILE:prompt.txt --stream=True --stop="['\\n\\n']"

The tokenizer is the one of the dataset the checkpoint was trained on (its
meta.json / meta.pkl), or the meta.json export.py wrote beside a model's weights
(--init_from=DIR), else GPT-2 BPE. The same seed gives the same text.
"""
from nanogpt import program

program.exit_quietly_on_ctrl_c()  # before the slow imports (torch): Ctrl-C during them exits quietly

# ruff: noqa: E402
import sys
from dataclasses import dataclass, field

import torch

from configurator import parse_args, report_overrides
from nanogpt.copies import marked, report, training_of
from nanogpt.device import Device, Dtype, autocast, resolve_device, resolve_dtype
from nanogpt.errors import UserError
from nanogpt.files import read_named_text
from nanogpt.generate import (GREEDY_RUN, Continuation, Sampling, check_sampling, check_stops, continue_rows,
                              sample_seed, stream)
from nanogpt.memory import check_fits, kv_cache_bytes
from nanogpt.program import run_main
from nanogpt.source import Source, load_trained

SEPARATOR = "---------------"

PROMPT_BYTES = 1 << 24  # a prompt file's most: a model reads its last block_size tokens


@dataclass
class SampleConfig(Source, Sampling, Device, Dtype):
    start: str = "\n"  # the prompt, or FILE:path to read it from a file
    num_samples: int = 10
    max_new_tokens: int = 500
    stop: list[str | int] = field(default_factory=list)  # strings (escapes such as \n work) or token ids that end a sample
    compile: bool = False  # torch.compile the model: for long generations on CUDA; on CPU the decode steps skip it
    stream: bool = False  # print each token as it is generated (samples one after another)
    use_cache: bool = True  # KV cache: one position per step instead of the whole context
    copies: bool = False  # mark the spans copied verbatim from the training text, and print the copied share

    def __post_init__(self):
        Source.__post_init__(self)
        Sampling.__post_init__(self)
        check_sampling(self.max_new_tokens, self.temperature, self.top_k, self.top_p)
        if self.num_samples < 1:
            raise ValueError(f"num_samples must be at least 1, got {self.num_samples}")
        self.stop = [unescape(s) if isinstance(s, str) else s for s in self.stop]
        if any(s == "" for s in self.stop):
            raise ValueError("--stop has an empty string, which would end every sample before it starts; "
                             "give the text that should end a sample, e.g. --stop='\\n\\n'")
        check_stops(self.stop)


def unescape(text):
    r"""Backslash escapes as typed in a shell (\n, \t, \r, \\, \u4e00) made the characters they name."""
    try:
        return text.encode("latin-1", "backslashreplace").decode("unicode_escape")
    except UnicodeDecodeError as e:
        raise ValueError(f"--stop={text!r}: bad escape ({e.reason}); write \\\\ for a backslash") from None


def read_prompt(start):
    if not start.startswith("FILE:"):
        return start
    return read_named_text(start[5:], f"--start={start}", PROMPT_BYTES)


def main(argv):
    cfg, overrides = parse_args(SampleConfig, argv)
    report_overrides(overrides, SampleConfig(), log=lambda line: print(line, file=sys.stderr))  # stdout is the text
    device = resolve_device(cfg.device)
    dtype = resolve_dtype(cfg.dtype, device)
    model, tokenizer, dataset = load_trained(cfg, device)
    training = training_of(dataset, cfg.path) if cfg.copies else None  # before generating: a missing index is built now
    if cfg.compile:
        if device.type == "cpu":
            print("note: compile=True on CPU compiles only what fused_step.FusedStep leaves to the model: the prompt, "
                  "context shifts, and the steps of configs it does not cover, which compiled lose the packed "
                  "weights; float32 decode steps run fused either way (docs/generation.md)", file=sys.stderr)
        model.compile(dynamic=True)  # in place: generate's own calls go through the compiled forward
    fitted = tokenizer.fit(read_prompt(cfg.start))  # text outside the vocabulary: docs/generation.md
    if fitted.note():
        print(fitted.note("the prompt"), file=sys.stderr)
    prompt = fitted.text
    ids = tokenizer.encode(prompt) or ([tokenizer.eot] if tokenizer.eot is not None else [])
    if not ids:
        raise UserError("the prompt is empty; give some text with --start (e.g. --start='ROMEO:' for Shakespeare, "
                        "some words of your own text for yours)")
    if len(ids) > model.config.block_size:
        print(f"note: the prompt has {len(ids)} tokens; the model sees its last {model.config.block_size}",
              file=sys.stderr)
    stop_texts = [s for s in cfg.stop if isinstance(s, str)]
    stop_ids = [[s] for s in cfg.stop if isinstance(s, int)]
    num_samples = cfg.num_samples
    if cfg.temperature == 0 and num_samples > 1:
        print(f"note: greedy decoding (temperature=0) writes the same text every time: printing 1 sample, "
              f"not {num_samples}", file=sys.stderr)
        num_samples = 1
    check_fits(kv_cache_bytes(model.config, num_samples, model.transformer.wte.weight.element_size())
               + 3 * num_samples * model.config.vocab_size * 4, device,  # the cache, and each step's logits
               f"decoding {num_samples:,} samples together", "lower num_samples")
    torch.manual_seed(cfg.seed)
    # one generator per sample: sample i is the same text whether streamed alone or decoded in a batch
    generators = [torch.Generator(device=device).manual_seed(sample_seed(cfg.seed, i)) for i in range(num_samples)]
    ctx = autocast(device, dtype)
    x = torch.tensor(ids, dtype=torch.long, device=device)[None]
    args = dict(max_new_tokens=cfg.max_new_tokens, use_cache=cfg.use_cache, run_ahead=GREEDY_RUN, **cfg.settings())
    with ctx:
        if cfg.stream:
            for generator in generators:
                text = Continuation(tokenizer, stop_texts, stop_ids)
                print(prompt, end="", flush=True)
                for tok in stream(model, x, generator=[generator], **args):
                    print(text.add(tok.item()), end="", flush=True)
                    if text.done:
                        break
                print(text.finish())
                if training:
                    print("\n".join(report(training.find(prompt + text.text, start=len(prompt)))))
                print(SEPARATOR)
        else:
            texts = continue_rows([Continuation(tokenizer, stop_texts, stop_ids) for _ in range(num_samples)],
                                  stream(model, x.expand(num_samples, -1), generator=generators, **args))  # one batch
            for text in texts:
                if training:  # after generating: the search costs generation nothing
                    found = training.find(prompt + text.text, start=len(prompt))
                    print(prompt + marked(prompt + text.text, found, sys.stdout.isatty(), start=len(prompt)))
                    print("\n".join(report(found)))
                else:
                    print(prompt + text.text)
                print(SEPARATOR)


if __name__ == "__main__":
    run_main(main)
