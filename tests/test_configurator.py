"""Typed configuration: precedence, unknown keys, type conversion, errors."""
from dataclasses import dataclass, field

import pytest

from configurator import UserError, parse_args, report_overrides


@dataclass
class Demo:
    learning_rate: float = 6e-4
    batch_size: int = 12
    compile: bool = True
    out_dir: str = "out"
    top_k: int | None = 200
    start: str = "\n"
    stop: list[str | int] = field(default_factory=list)


def write(tmp_path, text, name="cfg.py"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_defaults_then_files_then_cli(tmp_path):
    a = write(tmp_path, "batch_size = 32\nout_dir = 'from-a'\n", "a.py")
    b = write(tmp_path, "batch_size = 64\n", "b.py")
    cfg, overrides = parse_args(Demo, [a, b, "--out_dir=cli"])
    assert (cfg.batch_size, cfg.out_dir, cfg.learning_rate) == (64, "cli", 6e-4)
    assert overrides == {"batch_size": 64, "out_dir": "cli"}


def test_config_file_unknown_key_suggests_match(tmp_path):
    path = write(tmp_path, "learning_rat = 1e-3\n")
    with pytest.raises(UserError, match=r"cfg.py: unknown key 'learning_rat' \(did you mean 'learning_rate'\?\)"):
        parse_args(Demo, [path])


def test_cli_unknown_key_suggests_match():
    with pytest.raises(UserError, match=r"--batchsize: unknown key 'batchsize' \(did you mean 'batch_size'\?\)"):
        parse_args(Demo, ["--batchsize=3"])


def test_int_is_a_fine_float_and_types_convert():
    cfg, _ = parse_args(Demo, ["--learning_rate=1", "--batch_size=1e3", "--compile=false", "--top_k=None"])
    assert cfg.learning_rate == 1.0 and isinstance(cfg.learning_rate, float)
    assert cfg.batch_size == 1000 and cfg.compile is False and cfg.top_k is None


@pytest.mark.parametrize("text, value", [("True", True), ("true", True), ("1", True), ("False", False),
                                         ("false", False), ("0", False)])
def test_bools_from_words_and_digits(text, value):
    assert parse_args(Demo, [f"--compile={text}"])[0].compile is value


@pytest.mark.parametrize("item, match", [("--compile=yes", "compile expects True or False"),
                                         ("--batch_size=2.5", "batch_size expects an integer"),
                                         ("--batch_size=None", "batch_size cannot be None"),
                                         ("--learning_rate=fast", "learning_rate expects a number"),
                                         ("--batch_size", "expected --batch_size=VALUE, with '=' and no spaces")])
def test_wrong_types_are_errors(item, match):
    with pytest.raises(UserError, match=match):
        parse_args(Demo, [item])


def test_value_containing_equals_and_strings_stay_strings():
    cfg, _ = parse_args(Demo, ["--start=a=b=c", "--out_dir=123"])
    assert cfg.start == "a=b=c" and cfg.out_dir == "123"


def test_list_fields_take_literals_or_single_values():
    assert parse_args(Demo, ["--stop=['\\n\\n', 50256]"])[0].stop == ["\n\n", 50256]
    assert parse_args(Demo, ["--stop=END"])[0].stop == ["END"]


def test_config_file_errors_say_where(tmp_path):
    with pytest.raises(UserError, match="config file nope.py not found"):
        parse_args(Demo, ["nope.py"])
    with pytest.raises(UserError, match="need a leading --"):
        parse_args(Demo, ["batch_size=3"])
    bad = write(tmp_path, "batch_size = = 3\n")
    with pytest.raises(UserError, match=r"cfg.py:1: syntax error"):
        parse_args(Demo, [bad])


def test_config_file_with_a_byte_order_mark_reads_as_python_runs_it(tmp_path):
    """Notepad saves UTF-8 with a byte-order mark and CRLF line ends; Python runs such a file, so do we."""
    import runpy
    path = tmp_path / "win.py"
    path.write_bytes("\ufeffbatch_size = 3  # caf\u00e9\r\nout_dir = 'd\u00e9j\u00e0'\r\n".encode("utf-8"))
    cfg, _ = parse_args(Demo, [str(path)])
    ran = runpy.run_path(str(path))
    assert (cfg.batch_size, cfg.out_dir) == (ran["batch_size"], ran["out_dir"]) == (3, "d\u00e9j\u00e0")


def test_config_files_may_import_and_compute(tmp_path):
    path = write(tmp_path, "import math\n_base = 8\nbatch_size = _base * 4\nlearning_rate = math.sqrt(1e-6)\n")
    cfg, _ = parse_args(Demo, [path])
    assert cfg.batch_size == 32 and cfg.learning_rate == pytest.approx(1e-3)


def test_each_override_is_printed_once(tmp_path):
    path = write(tmp_path, "batch_size = 32\n")
    _, overrides = parse_args(Demo, [path, "--batch_size=48", "--out_dir=out"])
    lines = []
    report_overrides(overrides, Demo(), lines.append)
    assert lines == ["override: batch_size = 48 (was 12)"]


@pytest.mark.parametrize("script, keys", [
    ("train.py", {"batch_size=12": "micro-batch size, per process", "n_head=12": "attention heads per block",
                  "learning_rate=0.0006": "AdamW's peak learning rate"}),
    ("sample.py", {"temperature=0.8": "0 greedy", "stop=[]": "token ids that end a sample"}),
    ("trace.py", {"html=None": "attention heatmaps"}),
    ("export.py", {"hf_dir=''": "--format=hf: the directory to write", "format='hf'": "a Hugging Face directory"}),
    ("bench.py", {"gen_batch=8": "sequences decoded together"}),
])
@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_lists_every_key_with_its_default_and_comment_and_exits_0(script, keys, flag):
    from conftest import run_script
    result = run_script([script, flag])
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"usage: python {script} [CONFIG_FILE ...] [--key=value ...]")
    lines = result.stdout.splitlines()
    for key, comment in keys.items():
        line = next(line for line in lines if line.strip().startswith(f"--{key} ") or line.strip() == f"--{key}")
        assert comment in line, line


def test_help_groups_keys_as_the_dataclass_does():
    from configurator import help_text
    from train import TrainConfig
    text = help_text(TrainConfig, doc="")
    groups = [line for line in text.splitlines() if line.endswith(":") and not line.startswith(("  ", "Config"))]
    assert groups[:2] == ["I/O:", "data:"] and groups[-1] == "model (GPTConfig):"  # the fields it extends, last
    assert text.index("\ndata:\n") < text.index("--dataset=") < text.index("\noptimizer:")
    assert text.index("\nmodel (GPTConfig):\n") < text.index("--n_layer=12 ")
    assert text.count("\n  --") == len(TrainConfig.__dataclass_fields__)  # every key once


def test_help_shows_inherited_keys_in_the_group_of_their_title():
    """device and dtype come from nanogpt.device's Device and Dtype, each a "# system" group: train.py's help
    shows one system group, its own keys and the inherited two."""
    from configurator import help_text
    from train import TrainConfig
    text = help_text(TrainConfig, doc="")
    assert text.count("\nsystem:\n") == 1
    system = text.split("\nsystem:\n")[1].split("\n\n")[0]
    assert "--compile=None" in system and "--device='auto'" in system and "--dtype='auto'" in system
