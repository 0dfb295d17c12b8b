"""Conversations into a chat dataset: token ids, and a mask of what the fine-tuning loss sees.

    python data/chat/prepare.py --input FILE.jsonl --init_from OUT_DIR [--out data/NAME]
    python data/chat/prepare.py --input FILE.jsonl --base DATASET [--out data/NAME] [--block_size 1024]

FILE.jsonl is OpenAI's fine-tuning format, one conversation per line:
    {"messages": [{"role": "system", "content": "..."}, {"role": "user", "content": "..."},
                  {"role": "assistant", "content": "..."}]}
(an assistant message with "weight": 0 is context, not a target). The tokenizer is DATASET's (char,
a trained BPE or GPT-2's; DATASET is a name under data/ or a directory) with four role tokens
appended; DATASET itself is not touched. Writes, for train (the first 1 - val_fraction of the
conversations) and val: NAME/train.bin (ids, each conversation rendered by the chat template),
train_mask.bin (uint8, 1 where the loss sees the token: the assistant's words and its <|end|>),
train_index.bin (int64, where each conversation starts, then the total), and meta.json.
Bad lines are skipped and reported with their line numbers. With --init_from (the checkpoint to be
fine-tuned), DATASET is the one it was trained on and the context its block_size, unless given.
"""
import argparse
import os
import shlex
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)  # the repository: the nanogpt package
from nanogpt import program  # noqa: E402

program.exit_quietly_on_ctrl_c()  # before the slow imports (numpy, torch): Ctrl-C during them exits quietly
from nanogpt.chat_dataset import model_defaults, prepare_chat  # noqa: E402
from nanogpt.program import run_main  # noqa: E402


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--input", required=True, help="conversations in OpenAI's fine-tuning JSONL")
    parser.add_argument("--init_from", help="the checkpoint to fine-tune (an out_dir or its ckpt.pt): "
                                            "--base and --block_size default to its dataset and context")
    parser.add_argument("--base", help="the dataset whose tokenizer the model was pretrained with")
    parser.add_argument("--out", help="output directory (default: data/<input's name>)")
    parser.add_argument("--block_size", type=int, help="the context: longer conversations are skipped "
                                                       "(default: --init_from's, else 1024)")
    parser.add_argument("--val_fraction", type=float, default=0.1,
                        help="the share of the conversations, at the end, held out as val")
    args = parser.parse_args(argv)
    args.base, args.block_size = model_defaults(args.init_from, args.base, args.block_size)
    out = args.out or os.path.join(ROOT, "data", os.path.splitext(os.path.basename(args.input))[0])
    prepare_chat(args.input, args.base, out, args.block_size, args.val_fraction)
    print(f"done; fine-tune a model trained on {args.base} with: python train.py config/chat_sft.py "
          f"--init_from={shlex.quote(args.init_from or '<its out_dir>')} --dataset={shlex.quote(out)} "
          f"--out_dir={shlex.quote('out-' + os.path.basename(os.path.normpath(out)))}")


if __name__ == "__main__":
    run_main(main)
