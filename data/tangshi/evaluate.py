"""How well each stage of the Tang model writes acrostic poems (藏頭詩) for keys it has never seen.

    python data/tangshi/evaluate.py --out_dir=out-tangshi-rl --out_dir=out-tangshi-sft --out_dir=out-tangshi \
        --base=out-tangshi [--keys=200] [--log=eval.jsonl]
    python data/tangshi/evaluate.py --out_dir=http://127.0.0.1:8000/v1 --base=out-tangshi   # as served (serve.py)

Keys are the first characters of the 句 of held-out poems (the prepared dataset's val split, which
data/tangshi/conversations.py and rl.py never read): four characters each, from poems of a regular form. Each model
answers every key greedily (temperature 0) and sampled (sample.py's and chat.py's defaults: temperature
0.8, every token kept).
A chat model (fine-tuned, or improved by rl.py) is asked through its template; a base model is given
the same request as plain text and a line break, and its poem ends at the first blank line.
Each answer is checked as rl.py's rewards check it (rewards.py, verse.py: the 平水韻 dictionary): the share
of 句 that begin with their key character; the shares of answers of the asked form (4 句 of one length 5 or
7), whose even 句 rhyme, whose 平仄 follow a pattern, and that pass all four; distinct characters per
answer; the share with a repeated 句; how many 平水韻 groups the rhyming answers use between them, and the share
of answers that are another answer but for their key characters (a policy that answers every key with one
template shows in both); the share with a stock 句, one that 5% of the answers have but for its first character
(a policy narrowing to a few lines shows here first); the share of each answer's characters in spans found
verbatim in the train split ("copied": 7 characters or more, nanogpt/copies.py), against the held-out poems' own
share, the chance a fresh poem has (stock lines, poems collected twice); and with --base, the fluency cost:
the pretrained model's loss per character on the answers (a reward-hacked answer reads badly to it). The held-out poems themselves are
checked the same way (the human reference). A second table counts the 句 that miss their key by how often
the key character occurs in the train split: a character the model seldom saw is the hardest to copy.
Appends each row as a JSON line to --log.
"""
import argparse
import collections
import concurrent.futures
import json
import os
import sys
import time
import urllib.error
import urllib.request

import torch
from tqdm import tqdm

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
from data.tangshi.poems import ACROSTIC, clauses, form, held_out_poems, score_acrostic, split_text  # noqa: E402
from data.tangshi.rewards import verse_report  # noqa: E402
from data.tangshi.verse import rhyme_group  # noqa: E402
from nanogpt.copies import Training  # noqa: E402
from nanogpt.errors import UserError  # noqa: E402
from nanogpt.generate import Sampling, generate  # noqa: E402
from nanogpt.program import run_main  # noqa: E402
from nanogpt.source import Source, load_model  # noqa: E402
from nanogpt.tokenizer import ChatTokenizer  # noqa: E402

# sampled: the defaults of sample.py, chat.py and the server (temperature 0.8, every token kept)
DECODINGS = {"greedy": dict(temperature=0.0), "sampled": dict(temperature=Sampling.temperature, top_k=Sampling.top_k)}
MAX_NEW_TOKENS = 80  # a 七言絕句 is 34 characters; a 律詩 of 8 is 68
COUNT_BINS = ((0, 10, "under 10"), (10, 50, "10-49"), (50, 200, "50-199"), (200, 1000, "200-999"),
              (1000, float("inf"), "1,000+"))  # a key character's count in the train split


def load(out_dir, device):
    """The model (eval mode) and tokenizer of out_dir's ckpt.pt, through the loader every program uses."""
    return load_model(Source(out_dir=out_dir), device)


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


def fluency_cost(base, tokenizer, texts, batch=50):
    """The base model's mean loss per character (nats) on texts, each read after a line break."""
    total, count = 0.0, 0
    for i in range(0, len(texts), batch):
        rows = [tokenizer.encode("\n" + t)[:base.config.block_size + 1] for t in texts[i:i + batch]]
        T = max(len(r) for r in rows) - 1
        x = torch.zeros(len(rows), T, dtype=torch.long)
        y = torch.full((len(rows), T), -1, dtype=torch.long)
        for j, r in enumerate(rows):
            x[j, :len(r) - 1], y[j, :len(r) - 1] = torch.tensor(r[:-1]), torch.tensor(r[1:])
        with torch.no_grad():
            _, loss = base(x, y)
        n = int((y >= 0).sum())
        total, count = total + loss.item() * n, count + n
    return total / max(count, 1)


