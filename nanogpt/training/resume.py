"""What a resume takes from a checkpoint's config: its settings as data, never a route to code.

A checkpoint records the config its run trained with, and a resume continues with it. Some keys name
code: a Python file that is imported (rl.py's reward_file), a folder of task files that may import one
(train.py's eval_tasks_include_path: lm-eval's `!function`). A checkpoint may come from anyone, so those
keys are declared with names_code() and a resume takes them only from the user's own config files and
command line; where the checkpoint named one, a note says so and how to pass it.
"""
import dataclasses
import shlex
import typing

from nanogpt.training.distributed import launcher
from nanogpt.values import convert


def names_code(default=None):
    """A config field whose value leads to code (a file imported, exec'd or rendered, or a folder of them)."""
    return dataclasses.field(default=default, metadata={"names_code": True})


def code_keys(cls):
    """The fields of cls declared with names_code()."""
    return {f.name for f in dataclasses.fields(cls) if f.metadata.get("names_code")}


def saved_settings(ckpt, cls, path, given, log, skip=()):
    """The checkpoint's config as cls's typed values, less skip, unknown keys and the keys naming code.

    given: the keys the user's own config files and command line set. A key naming code that the
    checkpoint sets otherwise than cls's default is reported (unless given), never taken."""
    hints = typing.get_type_hints(cls)
    code, defaults = code_keys(cls), {f.name: f.default for f in dataclasses.fields(cls)}
    saved = {}
    for key, value in (ckpt.get("config") or {}).items():
        if key not in hints or key in skip:
            continue
        if key in code:
            if key not in given and value is not None and not (type(value) is type(defaults[key])
                                                                and value == defaults[key]):
                shown = shlex.quote(str(value))[:200]
                log(f"note: {path} names {key}={shown} in its config; a resume takes a key that leads to code only "
                    f"from your own config files or command line, so it runs without it (add --{key}={shown} "
                    f"if you trust that file)")
            continue
        saved[key] = convert(value, hints[key], key, f"{path}: config")
    return saved


def resume_command(program, cfg, world):
    """The command that continues cfg's run as it runs now: its out_dir, and the keys naming code that it sets
    (a resume does not take those from the checkpoint)."""
    defaults = {f.name: f.default for f in dataclasses.fields(cfg)}
    code = [f"--{key}={shlex.quote(str(getattr(cfg, key)))}" for key in sorted(code_keys(type(cfg)))
            if getattr(cfg, key) != defaults[key]]
    return " ".join([launcher(world), program, "--init_from=resume", f"--out_dir={shlex.quote(cfg.out_dir)}", *code])
