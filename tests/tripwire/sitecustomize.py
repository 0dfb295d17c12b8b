"""A tripwire on every loader that can run a file's code: put this directory first on PYTHONPATH and set
TRIPWIRE_LOG to a file. Then pickle.load, pickle.loads, pickle.Unpickler (unless a subclass restricts
find_class) and torch.load with weights_only=False write where they were called from to TRIPWIRE_LOG and
end the process at once (exit code 97), whatever catches exceptions on the way.

Two callers are let through, both unpickling what the job's other processes sent over torch.distributed,
never a file's bytes (dcp_load reads with no_dist): the object collectives (distributed_c10d) and
torchrun's rendezvous (elastic/rendezvous/dynamic_rendezvous).

Code from a file the user did not name ends the process the same way: an audit hook sees every code object
compiled or executed (imports, exec, lm-eval's `!function`), and a file's code may run only from Python's
own installation, the repository's source folders, or a file the command line names (an argument, a
--key=value, or a string in a config file it names). A checkpoint, a dataset or an out_dir is never a
place code comes from. (Extension modules, .so files, are not seen: no route here loads one from a path.)
"""
import os
import sys

LOG = os.environ.get("TRIPWIRE_LOG")
# (file, function) of the callers let through: what runs inside them (the tensors a peer sent) is let through too
ALLOWED = {(os.path.join("torch", "distributed", "distributed_c10d.py"), "_tensor_to_object"),
           (os.path.join("torch", "distributed", "elastic", "rendezvous", "dynamic_rendezvous.py"), "sync")}


def trip(what):
    import traceback
    with open(LOG, "a", encoding="utf-8") as f:
        f.write(f"{what} called in pid {os.getpid()} ({' '.join(sys.argv)}):\n{''.join(traceback.format_stack()[:-2])}\n")
    os._exit(97)


def allowed():
    frame = sys._getframe(2)
    while frame is not None:
        code = frame.f_code
        if any(code.co_filename.endswith(file) and code.co_name == name for file, name in ALLOWED):
            return True
        frame = frame.f_back
    return False


def install():
    import _pickle
    import pickle

    def guarded_class(base):
        class Unpickler(base):
            def __init__(self, *args, **kwargs):
                own = [c for c in type(self).__mro__ if c not in (Unpickler, base, object)]
                if not any("find_class" in vars(c) for c in own) and not allowed():
                    trip(f"{type(self).__module__}.{type(self).__qualname__} (pickle.Unpickler without find_class)")
                super().__init__(*args, **kwargs)
        return Unpickler

    def guard(name, real):
        def guarded(*args, **kwargs):
            if not allowed():
                trip(f"pickle.{name}")
            return real(*args, **kwargs)
        return guarded

    for name in ("load", "loads", "_load", "_loads"):
        setattr(pickle, name, guard(name, getattr(pickle, name)))
    pickle.Unpickler = guarded_class(_pickle.Unpickler)
    pickle._Unpickler = guarded_class(pickle._Unpickler)
    sys.meta_path.insert(0, TorchLoadFinder())
    sys.addaudithook(code_hook)


# the repository's own source: everything else in a checkout (an out_dir, a dataset) is data
SOURCE = ("nanogpt", "data", "tasks", "tests", "config")
decided = {}  # file -> whether its code may run
places = []  # [trusted roots, named files], found on the first file's code
busy = []  # the hook's own imports raise events too: those run unchecked (they are Python's own modules)


read_files = {}  # file read that may not run -> its size: text compiled in memory is compared with these


def code_hook(event, args):
    if busy:
        return
    if event == "open":
        return note_read(*args[:3])
    if event == "exec":
        filename = getattr(args[0], "co_filename", None)
    elif event == "compile":
        filename = args[1] if len(args) > 1 else None
        if isinstance(filename, str) and filename.startswith("<") and isinstance(args[0], (str, bytes)):
            return check_text(args[0])  # exec(open(path).read()): a file's code under a name made in memory
    else:
        return
    if not isinstance(filename, str) or not filename or filename.startswith("<"):  # made in memory
        return
    if checked(filename) is False:
        trip(f"code from {filename}, a file the command line does not name,")


def checked(filename):
    """Whether filename's code may run, decided once per file."""
    if filename not in decided:
        busy.append(1)
        try:
            decided[filename] = may_run(filename)
        finally:
            busy.pop()
    return decided[filename]


def note_read(path, mode, flags):
    """A regular file opened for reading whose code may not run: remembered with its size."""
    reading = ("r" in mode and "+" not in mode) if isinstance(mode, str) else (flags or 0) & os.O_ACCMODE == os.O_RDONLY
    if not isinstance(path, str) or not reading or path in read_files or checked(path):
        return
    busy.append(1)
    try:
        read_files[path] = os.stat(path).st_size if os.path.isfile(path) else None
    except OSError:
        read_files[path] = None
    finally:
        busy.pop()


def check_text(source):
    """Source compiled under a name made in memory: it must not be the text of a file read that may not run."""
    text = source.decode("utf-8", "replace") if isinstance(source, bytes) else source
    if not text.strip():
        return
    busy.append(1)
    try:
        for path, size in list(read_files.items()):
            if size is not None and len(text) <= size <= 4 * len(text) + 3:  # UTF-8: 1 to 4 bytes a character
                with open(path, encoding="utf-8-sig", errors="replace") as f:
                    if f.read() == text:
                        trip(f"code from {path} (its text, compiled in memory), a file the command line does not "
                             f"name,")
    finally:
        busy.pop()


def may_run(filename):
    if not places:
        places.extend([trusted_roots(), named_files()])
    roots, named = places
    path = os.path.realpath(filename)
    return path in named or any(path == root or path.startswith(root + os.sep) for root in roots)


def trusted_roots():
    """Python's installation, the repository's source folders and its programs."""
    import site
    import sysconfig
    repo = os.path.realpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
    roots = {sys.prefix, sys.base_prefix, sys.exec_prefix, site.getusersitepackages(), *site.getsitepackages(),
             *sysconfig.get_paths().values(), *(os.path.join(repo, name) for name in SOURCE),
             *(os.path.join(repo, f) for f in os.listdir(repo) if f.endswith(".py"))}
    return {os.path.realpath(r).rstrip(os.sep) for r in roots if r}


def named_files():
    """Every path the command line names: its arguments, the values of its --key=value items, and the strings
    in the config files among them."""
    import ast
    names = set()
    for item in sys.argv[1:]:
        value = item.partition("=")[2] if item.startswith("--") else item
        names.add(value)
        if value.endswith(".py") and os.path.isfile(value):
            with open(value, encoding="utf-8-sig") as f:
                tree = ast.parse(f.read())
            names.update(n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str))
    return {os.path.realpath(n) for n in names if n and "\x00" not in n}


class TorchLoadFinder:
    """Wraps torch.serialization.load as soon as that module has run (before torch binds it as torch.load)."""

    def find_spec(self, name, path, target=None):
        if name != "torch.serialization":
            return None
        from importlib.machinery import PathFinder
        spec = PathFinder.find_spec(name, path)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            real = module.load

            def load(f, map_location=None, pickle_module=None, *, weights_only=None, **kwargs):
                unsafe = weights_only is False or (weights_only is None and (
                    pickle_module is not None or os.environ.get("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD")))
                if unsafe and not allowed():
                    trip("torch.load(weights_only=False)")
                return real(f, map_location, pickle_module, weights_only=weights_only, **kwargs)
            module.load = load
        spec.loader.exec_module = exec_module
        return spec


if LOG:
    install()