def rates(keys, texts, requests=None):
    """The checker's figures of the answers (the requests default to the keys' acrostics)."""
    requests = requests or [ACROSTIC + k for k in keys]
    reports = [verse_report(r, t) for r, t in zip(requests, texts)]
    n = len(texts)
    passed = [{name: rep[name] == 1 for name in ("form", "rhyme", "tone")} for rep in reports]
    hits = sum(score_acrostic(k, t)["hits"] for k, t in zip(keys, texts))
    return {"n": n, "starts": hits / sum(len(k) for k in keys),
            "acrostic": sum(score_acrostic(k, t)["hits"] == len(k) for k, t in zip(keys, texts)) / n,
            **{name: sum(p[name] for p in passed) / n for name in ("form", "rhyme", "tone")},
            "all": sum(score_acrostic(k, t)["hits"] == len(k) and all(p.values())
                       for k, t, p in zip(keys, texts, passed)) / n,
            "distinct": sum(rep["distinct"] for rep in reports) / n,
            "repeated": sum(rep["repeated"] > 0 for rep in reports) / n,
            "groups": len({rhyme_group(clauses(t)) for t, p in zip(texts, passed) if p["rhyme"]}),
            "alike": alike(texts), "stock": stock(texts)}


def stock(texts, share=0.05):
    """The share of answers with a stock 句: one that, but for its first character (a key), is in at least
    share of the answers (and in 2 or more). A policy that narrows to a few lines it knows score shows here
    before whole answers are alike."""
    frames = [{c[1:] for c in clauses(t)} for t in texts]
    counts = collections.Counter(f for answer in frames for f in answer)
    floor = max(2, share * len(texts))
    return sum(any(counts[f] >= floor for f in answer) for answer in frames) / max(len(texts), 1)


def missed_by_count(keys, texts, counts):
    """{bin's name: [句 that miss their key character, 句 asked]} by the key character's count (COUNT_BINS)."""
    out = {name: [0, 0] for _, _, name in COUNT_BINS}
    for key, text in zip(keys, texts):
        for ch, begins in zip(key, score_acrostic(key, text)["begins"]):
            name = next(name for low, high, name in COUNT_BINS if low <= counts[ch] < high)
            out[name][0] += not begins
            out[name][1] += 1
    return out


def alike(texts):
    """The share of answers that, but for the first character of each 句 (an acrostic's key), are another answer
    word for word: one template for every key."""
    frames = ["".join(c[1:] for c in clauses(t)) for t in texts]
    counts = collections.Counter(frames)
    return sum(counts[f] > 1 for f in frames) / max(len(texts), 1)


def api_answers(url, keys, decoding, seed, api_key=None, workers=8):
    """(the served model's id, each key's answer) through an OpenAI chat API (serve.py's): the request a chat
    model is asked in process, with the same settings and key i's seed (seed + i), several at a time."""
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {api_key}"} if api_key else {})}

    def call(path, body=None):
        request = urllib.request.Request(url.rstrip("/") + path, headers=headers, method="POST" if body else "GET",
                                         data=json.dumps(body).encode() if body else None)
        try:
            with urllib.request.urlopen(request, timeout=600) as response:
                return json.load(response)
        except urllib.error.HTTPError as e:
            raise UserError(f"{url}{path} answered {e.code}: {e.read().decode(errors='replace')[:300]}") from None
        except (urllib.error.URLError, OSError) as e:
            raise UserError(f"cannot reach {url} ({getattr(e, 'reason', e)}); start the server first: python serve.py "
                            f"--out_dir=out-tangshi-sft, then --api=http://127.0.0.1:8000/v1") from None
    model = call("/models")["data"][0]["id"]
    settings = {k: v for k, v in DECODINGS[decoding].items() if v is not None}

    def answer(i):
        body = {"model": model, "messages": [{"role": "user", "content": ACROSTIC + keys[i]}],
                "max_tokens": MAX_NEW_TOKENS, "seed": seed + i, **settings}
        return call("/chat/completions", body)["choices"][0]["message"]["content"]
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        texts = list(tqdm(pool.map(answer, range(len(keys))), total=len(keys), desc=decoding, unit="key", disable=None))
    return model, texts


def evaluate(out_dir, keys, decoding, seed=1337, batch=50, device="cpu", base=None, api_key=None, training=None):
    """The row of one model and decoding (rates' figures, "model", "chat", "decoding", "fluency", "copied") and the
    answers; out_dir may be an http(s) URL: a chat model served with OpenAI's API. training: where copies are
    looked for (the train split's nanogpt.copies.Training), or None."""
    if out_dir.startswith(("http://", "https://")):
        name, texts = api_answers(out_dir, keys, decoding, seed, api_key)
        row = {"model": f"{name} at {out_dir}", "chat": True, "decoding": decoding, **rates(keys, texts)}
    else:
        model, tokenizer = load(out_dir, device)
        with torch.no_grad():
            texts = answers(model, tokenizer, keys, decoding, seed, batch)
        row = {"model": out_dir, "chat": isinstance(tokenizer, ChatTokenizer), "decoding": decoding,
               **rates(keys, texts)}
    if base is not None:
        row["fluency"] = fluency_cost(*base, texts)
    if training is not None:
        row["copied"] = training.mean_copied(texts)
    return row, texts


