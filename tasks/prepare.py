"""Next-line tasks for lm-evaluation-harness, and a Tang acrostic task for chat models, built from the val
split of our datasets (never train).

    python tasks/prepare.py [--dataset tangshi|shakespeare_char|all] [--input PATH] [--max_items 1000]
    python eval.py --out_dir=out-tangshi --tasks=tangshi_next_line --include_path=tasks

Each item is a poem (title, author, the lines so far) or a speech (the speaker, the lines
so far) and four candidate next lines: the true one and three lines of the same length
from other poems or speeches of the split, so counting characters gives no hint (chance
is 25%). Reads data/<dataset>/val.bin decoded with its meta.json, or with --input the raw
text's last 10% (prepare.py's val split). Writes tasks/data/<task>.jsonl; the same seed
writes the same file. The task YAMLs beside this script load those files (load below).

tangshi_acrostic (generate_until, for a model fine-tuned to chat: lm_eval --model local-chat-completions
--apply_chat_template against serve.py) asks "藏頭詩：XXXX" for the keys of the split's poems of a
regular form (data/tangshi/poems.py, as data/tangshi/evaluate.py) and scores each answer by the
acrostic rule (tasks/acrostic.py).
"""
import argparse
import json
import os
import random
import sys
from collections import defaultdict

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
from nanogpt.errors import UserError  # noqa: E402
from nanogpt.files import open_to_write  # noqa: E402
from nanogpt.program import run_main  # noqa: E402
from nanogpt.tokenizer import read_meta, tokenizer_from_meta  # noqa: E402

DATA = os.path.join(HERE, "data")
TASKS = {"tangshi": "tangshi_next_line", "shakespeare_char": "shakespeare_next_line"}
ACROSTIC_TASK = "tangshi_acrostic"  # also built from the tangshi split
VAL_FRACTION = 0.1  # data/prepare.py's default: the last 10% of the characters are val


def val_text(dataset, input_path=None):
    """The val split as text: the raw file's last 10%, or data/<dataset>/val.bin decoded."""
    if input_path is not None:
        with open(input_path, encoding="utf-8") as f:
            text = f.read()
        return text[int(len(text) * (1 - VAL_FRACTION)):]
    directory = os.path.join(ROOT, "data", dataset)
    meta = read_meta(directory)
    if meta is None or not os.path.exists(os.path.join(directory, "val.bin")):
        raise UserError(f"{directory}/val.bin and meta.json not found; run python data/{dataset}/prepare.py "
                        f"(or give the raw text with --input)")
    ids = np.fromfile(os.path.join(directory, "val.bin"), dtype=meta.get("dtype", "uint16"))
    return tokenizer_from_meta(meta).decode(ids.tolist())


def pieces(text, header_lines):
    """(header, lines) of each whole poem or speech: blank-line separated, the split's cut-off first and
    last pieces dropped."""
    out = []
    for block in text.split("\n\n")[1:-1]:
        lines = [line for line in block.split("\n") if line.strip()]
        if len(lines) >= header_lines + 2:  # a line of context and a line to predict, at least
            out.append((lines[:header_lines], lines[header_lines:]))
    return out


def make_items(text, header_lines, seed, max_items):
    """One item per poem or speech (up to max_items): a random position, the true line and three of its length."""
    blocks = pieces(text, header_lines)
    by_length = defaultdict(list)  # length -> [(block index, line)]
    for b, (_, lines) in enumerate(blocks):
        for line in lines:
            by_length[len(line)].append((b, line))
    rng = random.Random(seed)
    items = []
    for b, (header, lines) in enumerate(blocks):
        k = rng.randrange(1, len(lines))
        answer = lines[k]
        others = sorted({line for ob, line in by_length[len(answer)] if ob != b and line != answer})
        if len(others) < 3:
            continue
        choices = rng.sample(others, 3) + [answer]
        rng.shuffle(choices)
        context = "".join(line + "\n" for line in header + lines[:k])
        items.append({"context": context, "choices": choices, "label": choices.index(answer)})
    rng.shuffle(items)
    return items[:max_items]


def acrostic_items(text, seed, max_items):
    """Up to max_items requests {"request": "藏頭詩：XXXX", "key": "XXXX"}, keys from the text's poems."""
    from data.tangshi.poems import ACROSTIC, acrostic_keys
    keys = acrostic_keys(text)
    keys = random.Random(seed).sample(keys, min(max_items, len(keys)))
    return [{"request": ACROSTIC + key, "key": key} for key in keys]


def write_jsonl(items, path):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp"
    with open_to_write(tmp, "w", encoding="utf-8") as f:
        for item in items:
            f.write(json.dumps(item, ensure_ascii=False) + "\n")
    os.replace(tmp, path)


def load(task, **_):
    """The task's items as a datasets split ("test"): the custom_dataset of the task YAMLs."""
    import datasets
    path = os.path.join(DATA, f"{task}.jsonl")
    if not os.path.exists(path):
        raise UserError(f"{path} not found; run python tasks/prepare.py")
    with open(path, encoding="utf-8") as f:
        return {"test": datasets.Dataset.from_list([json.loads(line) for line in f])}


HEADER_LINES = {"tangshi": 2, "shakespeare_char": 1}  # title and author; the speaker


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="all", choices=[*TASKS, "all"])
    parser.add_argument("--input", help="the raw text (its last 10%% is used) instead of data/<dataset>/val.bin")
    parser.add_argument("--max_items", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=1337)
    args = parser.parse_args(argv)
    if args.input and args.dataset == "all":
        raise UserError("--input is one dataset's text: name it with --dataset (tangshi or shakespeare_char)")
    for dataset in TASKS if args.dataset == "all" else [args.dataset]:
        text = val_text(dataset, args.input)
        items = make_items(text, HEADER_LINES[dataset], args.seed, args.max_items)
        path = os.path.join(DATA, f"{TASKS[dataset]}.jsonl")
        write_jsonl(items, path)
        print(f"{TASKS[dataset]}: {len(items):,} items, 4 choices each -> {os.path.relpath(path)}")
        if dataset == "tangshi":
            items = acrostic_items(text, args.seed, args.max_items)
            path = os.path.join(DATA, f"{ACROSTIC_TASK}.jsonl")
            write_jsonl(items, path)
            print(f"{ACROSTIC_TASK}: {len(items):,} acrostic requests -> {os.path.relpath(path)}")


if __name__ == "__main__":
    run_main(main)
