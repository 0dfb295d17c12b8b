"""Tiny Shakespeare in GPT-2 BPE tokens (tiktoken's r50k_base, the gpt2 vocabulary).

    python data/shakespeare/prepare.py [--input PATH]

Reads --input, else input.txt beside this script, else downloads it there.
Offline, point TIKTOKEN_CACHE_DIR at a copy of the BPE ranks.
Expect: train 301,966 tokens, val 36,059 tokens.
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))  # the repository: the nanogpt package
from nanogpt import program  # noqa: E402

program.exit_quietly_on_ctrl_c()  # before the slow imports (numpy): Ctrl-C during them exits quietly
from nanogpt.dataset import find_or_download, prepare  # noqa: E402
from nanogpt.program import run_main  # noqa: E402


def main(argv):
    prepare(find_or_download(argv, HERE), tokenizer="gpt2", out_dir=HERE)


if __name__ == "__main__":
    run_main(main)
