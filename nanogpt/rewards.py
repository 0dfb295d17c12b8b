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

The Tang course's rewards (acrostic, form, rhyme, tone and guard, for requests such as 藏頭詩：春江花月 and
七言絕句：登高) live with the course in data/tangshi/rewards.py, which registers them here; rl.py imports it.
"""
import dataclasses
import math
import os
import types
from dataclasses import dataclass

from nanogpt.errors import UserError, nearest
from nanogpt.files import read_named_text

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
    """Run a Python file of @reward functions (a user's own rewards), read as a regular file; a file that does not
    compile, or raises while it runs (an import that fails), is one UserError saying where it broke."""
    what = f"--reward_file={path}"
    if not os.path.exists(path):
        raise UserError(f"{what}: no such file")
    module = types.ModuleType(f"user_rewards_{abs(hash(path))}")
    module.__file__ = path
    try:
        exec(compile(read_named_text(path, what), path, "exec"), module.__dict__)
    except SyntaxError as e:
        raise UserError(f"{what}: line {e.lineno}: syntax error: {e.msg}; fix the file") from None
    except UserError:
        raise
    except Exception as e:  # a reward file is user code: say where it broke, not Python's traceback
        first = (str(e).splitlines() or [""])[0][:200]
        raise UserError(f"{what}: running it raised {type(e).__name__}: {first}; fix the file") from None


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
