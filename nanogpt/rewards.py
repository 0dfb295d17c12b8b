"""Rewards: plain functions of a request and an answer that return a score in [0, 1], found by name.

    from nanogpt.rewards import reward

    @reward("thou")
    def thou(request, answer):
        '''Shakespeare's second person: 1 when the answer says thou, thee or thy.'''
        return float(any(w in answer.lower().split() for w in ("thou", "thee", "thy")))

rl.py --reward=acrostic,form,rhyme:2,tone combines the named rewards as a weighted mean (weights after
a colon, 1 by default); a *gate* (guard, or any reward named with :gate) multiplies the mean instead, so
a hacked answer scores 0 whatever else it meets. A reward returns None where it does not apply to the request (acrostic for a
request that is not one): it is left out of that answer's mean. rl.py --reward_file=my_rewards.py
imports a file of @reward functions before the names are looked up.

Built in, for the Tang requests of data/tangshi/poems.py (藏頭詩：春江花月, 七言絕句：登高): acrostic,
form, rhyme, tone (verse.py: the 平水韻 dictionary) and guard.
"""
import dataclasses
import importlib.util
import math
import os
import re
from collections import Counter
from dataclasses import dataclass

from nanogpt.errors import UserError, nearest
from nanogpt.verse import regular, rhyme_score, tone_score

REGISTRY = {}  # name -> Reward


@dataclass(frozen=True)
class Reward:
    name: str
    fn: object
    gate: bool = False  # multiplies the weighted mean of the others instead of joining it


def reward(name, gate=False):
    """Register fn(request, answer) -> float in [0, 1] (or None: does not apply) under name."""
    def register(fn):
        REGISTRY[name] = Reward(name, fn, gate)
        return fn
    return register


def load_reward_file(path):
    """Import a Python file of @reward functions (a user's own rewards)."""
    if not os.path.isfile(path):
        raise UserError(f"--reward_file={path}: no such file")
    spec = importlib.util.spec_from_file_location(f"user_rewards_{abs(hash(path))}", path)
    spec.loader.exec_module(importlib.util.module_from_spec(spec))


def parse_rewards(spec):
    """[(Reward, weight)] of 'acrostic:gate,rhyme:2,...' (a weight, or gate: the reward multiplies the others'
    mean, as guard always does); an unknown name is a UserError naming the nearest."""
    out = []
    for item in filter(None, (s.strip() for s in spec.split(","))):
        name, _, weight = item.partition(":")
        if name not in REGISTRY:
            raise UserError(f"unknown reward {name!r}{nearest(name, REGISTRY, cutoff=0.0)}; the rewards are "
                            f"{', '.join(sorted(REGISTRY))}")
        if weight == "gate":  # any reward may gate: it then multiplies the mean of the others
            out.append((dataclasses.replace(REGISTRY[name], gate=True), 1.0))
            continue
        try:
            w = float(weight) if weight else 1.0
        except ValueError:
            raise UserError(f"reward {item!r}: after ':' give a weight (a number) or gate, got {weight!r}") from None
        if not (w > 0 and math.isfinite(w)):
            raise UserError(f"reward {item!r}: the weight must be a finite number above 0, got {weight}")
        out.append((REGISTRY[name], w))
    if not out:
        raise UserError(f"--reward names no reward; the rewards are {', '.join(sorted(REGISTRY))}")
    return out


def score(rewards, request, answer):
    """(total, {name: score}) of one answer. A reward that raises or returns anything but a number in [0, 1]
    (or None) is a UserError naming the reward and the request."""
    parts, total, weights, gate = {}, 0.0, 0.0, 1.0
    for r, w in rewards:
        try:
            value = r.fn(request, answer)
        except Exception as e:
            raise UserError(f"reward {r.name!r} raised {type(e).__name__}: {e} on the request {request!r}") from None
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:  # NaN fails too
            raise UserError(f"reward {r.name!r} returned {value!r}, not a number in [0, 1], on the request {request!r}")
        parts[r.name] = float(value)
        if r.gate:
            gate *= value
        else:
            total, weights = total + w * value, weights + w
    return gate * (total / weights if weights else 1.0), parts


# --- the Tang requests ---------------------------------------------------------------------------------

ACROSTIC = "藏頭詩："
FORM_NAMES = {"五言絕句": (4, 5), "七言絕句": (4, 7), "五言律詩": (8, 5), "七言律詩": (8, 7)}
CLAUSE = re.compile("[，。？！；\n]")
EMPTY_CLAUSE = re.compile("^[，。？！；]|[，。？！；]\\s*[，。？！；]")
MAX_REPEATS = 3  # a character more often than this in one answer reads as padding (the corpus: see docs/rl.md)


def clauses(text):
    """The 句 of an answer (as data/tangshi/poems.clauses)."""
    return [c for c in CLAUSE.split(text) if c.strip()]


def acrostic_key(request):
    return request[len(ACROSTIC):] if request.startswith(ACROSTIC) else None


@reward("acrostic")
def acrostic(request, answer):
    """The share of the key's characters that begin their 句; None for a request that is not an acrostic."""
    key = acrostic_key(request)
    if not key:
        return None
    parts = clauses(answer)
    return sum(i < len(parts) and parts[i].startswith(ch) for i, ch in enumerate(key)) / len(key)


@reward("form")
def form(request, answer):
    """1 for as many 句 as asked, each of the asked length (an acrostic: one per key character, all of 5 or all
    of 7); else the share of the conditions met."""
    parts = clauses(answer)
    key = acrostic_key(request)
    if key:
        count, lengths = len(key), {len(p) for p in parts}
        return ((len(parts) == count) + (len(lengths) == 1 and lengths <= {5, 7})) / 2
    name = request.partition("：")[0]
    if name not in FORM_NAMES:
        return None
    count, length = FORM_NAMES[name]
    return ((len(parts) == count) + (bool(parts) and all(len(p) == length for p in parts))) / 2


@reward("rhyme")
def rhyme(request, answer):
    """verse.rhyme_score: the even 句 end in one level-tone rhyme group (the first may join)."""
    return rhyme_score(clauses(answer))


@reward("tone")
def tone(request, answer):
    """verse.tone_score: each 句 follows its 平仄 pattern (with the licence of the odd positions)."""
    return tone_score(clauses(answer))


@reward("guard", gate=True)
def guard(request, answer):
    """0 for an answer that games the others: a repeated 句, a character more than MAX_REPEATS times, a rhyme
    character used twice (重韻: the even 句 ending alike would rhyme for free), or an empty 句 (two marks in a
    row, or one first: punctuation as padding)."""
    parts = clauses(answer)
    chars = Counter(ch for p in parts for ch in p)
    rhymes = [p[-1] for p in parts[1::2]]
    return float(len(set(parts)) == len(parts) and max(chars.values(), default=0) <= MAX_REPEATS
                 and len(set(rhymes)) == len(rhymes) and not EMPTY_CLAUSE.search(answer.strip()))


def verse_report(request, answer):
    """The evaluation's view of one answer: each built-in reward's score, and the counts beside them."""
    parts = clauses(answer)
    return {"acrostic": acrostic(request, answer), "form": form(request, answer), "regular": regular(parts),
            "rhyme": rhyme(request, answer), "tone": tone(request, answer),
            "distinct": len(set("".join(parts))), "repeated": len(parts) - len(set(parts))}
