"""What a text took verbatim from a dataset's training text: its copied spans, where each occurs, the copied share.

    python copies.py --dataset=tangshi --text="春江潮水連海平，海上明月共潮生。"
    python copies.py --dataset=data/mytext --text=FILE:story.txt --json=True
    python copies.py --dataset=data/mytext --build=True      # build the index (again) and exit

The index (train.sa beside train.bin) is built by prepare, or here on first use; sample.py --copies=True,
chat.py --copies=True and serve.py's "copies" field ask the same question of generated text (docs/copies.md).
"""
from nanogpt import program

program.exit_quietly_on_ctrl_c()  # before the slow imports (numpy): Ctrl-C during them exits quietly

# ruff: noqa: E402
import json
import sys
from dataclasses import dataclass

from configurator import parse_args, report_overrides
from nanogpt.copies import Training, dataset_dtype, marked, report, write_index
from nanogpt.dataset import dataset_dir
from nanogpt.errors import UserError
from nanogpt.files import read_named_text
from nanogpt.program import run_main

TEXT_BYTES = 1 << 24  # a text file's most


@dataclass
class CopiesConfig:
    dataset: str = "shakespeare_char"  # data/<dataset>/, or a path to a dataset directory
    text: str = ""  # the text to examine, or FILE:path to read it from a file
    build: bool = False  # build the dataset's index (again, replacing a stale or damaged one) and exit
    json: bool = False  # print the spans as JSON (the form of serve.py's "copies" field)


def main(argv):
    cfg, overrides = parse_args(CopiesConfig, argv)
    report_overrides(overrides, CopiesConfig(), log=lambda line: print(line, file=sys.stderr))
    folder = dataset_dir(cfg.dataset)
    if cfg.build:
        print(f"wrote {write_index(folder, dataset_dtype(folder))}")
        return
    if not cfg.text:
        raise UserError("give the text to examine: --text='...' or --text=FILE:path")
    text = read_named_text(cfg.text[5:], f"--text={cfg.text}", TEXT_BYTES) if cfg.text.startswith("FILE:") else cfg.text
    copies = Training(folder).find(text)
    if cfg.json:
        print(json.dumps(copies.as_dict(), ensure_ascii=False, indent=1))
        return
    print(marked(text, copies, colour=sys.stdout.isatty()))
    print("\n".join(report(copies)))


if __name__ == "__main__":
    run_main(main)
