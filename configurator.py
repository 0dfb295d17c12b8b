"""Typed configuration for every script: dataclass defaults < config files < --key=value.

    python train.py config/shakespeare_char.py --batch_size=32 --compile=False

A config file is plain Python whose top-level assignments set fields. A CLI
item `--key=value` is split on the first '=', parsed with ast.literal_eval
(falling back to the raw string) and converted to the field's type. Unknown
keys and values of the wrong type are errors that say what to do.
"""
import ast
import dataclasses
import difflib
import errno
import inspect
import io
import math
import os
import signal
import sys
import threading
import tokenize
import types
import typing

from errors import UserError  # noqa: F401: scripts' and users' code import it from here too


REPOSITORY = os.path.dirname(os.path.realpath(__file__))


def exit_quietly_on_ctrl_c():
    """Until run_main starts, Ctrl-C ends the program with one line and exit code 130 instead of a
    KeyboardInterrupt traceback from whatever was importing (torch takes seconds). Scripts call it before
    their slow imports; it acts only where the program run is a script of this repository, so a test or
    a program that imports the scripts keeps Python's KeyboardInterrupt."""
    script = getattr(sys.modules.get("__main__"), "__file__", None)
    if (script and os.path.realpath(script).startswith(REPOSITORY + os.sep)
            and threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGINT) is signal.default_int_handler):
        signal.signal(signal.SIGINT, interrupted_while_starting)


def interrupted_while_starting(signum, frame):
    os.write(2, b"interrupted\n")
    os._exit(130)  # at once: nothing is written yet, and a half-done import has nothing to clean up


def run_main(main, argv=None):
    """Run a script's main(argv): a UserError, or an OSError from the machine (disk full, no permission),
    becomes one line on stderr and exit code 2; a second Ctrl-C one line and exit code 130."""
    if signal.getsignal(signal.SIGINT) is interrupted_while_starting:  # from here on, KeyboardInterrupt
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        main(sys.argv[1:] if argv is None else argv)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except OSError as e:
        print(f"error: {describe_os_error(e)}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt as e:
        print(f"interrupted: {e}" if str(e) else "interrupted", file=sys.stderr)
        sys.exit(130)


OS_ERROR_HINTS = {
    errno.ENOSPC: "free some disk space, or write elsewhere",
    errno.EDQUOT: "free some disk space, or write elsewhere",
    errno.EACCES: "check the permissions, or write elsewhere",
    errno.EPERM: "check the permissions, or write elsewhere",
    errno.EROFS: "the file system is read-only: write elsewhere",
    errno.ENOTDIR: "a file stands where a directory is expected: choose another path",
    errno.EEXIST: "a file stands where a directory is expected: choose another path",
    errno.EISDIR: "a directory stands where a file is expected: choose another path",
}


def describe_os_error(e):
    """"cannot access out/ckpt.pt: Permission denied; check the permissions, or write elsewhere"; without a file
    name, "No space left on device; free some disk space, or write elsewhere"."""
    what = f"cannot access {e.filename}: {e.strerror or e}" if e.filename else f"{e.strerror or e}"
    hint = OS_ERROR_HINTS.get(e.errno, "")
    return what + (f"; {hint}" if hint else "")


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
                groups.append((title or (f"model ({klass.__name__})" if klass is not cls else ""), names))
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


def report_overrides(overrides, base, log=print):
    """Print each override once: `override: batch_size = 32 (was 12)`."""
    for key, value in overrides.items():
        old = getattr(base, key)
        if value != old:
            log(f"override: {key} = {value!r} (was {old!r})")


def check_key(key, hints, source):
    if key not in hints:
        close = difflib.get_close_matches(key, hints, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else f"; valid keys: {', '.join(hints)}"
        raise UserError(f"{source}: unknown key '{key}'{hint}")


def read_config_file(path):
    """The top-level names a config file assigns (modules, functions and _private names skipped)."""
    try:
        with open(path, encoding="utf-8-sig") as f:  # -sig: a byte-order mark (Notepad writes one) is no text
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


def convert(value, hint, key, source):
    """value as the field's type, or a UserError naming the key and the expected type."""
    options = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    if value is None:
        if type(None) in options:
            return None
        raise UserError(f"{source}: {key} cannot be None; give a {type_name(hint)}")
    for option in options:
        if option is type(None):
            continue
        try:
            return convert_one(value, option)
        except (TypeError, ValueError):
            continue
    shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
    finite = "a finite " if float in options and isinstance(value, float) else ""
    raise UserError(f"{source}: {key} expects {finite}{type_name(hint)}, got {shown}")


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
    if t is typing.Any:
        return value
    raise TypeError(f"unsupported field type {t}")


def type_name(hint):
    return getattr(hint, "__name__", None) or str(hint).replace("typing.", "")

