"""Tang poems (全唐诗), traditional characters: the second built-in dataset, a Chinese corpus the size of tiny Shakespeare.

    python data/tangshi/prepare.py [--input PATH] [--tokenizer char|bpe|gpt2] [--vocab_size 4096]

Reads --input, else input.txt beside this script, else downloads the first 58
files of 全唐诗 from the chinese-poetry/chinese-poetry repository (MIT licence)
and writes them there as text: each poem's title, author and lines, a blank
line after each poem. Expect 1,133,213 characters, 6,552 distinct; with char
tokens, train 1,019,891 and val 113,322.
"""
import argparse
import json
import os
import sys
import urllib.parse
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))  # the repository: the nanogpt package
from nanogpt import program  # noqa: E402

program.exit_quietly_on_ctrl_c()  # before the slow imports (numpy): Ctrl-C during them exits quietly
from nanogpt.dataset import DEFAULT_BPE_VOCAB, prepare, vocabulary_note  # noqa: E402
from nanogpt.errors import UserError  # noqa: E402
from nanogpt.files import open_to_write  # noqa: E402
from nanogpt.program import run_main  # noqa: E402

SOURCE = "https://raw.githubusercontent.com/chinese-poetry/chinese-poetry/master/全唐诗/poet.tang.{}.json"
FILES = range(0, 58000, 1000)  # poet.tang.0.json, poet.tang.1000.json, ..., poet.tang.57000.json


def poems_text(poems):
    """Title, author and lines of each poem, one per line, and a blank line after each poem."""
    return "".join(f"{p['title']}\n{p['author']}\n" + "".join(line + "\n" for line in p["paragraphs"]) + "\n"
                   for p in poems)


def download(path):
    parts = []
    for n in FILES:
        url = urllib.parse.quote(SOURCE.format(n), safe=":/")
        print(f"downloading {url}")
        try:
            with urllib.request.urlopen(url, timeout=60) as response:
                parts.append(poems_text(json.load(response)))
        except (OSError, ValueError) as e:
            raise UserError(f"download failed ({e}); offline, pass a local copy with --input PATH") from None
    with open_to_write(path + ".tmp", "w", encoding="utf-8") as f:
        f.write("".join(parts))
    os.replace(path + ".tmp", path)


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--input", help="a local copy of the corpus (no download)")
    parser.add_argument("--tokenizer", default="char", choices=["char", "bpe", "gpt2"],
                        help="char: one token per character; bpe: a BPE trained on the poems; gpt2: GPT-2's BPE")
    parser.add_argument("--vocab_size", type=int, default=DEFAULT_BPE_VOCAB, help="tokens of a trained BPE")
    args = parser.parse_args(argv)
    path = args.input or os.path.join(HERE, "input.txt")
    if args.input and not os.path.isfile(args.input):
        raise UserError(f"--input {args.input} not found")
    if not os.path.exists(path):
        download(path)
    counts = prepare(path, tokenizer=args.tokenizer, out_dir=HERE, vocab_size=args.vocab_size)
    print("done; train on it with: python train.py config/tangshi_cpu.py")
    note = vocabulary_note(counts, "config/tangshi_cpu.py")
    if note:
        print(note)


if __name__ == "__main__":
    run_main(main)
