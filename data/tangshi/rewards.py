"""The Tang course's rewards, registered by name with nanogpt.rewards (rl.py imports this module):
acrostic, form, rhyme, tone (verse.py: the 平水韻 dictionary) and guard, for the requests of poems.py
(藏頭詩：春江花月, 七言絕句：登高). The request format, the 句 and the acrostic rule are poems.py's; this module
only scores them.
"""
import re
from collections import Counter

from data.tangshi.poems import ACROSTIC, CLAUSE_MARKS, FORMS, clauses, score_acrostic
from data.tangshi.verse import regular, rhyme_score, tone_score
from nanogpt.rewards import reward

FORM_NAMES = {name: shape for shape, name in FORMS.items()}  # 七言絕句 -> (4, 7): the shape a form request asks for
EMPTY_CLAUSE = re.compile(f"^[{CLAUSE_MARKS}]|[{CLAUSE_MARKS}]\\s*[{CLAUSE_MARKS}]")
MAX_REPEATS = 3  # a character more often than this in one answer reads as padding (the corpus: see docs/rl.md)


def acrostic_key(request):
    return request[len(ACROSTIC):] if request.startswith(ACROSTIC) else None


@reward("acrostic")
def acrostic(request, answer):
    """The share of the key's characters that begin their 句; None for a request that is not an acrostic."""
    key = acrostic_key(request)
    if not key:
        return None
    return score_acrostic(key, answer)["hits"] / len(key)


@reward("form")
def form(request, answer):
    """1 for as many 句 as asked, each of the asked length (an acrostic: one per key character, all of 5 or all
    of 7); else the share of the conditions met."""
    key = acrostic_key(request)
    if key:
        met = score_acrostic(key, answer)
        return (met["whole"] + met["one_length"]) / 2
    name = request.partition("：")[0]
    if name not in FORM_NAMES:
        return None
    count, length = FORM_NAMES[name]
    parts = clauses(answer)
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
