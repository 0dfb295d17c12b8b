"""A tripwire on every loader that can run a file's code: put this directory first on PYTHONPATH and set
TRIPWIRE_LOG to a file. Then pickle.load, pickle.loads, pickle.Unpickler (unless a subclass restricts
find_class) and torch.load with weights_only=False write where they were called from to TRIPWIRE_LOG and
end the process at once (exit code 97), whatever catches exceptions on the way.

Two callers are let through, both unpickling what the job's other processes sent over torch.distributed,
never a file's bytes (dcp_load reads with no_dist): the object collectives (distributed_c10d) and
torchrun's rendezvous (elastic/rendezvous/dynamic_rendezvous).
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
