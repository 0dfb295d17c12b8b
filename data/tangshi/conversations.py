"""Conversations from the Tang poems, for instruction tuning: the dataset config/tangshi_sft.py trains on.

    python data/tangshi/prepare.py --input PATH   # first: the poems as a dataset
    python data/tangshi/conversations.py                    # then: data/tangshi_chat

Reads the prepared dataset's train split only (held-out poems stay held out, for
data/tangshi/evaluate.py), and makes two conversations of each poem of a regular form
(4 or 8 句 of 5 or 7 characters):
    user "藏頭詩：春江花月"     assistant: a poem whose i-th 句 begins with the i-th character
    user "七言絕句：<title>"    assistant: the poem
and --drawn acrostics of drawn keys (poems.drawn_acrostics: a poem's 句 starts replaced by characters drawn
from the train split, the rarer ones more often), so that the model copies any key, not only the characters
that often begin a 句 (docs/chat.md). They are shuffled, written as OpenAI's fine-tuning JSONL
(data/tangshi/chat.jsonl), and prepared by data/chat/prepare.py into data/tangshi_chat with the poems' tokenizer
and role tokens.
"""
import argparse
import json
import os
import random
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
from data.tangshi.poems import conversations, drawn_acrostics, parse_poems, split_text  # noqa: E402
from nanogpt.chat_dataset import prepare_chat  # noqa: E402
from nanogpt.errors import UserError  # noqa: E402
from nanogpt.files import open_to_write  # noqa: E402
from nanogpt.program import run_main  # noqa: E402

BLOCK_SIZE = 128  # config/tangshi_sft.py's context: a 七言律詩 and its request fit


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", default=HERE, help="the prepared Tang dataset (char, bpe or gpt2)")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(HERE), "tangshi_chat"),
                        help="where the chat dataset goes (default: data/tangshi_chat, config/tangshi_sft.py's)")
    parser.add_argument("--drawn", type=int, default=20_000, help="acrostics of drawn keys (default: 20,000)")
    parser.add_argument("--seed", type=int, default=1337, help="the shuffle of the conversations")
    parser.add_argument("--draw_seed", type=int, default=7, help="the draw of the drawn acrostics' poems and keys")
    args = parser.parse_args(argv)
    if args.drawn < 0:
        raise UserError(f"--drawn must be 0 or more, got {args.drawn}")
    text = split_text(args.dataset, "train")
    poems = parse_poems(text)
    chats = conversations(poems)
    drawn = drawn_acrostics(poems, text, args.drawn, args.draw_seed)
    chats += drawn
    random.Random(args.seed).shuffle(chats)
    print(f"{len(poems):,} train poems, {len(chats):,} conversations ({len(drawn):,} of them acrostics of drawn keys)")
    jsonl = os.path.join(args.dataset, "chat.jsonl")
    with open_to_write(jsonl + ".tmp", "w", encoding="utf-8") as f:
        f.writelines(json.dumps(c, ensure_ascii=False) + "\n" for c in chats)
    os.replace(jsonl + ".tmp", jsonl)
    prepare_chat(jsonl, args.dataset, args.out, block_size=BLOCK_SIZE)
    print("done; fine-tune on it with: python train.py config/tangshi_sft.py")


if __name__ == "__main__":
    run_main(main)
