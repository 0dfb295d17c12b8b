"""Tang poems as the corpus writes them, and the tasks made of them: what data/tangshi/conversations.py writes,
data/tangshi/rewards.py scores and data/tangshi/evaluate.py checks.

A poem is a title line, an author line and its lines; a blank line ends it. A 句 (clause) is the text
between the marks ，。？！； and line ends: the corpus writes two per line. A 絕句 has four 句, a 律詩 eight,
each of five (五言) or seven (七言) characters.
"""
import collections
import itertools
import os
import random
import re

import numpy as np

from nanogpt.errors import UserError
from nanogpt.tokenizer import read_meta, tokenizer_from_meta

CLAUSE_MARKS = "，。？！；"
FORMS = {(4, 5): "五言絕句", (4, 7): "七言絕句", (8, 5): "五言律詩", (8, 7): "七言律詩"}
ACROSTIC = "藏頭詩："


def parse_poems(text):
    """[(title, author, lines)] of the corpus text; pieces without a body are left out."""
    poems = []
    for block in text.split("\n\n"):
        lines = [line for line in block.split("\n") if line.strip()]
        if len(lines) >= 3:
            poems.append((lines[0], lines[1], lines[2:]))
    return poems


def clauses(text):
    """The 句 of a poem's text, in order."""
    return [c for c in re.split(f"[{CLAUSE_MARKS}\n]", text) if c.strip()]


def form(lines):
    """The poem's form name (五言絕句, ..., 七言律詩), or None where its 句 are not 4 or 8 of one length 5 or 7."""
    parts = clauses("\n".join(lines))
    lengths = {len(c) for c in parts}
    return FORMS.get((len(parts), lengths.pop())) if len(lengths) == 1 else None


def conversations(poems):
    """Chat conversations (OpenAI's format) of the poems whose form is regular: the poem for its form and
    title, and as an acrostic; a 律詩's two halves (two lines each, four 句) are acrostics of four too."""
    out = []
    for title, _author, lines in poems:
        name = form(lines)
        if name is None:
            continue
        out.append(chat(f"{name}：{title}", "\n".join(lines)))
        for part in ([lines] + ([lines[:len(lines) // 2], lines[len(lines) // 2:]] if len(lines) == 4 else [])):
            body = "\n".join(part)
            out.append(chat(ACROSTIC + "".join(c[0] for c in clauses(body)), body))
    return out


CLAUSE_START = re.compile(f"(^|[{CLAUSE_MARKS}\n])[^{CLAUSE_MARKS}\n]")  # a 句's first character, and what precedes it


def drawn_acrostics(poems, text, n, seed):
    """n acrostics whose keys are drawn characters: a regular poem of poems with the first character of each 句
    replaced by a character drawn from text, the rarer ones more often (weight count ** -0.5), the key those
    characters in order. The model's head is its embedding: a character it seldom saw has a row it barely
    learned to copy into, and keys of real poems seldom ask for one (docs/chat.md measures it).
    Only text's characters are drawn, from the CJK Unified Ideographs block (not □, the lost-character mark,
    nor punctuation)."""
    counts = collections.Counter(c for c in text if "\u4e00" <= c <= "\u9fff")
    chars = sorted(counts)
    cum_weights = list(itertools.accumulate(counts[c] ** -0.5 for c in chars))
    regular = [lines for _title, _author, lines in poems if form(lines)]
    if n and not (chars and regular):
        raise UserError(f"no poem of a regular form or no Chinese character to draw {n:,} acrostics from; "
                        f"give --drawn=0 or more poems")
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        body = "\n".join(rng.choice(regular))
        key = "".join(rng.choices(chars, cum_weights=cum_weights, k=len(clauses(body))))
        out.append(chat(ACROSTIC + key, CLAUSE_START.sub(lambda m, drawn=iter(key): m.group(1) + next(drawn), body)))
    return out


def chat(user, assistant):
    return {"messages": [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]}


def score_acrostic(key, answer):
    """How an answer meets an acrostic: begins (for each key character, whether the 句 of its place begins
    with it), hits (how many do, of len(key)), one_length (every 句 of one length, 5 or 7) and whole (as many
    句 as characters requested)."""
    parts = clauses(answer)
    lengths = {len(c) for c in parts}
    begins = [i < len(parts) and parts[i].startswith(ch) for i, ch in enumerate(key)]
    return {"begins": begins, "hits": sum(begins), "one_length": len(lengths) == 1 and lengths <= {5, 7},
            "whole": len(parts) == len(key)}


def split_text(dataset, split):
    """The text of a prepared dataset's split, decoded with its own tokenizer."""
    path = os.path.join(dataset, f"{split}.bin")
    meta = read_meta(dataset)
    if meta is None or not os.path.exists(path):
        raise UserError(f"{path} not found; prepare the poems first: python data/tangshi/prepare.py")
    ids = np.fromfile(path, dtype=np.dtype(meta.get("dtype", "uint16")))
    return tokenizer_from_meta(meta).decode(ids.tolist())


def acrostic_keys(text):
    """The acrostic keys (first characters of the first four 句) of the text's poems of a regular form, sorted."""
    return sorted({"".join(c[0] for c in clauses("\n".join(lines))[:4]) for _, _, lines in parse_poems(text)
                   if form(lines)})


def held_out_poems(dataset, n, seed):
    """n (key, poem) of the val split's poems of a regular form: distinct acrostic keys (4 characters) and the
    first poem of each, drawn by the seed."""
    first = {}
    for _, _, lines in parse_poems(split_text(dataset, "val")):
        if form(lines):
            body = "\n".join(lines)
            first.setdefault("".join(c[0] for c in clauses(body)[:4]), body)
    if len(first) < n:
        raise UserError(f"the val split has {len(first)} poems of a regular form, fewer than --keys={n}")
    return [(k, first[k]) for k in random.Random(seed).sample(sorted(first), n)]


def held_out_keys(dataset, n, seed):
    """n acrostic keys (4 characters) from the val split's poems of a regular form."""
    return [k for k, _ in held_out_poems(dataset, n, seed)]


def train_requests(dataset, kinds=("acrostic",)):
    """Requests made of the train split's poems of a regular form, sorted: "acrostic" (藏頭詩：<key>, each
    key once, none that is also a key of a val poem) and "form" (<form>：<title>)."""
    out = set()
    text = split_text(dataset, "train")
    if "acrostic" in kinds:
        held_out = set(acrostic_keys(split_text(dataset, "val")))
        out |= {ACROSTIC + k for k in acrostic_keys(text) if k not in held_out and "□" not in k}  # □: a lost character
    if "form" in kinds:
        out |= {f"{form(lines)}：{title}" for title, _, lines in parse_poems(text) if form(lines) and "□" not in title}
    return sorted(out)
