"""run_script's fork server (tests/forkserver.py) must run a script as `python script.py` would."""
import os
import subprocess
import sys

import pytest

from conftest import run_script

SCRIPT = """import os, sys
import torch
print("argv", sys.argv[1:], "cwd", os.getcwd(), "env", os.environ.get("PROBE_VALUE"), "pid", os.getpid())
print("path0", sys.path[0], "name", __name__, "threads", torch.get_num_threads())
print("file", __file__, "seed", torch.initial_seed(), "parent", os.getppid())
print("to stderr", file=sys.stderr)
if sys.argv[1] == "fail":
    raise ValueError("planted")
sys.exit(int(sys.argv[1]))
"""


def test_a_script_runs_as_its_own_process_with_its_argv_cwd_env_streams_and_exit_code(tmp_path):
    script = tmp_path / "probe.py"
    script.write_text(SCRIPT)
    work = tmp_path / "work"
    work.mkdir()
    runs = [run_script([str(script), code, "two words"], cwd=work, env={"PROBE_VALUE": code}) for code in "03"]
    for run, code in zip(runs, "03"):
        assert run.returncode == int(code), run.stderr
        assert f"argv ['{code}', 'two words'] cwd {work} env {code} pid " in run.stdout
        assert f"path0 {tmp_path} name __main__ threads {__import__('torch').get_num_threads()}" in run.stdout
        assert run.stderr == "to stderr\n"
        assert f"file {script} seed " in run.stdout  # __file__ absolute, as Python 3.9 on makes it
    pids = {int(run.stdout.split(" pid ")[1].split()[0]) for run in runs}
    assert len(pids) == 2 and os.getpid() not in pids
    seeds = {run.stdout.split(" seed ")[1].split()[0] for run in runs}
    assert len(seeds) == 2  # torch seeds itself afresh in each new process
    failed = run_script([str(script), "fail"], cwd=work)
    assert failed.returncode == 1
    lines = failed.stderr.splitlines()  # the traceback starts at the script, as `python script.py` prints it
    assert lines[:2] == ["to stderr", "Traceback (most recent call last):"]
    assert lines[2].startswith(f'  File "{script}", line ')
    assert lines[-1] == "ValueError: planted"


@pytest.mark.skipif(bool(os.environ.get("NANOGPT_TEST_FRESH_PROCESSES")), reason="the fork server is turned off")
def test_the_server_follows_this_process_when_an_import_writes_into_its_environment(tmp_path, monkeypatch):
    """Imports write startup variables into this process's environment (torch._dynamo TORCHINDUCTOR_CACHE_DIR,
    lm_eval KMP_DUPLICATE_LIB_OK): the server is started again with them, not left for new interpreters ever after."""
    script = tmp_path / "probe.py"
    script.write_text(SCRIPT)
    assert run_script([str(script), "0"]).returncode == 0  # the server is up
    monkeypatch.setenv("KMP_DUPLICATE_LIB_OK", "True")  # as lm_eval's import does
    monkeypatch.setenv("OMP_NUM_THREADS", "2" if os.environ.get("OMP_NUM_THREADS") == "1" else "1")
    run = run_script([str(script), "0"])
    assert run.returncode == 0 and f" parent {os.getpid()}\n" not in run.stdout  # a fork server's child
    assert f"threads {os.environ['OMP_NUM_THREADS']}\n" in run.stdout  # the new server's


def test_a_variable_read_at_startup_gets_a_new_interpreter(tmp_path):
    """The fork server's OpenMP read OMP_NUM_THREADS when it started: a run that sets another gets a new Python."""
    script = tmp_path / "probe.py"
    script.write_text(SCRIPT)
    threads = 1 if __import__("torch").get_num_threads() != 1 else 2
    run = run_script([str(script), "0"], env={"OMP_NUM_THREADS": str(threads)})
    assert run.returncode == 0 and f"threads {threads}" in run.stdout


def test_a_run_past_its_timeout_is_killed_and_raises_as_subprocess_run_does(tmp_path):
    script = tmp_path / "sleep.py"
    script.write_text("import time\nprint('started', flush=True)\ntime.sleep(60)\n")
    with pytest.raises(subprocess.TimeoutExpired) as raised:
        run_script([str(script)], timeout=3)
    assert raised.value.output == b"started\n" and raised.value.cmd == [sys.executable, str(script)]
    assert run_script([str(script)[:-len("sleep.py")] + "missing.py"]).returncode == 2  # and it still serves