def reference(poems, base=None, training=None):
    """The held-out poems' own row: each checked against its own form (a 律詩's eight 句 for a 律詩); their copied
    share is the chance baseline (human poems the models never saw, against the train split)."""
    keys, texts = [k for k, _ in poems], [p for _, p in poems]
    requests = [f"{form(p.split(chr(10)))}：" for p in texts]
    row = {"model": "held-out poems", "chat": False, "decoding": "-", **rates(keys, texts, requests)}
    if base is not None:
        row["fluency"] = fluency_cost(*base, texts)
    if training is not None:
        row["copied"] = training.mean_copied(texts)
    return row


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out_dir", action="append", required=True,
                        help="a checkpoint's out_dir, or the URL of a chat model served with OpenAI's API "
                             "(http://127.0.0.1:8000/v1: serve.py's); repeatable")
    parser.add_argument("--api_key", default=None, help="the key a served model asks for (serve.py --api_key)")
    parser.add_argument("--base", default=None, help="the pretrained model's out_dir, for the fluency cost")
    parser.add_argument("--dataset", default=HERE, help="the prepared Tang dataset whose val split gives the keys")
    parser.add_argument("--keys", type=int, default=200,
                        help="how many acrostic keys each model answers, drawn from the val split's poems (default: 200)")
    parser.add_argument("--seed", type=int, default=1337,
                        help="which keys are drawn, and the sampled answers: key i is sampled with seed + i (default: 1337)")
    parser.add_argument("--decoding", action="append", choices=list(DECODINGS), help="default: both")
    parser.add_argument("--show", type=int, default=3, help="answers printed per model and decoding")
    parser.add_argument("--log", default=None, help="append results as JSON lines here")
    args = parser.parse_args(argv)
    poems = held_out_poems(args.dataset, args.keys, args.seed)
    keys = [k for k, _ in poems]
    base = load(args.base, "cpu") if args.base else None
    counts = collections.Counter(split_text(args.dataset, "train"))
    training = Training(args.dataset)  # its train split's index (built on first use if prepare wrote none)
    rows = [reference(poems, base, training)]
    for out_dir in args.out_dir:
        for decoding in args.decoding or DECODINGS:
            t0 = time.time()
            row, texts = evaluate(out_dir, keys, decoding, args.seed, base=base, api_key=args.api_key,
                                  training=training)
            row["seconds"] = round(time.time() - t0, 1)
            row["missed_by_count"] = missed_by_count(keys, texts, counts)
            rows.append(row)
            for k, t in list(zip(keys, texts))[:args.show]:
                print(f"{ACROSTIC}{k} -> {t!r}")
    if args.log:
        with open(args.log, "a", encoding="utf-8") as f:
            f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    print(f"\n{args.keys} acrostic keys from held-out poems\n")
    print("| model | decoding | 句 begin with the key | form | rhyme | tone | all four | distinct chars | "
          "repeated 句 | rhyme groups | alike | stock 句 | copied | fluency cost |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        kind = "" if r["model"] == "held-out poems" else " (chat)" if r["chat"] else " (base)"
        fluency = f"{r['fluency']:.3f}" if "fluency" in r else "-"
        print(f"| {r['model']}{kind} | {r['decoding']} | {r['starts']:.1%} | {r['form']:.1%} | {r['rhyme']:.1%} | "
              f"{r['tone']:.1%} | {r['all']:.1%} | {r['distinct']:.1f} | {r['repeated']:.1%} | {r['groups']} | "
              f"{r['alike']:.1%} | {r['stock']:.1%} | {r['copied']:.1%} | {fluency} |")
    print("\n句 that miss their key, by how often the key character occurs in the train split\n")
    print("| model | decoding | " + " | ".join(f"{name} times" for _, _, name in COUNT_BINS) + " |")
    print("|---|---|" + "---|" * len(COUNT_BINS))
    for r in rows[1:]:
        missed = " | ".join(f"{m} of {n}" for m, n in r["missed_by_count"].values())
        print(f"| {r['model']} | {r['decoding']} | {missed} |")


if __name__ == "__main__":
    run_main(main)
