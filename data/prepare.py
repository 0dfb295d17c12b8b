"""Tokenize your own text into a dataset train.py can read.

    python data/prepare.py --input FILE_OR_DIR --tokenizer char|gpt2|bpe [--vocab_size 4096] --out data/NAME

Writes train.bin / val.bin (uint16 tokens, uint32 if the vocabulary needs it)
and meta.json (plus nanoGPT's meta.pkl for char vocabularies). A file's first
1 - val_fraction of the characters are train, the rest val, as nanoGPT splits.
A directory is read file by file in sorted order, hidden files and folders
skipped, and each file of a twentieth of its text or more gives its last
val_fraction to val (smaller files taken together until they hold a tenth),
so that val holds every book and language of it; with gpt2 and bpe,
<|endoftext|> separates the files. Input is streamed in
chunks: memory stays bounded.
"""
import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from nanogpt import program  # noqa: E402

program.exit_quietly_on_ctrl_c()  # before the slow imports (numpy): Ctrl-C during them exits quietly
from nanogpt.dataset import DEFAULT_BPE_VOCAB, prepare, recipe_for, torch_cuda_available, train_command, vocabulary_note  # noqa: E402
from nanogpt.program import run_main  # noqa: E402


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--input", required=True, help="a UTF-8 text file or a directory of them")
    parser.add_argument("--tokenizer", default="char", choices=["char", "gpt2", "bpe"],
                        help="char: one token per character; gpt2: GPT-2's BPE; bpe: a BPE trained on this text")
    parser.add_argument("--vocab_size", type=int, default=DEFAULT_BPE_VOCAB, help="tokens of a trained BPE")
    parser.add_argument("--out", required=True, help="output directory, e.g. data/mytext")
    parser.add_argument("--val_fraction", type=float, default=0.1,
                        help="the share of the text, at its end (a folder's: at each large file's end), held out as val")
    args = parser.parse_args(argv)
    cuda = torch_cuda_available()
    counts = prepare(args.input, args.tokenizer, args.out, args.val_fraction, vocab_size=args.vocab_size,
                     check=lambda counts: train_command(args.out, counts, cuda))  # refuses too few tokens
    print(f"done; train on it with: {train_command(args.out, counts, cuda)}")
    note = None if cuda else vocabulary_note(counts, recipe_for(args.out))
    if note:
        print(note)


if __name__ == "__main__":
    run_main(main)
