"""Typed configuration for every program: dataclass defaults < config files < --key=value.

configurator.py, at the repository's top where nanoGPT's users look for it, is this module's entrance.

    python train.py config/shakespeare_char.py --batch_size=32 --compile=False

A config file is plain Python whose top-level assignments set fields. A CLI
item `--key=value` is split on the first '=', parsed with ast.literal_eval
(falling back to the raw string) and converted to the field's type. Unknown
keys and values of the wrong type are errors that say what to do.
"""
import ast
import dataclasses
import inspect
import io
import sys
import tokenize
import types
import typing

from nanogpt.errors import UserError, nearest
from nanogpt.files import open_regular
from nanogpt.values import convert


def parse_args(cls, argv):
    """Build cls from config files and --key=value items, in order.

    Returns (config, overrides): overrides maps each key set by a file or the
    CLI to its final value, in the order first set.
    """
    hints = typing.get_type_hints(cls)
    if "-h" in argv or "--help" in argv:
        print(help_text(cls))
        raise SystemExit(0)
    overrides = {}
    for item in argv:
        if item.startswith("--"):
            key, sep, text = item[2:].partition("=")
            source = f"--{key}"
            if not sep:
                raise UserError(f"{item}: expected --{key}=VALUE, with '=' and no spaces")
            check_key(key, hints, source)
            overrides[key] = convert(parse_literal(text, hints[key]), hints[key], key, source)
        else:
            for key, value in read_config_file(item).items():
                check_key(key, hints, item)
                overrides[key] = convert(value, hints[key], key, item)
    try:
        cfg = cls(**overrides)
    except ValueError as e:
        raise UserError(str(e)) from None
    return cfg, {key: getattr(cfg, key) for key in overrides}  # as the config holds them (--stop's escapes read)


def help_text(cls, doc=None):
    """The script's docstring, then every key with its default and comment, grouped as in cls
    (and, for fields cls takes from a dataclass it extends, as there)."""
    main = sys.modules.get("__main__")
    doc = doc if doc is not None else (getattr(main, "__doc__", None) or "")
    script = getattr(main, "__file__", None)
    name = f"python {script.rsplit('/', 1)[-1]}" if script else "python SCRIPT.py"
    lines = [f"usage: {name} [CONFIG_FILE ...] [--key=value ...]", ""]
    if doc.strip():
        lines += [doc.strip(), ""]
    lines += ["Config files (plain Python assignments) and --key=value items apply in order, over these defaults:"]
    groups, comments, listed = [], {}, set()
    for klass in cls.__mro__:  # the class's own fields, then those it takes from a dataclass it extends
        if not dataclasses.is_dataclass(klass):
            continue
        own_groups, own_comments = field_layout(klass)
        for title, names in own_groups:
            names = [n for n in names if n not in listed]
            if names:
                title = title or (f"model ({klass.__name__})" if klass is not cls else "")
                same = [g for g in groups if g[0] == title] if klass is not cls and title else []
                if same:  # an extended class's group of a title already shown (system: device, dtype) joins it
                    same[0][1].extend(names)
                else:
                    groups.append((title, names))
                listed.update(names)
        comments = {**own_comments, **comments}
    defaults = {f.name: (f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default)
                for f in dataclasses.fields(cls)}
    for title, names in groups:
        lines.append("")
        if title:
            lines.append(f"{title}:")
        for key in names:
            item = f"  --{key}={defaults[key]!r}"
            lines.append(f"{item:<40} {comments[key]}".rstrip() if comments.get(key) else item)
    return "\n".join(lines)


def field_layout(cls):
    """([(group title, [field names])], {field: comment}) read from cls's source, in order."""
    try:
        source = inspect.getsource(cls)
    except (OSError, TypeError):
        return [("", [f.name for f in dataclasses.fields(cls)])], {}
    names = {f.name for f in dataclasses.fields(cls)}
    comments_by_line = {tok.start[0]: tok.string.lstrip("# ").strip()
                        for tok in tokenize.generate_tokens(io.StringIO(source).readline) if tok.type == tokenize.COMMENT}
    groups, comments, title = [("", [])], {}, []
    for number, line in enumerate(source.splitlines(), start=1):
        stripped = line.strip()
        key = stripped.split(":", 1)[0].strip()
        if stripped.startswith("#"):
            title.append(stripped.lstrip("# ").strip())
        elif key in names and ":" in stripped:
            if title:
                groups.append((" ".join(title), []))
                title = []
            groups[-1][1].append(key)
            if number in comments_by_line:
                comments[key] = comments_by_line[number]
        elif stripped.startswith("def "):
            break
        else:
            title = []
    return [g for g in groups if g[1]], comments


def check_key(key, hints, source):
    if key not in hints:
        hint = nearest(key, hints) or f"; valid keys: {', '.join(hints)}"
        raise UserError(f"{source}: unknown key '{key}'{hint}")


def read_config_file(path):
    """The top-level names a config file assigns (modules, functions and _private names skipped)."""
    try:
        # a regular file only: a FIFO would wait forever; -sig: a byte-order mark (Notepad writes one) is no text
        with open_regular(path, "r", encoding="utf-8-sig") as f:
            source = f.read()
    except UnicodeDecodeError as e:
        raise UserError(f"config file {path} is not UTF-8 text (bad byte at offset {e.start}); save it as UTF-8") from None
    except FileNotFoundError:
        hint = " (CLI overrides need a leading --, e.g. --batch_size=32)" if "=" in path else ""
        raise UserError(f"config file {path} not found{hint}") from None
    except OSError as e:
        raise UserError(f"config file {path} cannot be read: {e.strerror}") from None
    namespace = {}
    try:
        exec(compile(source, path, "exec"), namespace)
    except SyntaxError as e:
        raise UserError(f"{path}:{e.lineno}: syntax error: {e.msg}") from None
    except Exception as e:  # a config file is user code; report where it broke
        raise UserError(f"{path}: running it raised {type(e).__name__}: {e}") from None
    return {k: v for k, v in namespace.items()
            if not k.startswith("_") and not isinstance(v, (types.ModuleType, types.FunctionType, type))}


def parse_literal(text, hint):
    """A CLI value: a Python literal where it is one, else the raw string."""
    if hint is str:  # out_dir=123 is the directory "123", not an int
        return text
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text
