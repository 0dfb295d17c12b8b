"""nanoGPT's configurator, typed: dataclass defaults < config files < --key=value, for every program.

    python train.py config/shakespeare_char.py --batch_size=32 --compile=False

A config file is plain Python whose top-level assignments set fields; a `--key=value` item is split on the
first '=', read as a Python literal where it is one and converted to the field's type. An unknown key or a
value of the wrong type is one line that says what to do. The machinery lives in nanogpt/settings.py, where
the library reads a recipe too; the programs and your own scripts import it from here.
"""
from nanogpt.errors import UserError
from nanogpt.settings import check_key, help_text, parse_args, parse_literal, read_config_file
from nanogpt.values import convert, report_overrides

# what the programs and users' scripts import from here
__all__ = ["UserError", "check_key", "convert", "help_text", "parse_args", "parse_literal", "read_config_file",
           "report_overrides"]
