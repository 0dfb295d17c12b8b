"""Typed values: a value from a config file, the command line or a checkpoint's model_args, converted to
its dataclass field's type, or a UserError naming the key and the type it expects; and the one line per
value a user set that differs from what it overrides; and a count in words (how_many)."""
import math
import re
import types
import typing

from nanogpt.errors import UserError


def convert(value, hint, key, source):
    """value as the field's type, or a UserError naming the key and the expected type."""
    options = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    if value is None:
        if type(None) in options:
            return None
        raise UserError(f"{source}: {key} cannot be None; give {type_name(hint)}")
    for option in options:
        if option is type(None):
            continue
        try:
            return convert_one(value, option)
        except (TypeError, ValueError):
            continue
    shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
    expected = "a finite number" if float in options and isinstance(value, float) else type_name(hint)
    # a decimal comma: 1,5 reads as the tuple (1, 5); 0,0006 and 0,05 (no Python literal) stay text
    text = (f"{value[0]},{value[1]}" if isinstance(value, tuple) and len(value) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) for v in value) else value)
    comma = float in options and isinstance(text, str) and re.fullmatch(r"-?\d+,\d+", text.strip())
    hint_decimal = f" (a decimal is written with a point: {text.strip().replace(',', '.')})" if comma else ""
    raise UserError(f"{source}: {key} expects {expected}, got {shown}{hint_decimal}")


def convert_one(value, t):
    if t is bool:
        if isinstance(value, bool):
            return value
        text = str(value)
        if text in ("True", "true", "1"):
            return True
        if text in ("False", "false", "0"):
            return False
        raise ValueError(value)
    if t is int:
        if isinstance(value, bool):
            raise TypeError(value)
        if isinstance(value, float) and value.is_integer():  # 1e4 iters
            return int(value)
        if isinstance(value, int):
            return value
        raise TypeError(value)
    if t is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            try:
                value = float(value)
            except OverflowError:  # an int beyond float's range
                raise ValueError(value) from None
            if not math.isfinite(value):  # no setting means nan or inf
                raise ValueError(value)
            return value
        raise TypeError(value)
    if t is str:
        if isinstance(value, str):
            return value
        raise TypeError(value)
    if typing.get_origin(t) is list:
        (item,) = typing.get_args(t)
        items = [value] if isinstance(value, (str, int)) else value
        if not isinstance(items, (list, tuple)):
            raise TypeError(value)
        return [convert_one(v, item) if typing.get_origin(item) is None else v for v in items]
    if typing.get_origin(t) is dict:  # {198: -100}; a key of digits as text ("198", as JSON writes it) is an int
        key, item = typing.get_args(t)
        if not isinstance(value, dict):
            raise TypeError(value)
        return {convert_one(int(k) if key is int and isinstance(k, str) and k.strip().isdigit() else k, key):
                convert_one(v, item) for k, v in value.items()}
    if t is typing.Any:
        return value
    raise TypeError(f"unsupported field type {t}")


PLAIN_NAMES = {int: "an integer", float: "a number", bool: "True or False", str: "a string"}


def type_name(hint):
    """What a field takes, in words a user reads in an error: 'a number', not 'float | None' (None is every
    optional field's default, not a value to suggest)."""
    options = [t for t in typing.get_args(hint) if t is not type(None)] \
        if typing.get_origin(hint) in (typing.Union, types.UnionType) else [hint]
    if all(t in PLAIN_NAMES for t in options):
        return " or ".join(PLAIN_NAMES[t] for t in options)
    if typing.get_origin(hint) is dict:  # the keys' and values' types say what it maps
        return str(hint).replace("typing.", "")
    return getattr(hint, "__name__", None) or str(hint).replace("typing.", "")


def report_overrides(overrides, base, log=print):
    """Print each override once: `override: batch_size = 32 (was 12)`."""
    for key, value in overrides.items():
        old = getattr(base, key)
        if value != old:
            log(f"override: {key} = {value!r} (was {old!r})")


def how_many(n, noun):
    """n of noun in words: "one process", "2 processes", "one thread", "4 threads"."""
    return f"one {noun}" if n == 1 else f"{n} {noun}{'es' if noun.endswith('s') else 's'}"
