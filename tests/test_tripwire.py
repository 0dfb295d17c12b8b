"""No reader of a checkpoint reaches a loader that can run a file's code, whatever its route.

Every reader runs on a sharded checkpoint (2 processes, FSDP) under tests/tripwire/sitecustomize.py:
pickle's unrestricted loaders and torch.load(weights_only=False) end the process and say where they
were called from. Then the attacks the tripwire guards against, by hand: a .metadata built of allowed
classes that declares a weight as pickled bytes, and a hostile pickle in place of a byte item DCP holds
(the optimizer's param_groups).
"""
import io
import os
import pickle
import shutil
import subprocess
import sys
import time

import pytest
import torch

from conftest import CORPUS, ROOT, run_script
from test_ddp import TINY

TRIPWIRE = os.path.join(ROOT, "tests", "tripwire")
FSDP = dict(TINY, parallel="fsdp", max_iters=3)


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    """A char dataset and the out_dir of a 2-process FSDP run on it (trained under the tripwire too)."""
    from data.prepare import prepare
    root = tmp_path_factory.mktemp("tripwire")
    (root / "in.txt").write_text(CORPUS)
    prepare(str(root / "in.txt"), "char", str(root / "data"), 0.1, log=lambda *a: None)
    launcher = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "train.py"]
    result = guarded(root, launcher + [f"--{k}={v}" for k, v in FSDP.items()]
                     + [f"--dataset={root / 'data'}", f"--out_dir={root / 'fsdp'}"])
    assert result.returncode == 0 and sorted(os.listdir(root / "fsdp" / "ckpt.dcp")) == [
        ".metadata", "__0_0.distcp", "__1_0.distcp", "meta.pt"], result.stderr[-3000:]
    return root


def guarded(root, args, **kwargs):
    """run_script under the tripwire; fails the test if the tripwire went off."""
    log = root / "tripwire.log"
    log.unlink(missing_ok=True)
    result = run_script(args, env=tripwire_env(log), **kwargs)
    assert not log.exists(), log.read_text()[-4000:]
    return result


def tripwire_env(log):
    return {"PYTHONPATH": os.pathsep.join([TRIPWIRE, os.environ.get("PYTHONPATH", "")]), "TRIPWIRE_LOG": str(log)}


def fresh_copy(sharded, name):
    out = sharded / name
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(sharded / "fsdp", out)
    return out


def eval_task(root):
    from pathlib import Path

    from test_eval import write_task
    write_task(Path(root / "tasks"), "tiny_known", [{"context": "First", "label": 0, "choices": [" C", "ll"]},
                                                   {"context": "All:", "label": 1, "choices": ["e", "\n"]}])
    return ["--tasks=tiny_known", f"--include_path={root / 'tasks'}"]


READERS = {
    "sample.py": lambda root: ["sample.py", "--max_new_tokens=5", "--num_samples=1", "--device=cpu"],
    "trace.py": lambda root: ["trace.py", "--start=the", "--steps=1", "--device=cpu"],
    "export.py": lambda root: ["export.py", f"--hf_dir={root / 'hf'}"],
    "eval.py": lambda root: ["eval.py", "--device=cpu", *eval_task(root)],
    "consolidate.py": lambda root: ["consolidate.py"],
    "train.py resume": lambda root: ["train.py", "--init_from=resume", "--max_iters=4"],
    "train.py resume under torchrun": lambda root: ["-m", "torch.distributed.run", "--standalone",
                                                    "--nproc_per_node=2", "train.py", "--init_from=resume",
                                                    "--max_iters=4"],
}


@pytest.mark.parametrize("reader", READERS)
def test_every_reader_of_a_sharded_checkpoint_runs_no_unrestricted_loader(sharded, reader):
    if reader in ("export.py", "eval.py"):
        pytest.importorskip("transformers" if reader == "export.py" else "lm_eval")
    out = fresh_copy(sharded, "r")
    shutil.rmtree(sharded / "hf", ignore_errors=True)
    result = guarded(sharded, READERS[reader](sharded) + [f"--out_dir={out}"], timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]


