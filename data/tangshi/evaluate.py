"""How well a model writes acrostic poems (藏頭詩) for keys it has never seen.

    python data/tangshi/evaluate.py --out_dir=out-tangshi-sft [--out_dir=out-tangshi ...] [--keys=200]

Keys are the first characters of the 句 of held-out poems (the prepared dataset's val split, which
data/tangshi/conversations.py never reads): four characters each, from poems of a regular form. Each model
answers every key greedily (temperature 0) and sampled (nanoGPT's temperature 0.8 and top_k 200).
A chat model (one fine-tuned on a chat dataset) is asked through its template; a base model is given
the same request as plain text and a line break, and its poem ends at the first blank line.
Prints, per model and decoding: the share of 句 that begin with the requested character, the share of
poems whose 句 keep one length (5 or 7), and the share with as many 句 as characters asked for;
appends the same as JSON lines to --log.
"""
import argparse
import json
import os
import random
import sys
import time

import numpy as np
import torch
from tqdm import tqdm

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
from nanogpt.checkpoint import load_checkpoint, model_from_checkpoint  # noqa: E402
from nanogpt.program import run_main  # noqa: E402
from nanogpt.errors import UserError  # noqa: E402
from data.tangshi.poems import ACROSTIC, acrostic_keys, score_acrostic  # noqa: E402
from nanogpt.generate import generate  # noqa: E402
from nanogpt.tokenizer import ChatTokenizer, read_meta, tokenizer_from_meta  # noqa: E402

DECODINGS = {"greedy": dict(temperature=0.0), "sampled": dict(temperature=0.8, top_k=200)}
MAX_NEW_TOKENS = 80  # a 七言絕句 is 34 characters; a 律詩 of 8 is 68


def held_out_keys(dataset, n, seed):
    """n acrostic keys (4 characters) from the val split's poems of a regular form."""
    path = os.path.join(dataset, "val.bin")
    meta = read_meta(dataset)
    if meta is None or not os.path.exists(path):
        raise UserError(f"{path} not found; prepare the poems first: python data/tangshi/prepare.py")
    text = tokenizer_from_meta(meta).decode(np.fromfile(path, dtype=np.dtype(meta.get("dtype", "uint16"))).tolist())
    keys = acrostic_keys(text)
    if len(keys) < n:
        raise UserError(f"the val split has {len(keys)} poems of a regular form, fewer than --keys={n}")
    return random.Random(seed).sample(keys, n)


def load(out_dir, device):
    path = os.path.join(out_dir, "ckpt.pt")
    ckpt = load_checkpoint(path, map_location=device)
    model = model_from_checkpoint(ckpt, path, dropout=0.0).to(device).eval()
    if ckpt.get("tokenizer") is None:
        raise UserError(f"{path} carries no tokenizer; evaluate a checkpoint trained on the Tang poems")
    return model, tokenizer_from_meta(ckpt["tokenizer"])


def answers(model, tokenizer, keys, decoding, seed, batch):
    """Each key's answer text."""
    chat = isinstance(tokenizer, ChatTokenizer)
    out = []
    for i in tqdm(range(0, len(keys), batch), desc=decoding, unit="batch", disable=None):
        part = keys[i:i + batch]
        if chat:
            prompts = [tokenizer.render([{"role": "user", "content": ACROSTIC + k}])[0] for k in part]
        else:
            prompts = [tokenizer.encode(ACROSTIC + k + "\n") for k in part]
        x = torch.tensor(prompts, dtype=torch.long)  # every request has the same length
        generators = [torch.Generator().manual_seed(seed + i + j) for j in range(len(part))]
        stop = tokenizer.answer_stops if chat else None
        y = generate(model, x, MAX_NEW_TOKENS, stop=stop, generator=generators, **DECODINGS[decoding])
        for row in y[:, x.size(1):].tolist():
            text = tokenizer.decode([t for t in row if t >= 0])
            out.append(text if chat else text.split("\n\n")[0])
    return out


def evaluate(out_dir, keys, decoding, seed=1337, batch=50, device="cpu"):
    """{"model", "decoding", "starts", "one_length", "whole", "n"} and the answers."""
    model, tokenizer = load(out_dir, device)
    with torch.no_grad():
        texts = answers(model, tokenizer, keys, decoding, seed, batch)
    scores = [score_acrostic(k, t) for k, t in zip(keys, texts)]
    return {"model": out_dir, "chat": isinstance(tokenizer, ChatTokenizer), "decoding": decoding, "n": len(keys),
            "starts": sum(s["hits"] for s in scores) / sum(len(k) for k in keys),
            "one_length": sum(s["one_length"] for s in scores) / len(keys),
            "whole": sum(s["whole"] for s in scores) / len(keys)}, texts


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out_dir", action="append", required=True, help="a checkpoint's out_dir (repeatable)")
    parser.add_argument("--dataset", default=HERE, help="the prepared Tang dataset whose val split gives the keys")
    parser.add_argument("--keys", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1337)
    parser.add_argument("--show", type=int, default=3, help="answers printed per model and decoding")
    parser.add_argument("--log", default=None, help="append results as JSON lines here")
    args = parser.parse_args(argv)
    keys = held_out_keys(args.dataset, args.keys, args.seed)
    rows = []
    for out_dir in args.out_dir:
        for decoding in DECODINGS:
            t0 = time.time()
            row, texts = evaluate(out_dir, keys, decoding, args.seed)
            row["seconds"] = round(time.time() - t0, 1)
            rows.append(row)
            for k, t in list(zip(keys, texts))[:args.show]:
                print(f"{ACROSTIC}{k} -> {t!r}")
            if args.log:
                with open(args.log, "a", encoding="utf-8") as f:
                    f.write(json.dumps(row, ensure_ascii=False) + "\n")
    print(f"\n{args.keys} acrostic keys from held-out poems\n")
    print("| model | decoding | 句 begin with the key | one 句 length (5 or 7) | 4 句 |")
    print("|---|---|---|---|---|")
    for r in rows:
        kind = "chat" if r["chat"] else "base"
        print(f"| {r['model']} ({kind}) | {r['decoding']} | {r['starts']:.1%} | {r['one_length']:.1%} | {r['whole']:.1%} |")


if __name__ == "__main__":
    run_main(main)