def test_chat_py_loads_a_sharded_checkpoint_under_the_tripwire(sharded):
    """chat.py loads the whole model and tokenizer (load_model), then refuses a model without a chat template."""
    out = fresh_copy(sharded, "r")
    result = guarded(sharded, ["chat.py", f"--out_dir={out}", "--device=cpu", "-p", "hi"])
    assert result.returncode == 2 and "has no chat template" in result.stderr, result.stderr[-3000:]


def test_serve_py_loads_a_sharded_checkpoint_under_the_tripwire(sharded):
    out, log = fresh_copy(sharded, "r"), sharded / "tripwire.log"
    log.unlink(missing_ok=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **tripwire_env(log)}
    server = subprocess.Popen([sys.executable, "serve.py", f"--out_dir={out}", "--port=0", "--device=cpu"], cwd=ROOT,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    try:
        lines, deadline = [], time.time() + 120
        while time.time() < deadline:
            line = server.stderr.readline()
            lines.append(line)
            if line.startswith("serving") or not line:
                break
        assert lines[-1].startswith("serving"), "".join(lines)[-3000:]
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert not log.exists(), log.read_text()[-4000:]


def test_the_tripwire_catches_each_unrestricted_loader(tmp_path):
    """The tripwire itself: each loader that can run code ends the process with 97 and says so; a
    find_class-restricted unpickler and torch.load's weights-only default pass."""
    buffer = io.BytesIO()
    torch.save({"a": 1}, buffer)
    (tmp_path / "ok.pt").write_bytes(buffer.getvalue())
    (tmp_path / "obj.pkl").write_bytes(pickle.dumps({"a": 1}))
    calls = {"pickle.loads": "import pickle; pickle.loads(open(P + '/obj.pkl', 'rb').read())",
             "pickle.load": "import pickle; pickle.load(open(P + '/obj.pkl', 'rb'))",
             "pickle.Unpickler": "import pickle; pickle.Unpickler(open(P + '/obj.pkl', 'rb')).load()",
             "pickle._Unpickler": "import pickle; pickle._Unpickler(open(P + '/obj.pkl', 'rb')).load()",
             "numpy allow_pickle": "import numpy, io; b = io.BytesIO(); numpy.save(b, numpy.array([{}]), "
                                   "allow_pickle=True); b.seek(0); numpy.load(b, allow_pickle=True)",
             "torch.load(weights_only=False)": "import torch; torch.load(P + '/ok.pt', weights_only=False)",
             "torch.load(pickle_module=)": "import torch, pickle; torch.load(P + '/ok.pt', pickle_module=pickle)"}
    for name, code in calls.items():
        log = tmp_path / f"{name}.log"
        result = run_script(["-c", f"P = {str(tmp_path)!r}\n{code}"], env=tripwire_env(log))
        assert result.returncode == 97 and "called in pid" in log.read_text(), (name, result.stderr)
    log = tmp_path / "safe.log"
    result = run_script(["-c", f"P = {str(tmp_path)!r}\nimport torch\nfrom nanogpt import tokenizer\ntorch.load(P + '/ok.pt')\n"
                               "tokenizer.load_plain_pickle(open(P + '/obj.pkl', 'rb').read(), 'obj.pkl')"],
                        env=tripwire_env(log))
    assert result.returncode == 0 and not log.exists(), result.stderr


class TouchesMarker:
    """Unpickling this creates the directory marker: what a hostile byte item would do."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.makedirs, (self.marker, 0o777, True)


def append_item(directory, metadata, key, obj):
    """obj torch.save()d at the end of __0_0.distcp, with metadata's storage entry for key pointing at it."""
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import MetadataIndex
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    shard = directory / "__0_0.distcp"
    offset = shard.stat().st_size
    with open(shard, "ab") as f:
        f.write(buffer.getvalue())
    for index in [i for i in metadata.storage_data if i.fqn == key]:
        del metadata.storage_data[index]
    metadata.storage_data[MetadataIndex(key)] = _StorageInfo("__0_0.distcp", offset, len(buffer.getvalue()))


def a_weight_declared_as_bytes(directory, marker):
    """The issue's attack (b): .metadata of allowed classes only, declaring transformer.wte.weight as a
    BytesStorageMetadata that carries the weight's size and properties (so it passes the shape checks), its
    bytes a pickle that runs code."""
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata
    metadata = pickle.loads((directory / ".metadata").read_bytes())  # trusted: the test's own checkpoint
    key = "model.transformer.wte.weight"
    fake = BytesStorageMetadata()
    fake.size, fake.properties = metadata.state_dict_metadata[key].size, metadata.state_dict_metadata[key].properties
    metadata.state_dict_metadata[key] = fake
    append_item(directory, metadata, key, TouchesMarker(str(marker)))
    (directory / ".metadata").write_bytes(pickle.dumps(metadata))


def a_hostile_param_group(directory, marker):
    """The issue's attack (a): .metadata unchanged in kind; one of the optimizer's byte items (a learning
    rate, which DCP stores pickled) now a pickle that runs code."""
    metadata = pickle.loads((directory / ".metadata").read_bytes())
    key = next(k for k in metadata.state_dict_metadata if k.startswith("optimizer.param_groups.") and k.endswith(".lr"))
    append_item(directory, metadata, key, TouchesMarker(str(marker)))
    (directory / ".metadata").write_bytes(pickle.dumps(metadata))


ATTACKED = {  # reader: its arguments
    "sample.py": ["sample.py", "--max_new_tokens=5", "--num_samples=1"],
    "trace.py": ["trace.py", "--start=the", "--steps=1"],
    "consolidate.py": ["consolidate.py"],
    "train.py resume": ["train.py", "--init_from=resume", "--max_iters=4"],
}


@pytest.mark.parametrize("attack,reader", [("weight declared as bytes", r) for r in ATTACKED]
                         + [("hostile param_groups", r) for r in ("consolidate.py", "train.py resume")])
def test_a_crafted_sharded_checkpoint_runs_no_code_and_is_one_line(sharded, attack, reader):
    out, marker = fresh_copy(sharded, "attacked"), sharded / "pwned"
    shutil.rmtree(marker, ignore_errors=True)
    (a_weight_declared_as_bytes if attack == "weight declared as bytes" else a_hostile_param_group)(
        out / "ckpt.dcp", marker)
    before = sorted(os.listdir(out))
    result = run_script(ATTACKED[reader] + [f"--out_dir={out}"], timeout=120)
    assert not marker.exists()
    errors = [line for line in result.stderr.splitlines() if not line.startswith("override:")]
    assert result.returncode == 2 and len(errors) == 1 and "refusing to load" in errors[0], result.stderr[-3000:]
    assert ("declares model.transformer.wte.weight as a BytesStorageMetadata, not a tensor" in errors[0]
            if attack == "weight declared as bytes" else "it is not plain data" in errors[0]), errors[0]
    assert sorted(os.listdir(out)) == before


# --- code named by a checkpoint: a resume imports none of it --------------------------------------------------

MARKER_CODE = "import pathlib\npathlib.Path({marker!r}).write_text('ran')\n"


def test_the_tripwire_ends_code_from_a_file_the_command_line_does_not_name(tmp_path):
    """The audit hook itself: importing a file by its path, or compiling its text, ends the process (97) unless
    the command line names it; the repository's own modules import as always."""
    (tmp_path / "user.py").write_text(MARKER_CODE.format(marker=str(tmp_path / "ran")))
    (tmp_path / "elsewhere").mkdir()
    code = ("import importlib.util, sys\nimport nanogpt.checkpoint\n"
            "spec = importlib.util.spec_from_file_location('user', sys.argv[-1].partition('=')[2])\n"
            "spec.loader.exec_module(importlib.util.module_from_spec(spec))\n")
    log = tmp_path / "unnamed.log"
    result = run_script(["-c", code, f"--x={tmp_path / 'elsewhere' / '..' / 'user.py'}"], env=tripwire_env(log))
    assert result.returncode == 0 and (tmp_path / "ran").exists(), result.stderr  # named (the same file): it runs
    (tmp_path / "ran").unlink()
    result = run_script(["-c", code.replace("sys.argv[-1].partition('=')[2]", repr(str(tmp_path / "user.py")))],
                        env=tripwire_env(log))
    assert result.returncode == 97 and "user.py, a file the command line does not name" in log.read_text()
    assert not (tmp_path / "ran").exists()
    log.unlink()
    result = run_script(["-c", f"import nanogpt.checkpoint\nexec(open({str(tmp_path / 'user.py')!r}).read())"],
                        env=tripwire_env(log))  # the file's text compiled under a name made in memory
    assert result.returncode == 97 and "user.py (its text, compiled in memory)" in log.read_text()
    assert not (tmp_path / "ran").exists()


def test_rl_resume_takes_no_reward_file_from_the_checkpoint(tmp_path):
    """A checkpoint's config naming a reward file (code that writes a marker) is read as data: the resume says so
    in a note and runs without it, under the tripwire; the same file passed on the command line is imported."""
    from rl import rl
    from test_rl import cfg_for, quiet
    root = make_rl_start(tmp_path)
    rl(cfg_for(root, max_iters=2), log=quiet)
    marker, hostile = root / "ran", root / "hostile.py"
    hostile.write_text(MARKER_CODE.format(marker=str(marker)) + (root / "many_a.py").read_text())
    ckpt = torch.load(root / "rl" / "ckpt.pt", weights_only=True)
    ckpt["config"]["reward_file"] = str(hostile)
    torch.save(ckpt, root / "rl" / "ckpt.pt")
    resume = ["rl.py", "--init_from=resume", f"--out_dir={root / 'rl'}", "--max_iters=3"]
    result = guarded(root, resume)
    assert not marker.exists()
    assert result.returncode == 2 and "error: unknown reward 'many_a'" in result.stderr, result.stderr[-3000:]
    assert f"names reward_file={hostile} in its config" in result.stdout + result.stderr
    result = guarded(root, resume + [f"--reward_file={root / 'many_a.py'}"])
    assert result.returncode == 0 and torch.load(root / "rl" / "ckpt.pt", weights_only=True)["iter_num"] == 3, (
        result.stderr[-3000:])


def make_rl_start(tmp_path):
    from nanogpt.checkpoint import model_args
    from test_rl import META, REWARD_FILE, tiny_model
    model = tiny_model()
    (tmp_path / "sft").mkdir()
    torch.save({"model": model.state_dict(), "model_args": model_args(model.config), "iter_num": 0,
                "config": {}, "tokenizer": META}, tmp_path / "sft" / "ckpt.pt")
    (tmp_path / "prompts.txt").write_text("say ab\nsay ba\nsay aa\nsay bb\nsay a\nsay b\n")
    (tmp_path / "many_a.py").write_text(REWARD_FILE)
    return tmp_path


def test_train_resume_takes_no_task_folder_from_the_checkpoint(sharded, tmp_path):
    """A checkpoint's config naming a folder whose task imports a Python file (lm-eval's !function) is read as
    data: the resume names it in a note and looks for the task where the user's own settings say (not found:
    one line), importing nothing, under the tripwire."""
    pytest.importorskip("lm_eval")
    out = tmp_path / "run"
    result = guarded(sharded, ["train.py", *[f"--{k}={v}" for k, v in TINY.items()], f"--dataset={sharded / 'data'}",
                               f"--out_dir={out}", "--max_iters=2"])
    assert result.returncode == 0, result.stderr[-3000:]
    tasks, marker = tmp_path / "tasks", tmp_path / "ran"
    write_task_with_function(tasks, "hostile_task", marker)
    ckpt = torch.load(out / "ckpt.pt", weights_only=True)
    ckpt["config"].update(eval_tasks="hostile_task", eval_tasks_include_path=str(tasks))
    torch.save(ckpt, out / "ckpt.pt")
    result = guarded(sharded, ["train.py", "--init_from=resume", f"--out_dir={out}", "--max_iters=3"])
    assert not marker.exists()
    assert f"names eval_tasks_include_path={tasks} in its config" in result.stdout + result.stderr
    assert result.returncode == 2 and "hostile_task" in result.stderr.strip().splitlines()[-1], result.stderr[-3000:]


def write_task_with_function(directory, name, marker):
    """A task whose results go through a Python file beside it (lm-eval's !function); importing it writes marker."""
    from pathlib import Path

    from test_eval import write_task
    write_task(Path(directory), name, [{"context": "First", "label": 0, "choices": [" C", "ll"]}])
    (directory / "hostile.py").write_text(MARKER_CODE.format(marker=str(marker))
                                          + "def process_results(doc, results):\n    return {'acc': 1.0}\n")
    yaml = directory / f"{name}.yaml"
    yaml.write_text(yaml.read_text() + "process_results: !function hostile.process_results\n")
