"""One argument style for every subcommand, and the older spellings still accepted.

The style: a directory a command works on is named like a config key, `run_dir=DIR` (and
`data_dir=DIR` for doctor), the same spelling `train` takes, so one command line can be copied
from `train` to `generate`, `export`, `doctor` and `plot`; everything else is an `--option`.
Options and `key=value` items may come in any order (`train run_dir=x --config c.toml
dataset=y`), and `--config` may be repeated (the files merge in order).

Older spellings are accepted for one more release, each with a one-line note on stderr saying
the new one: `doctor --run-dir DIR --data-dir DIR`, `plot RUN_DIR`, `generate DIR`, `export DIR`,
and `--run-dir DIR` for any command.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

# The directory settings written key=value, and the option doctor's own parser reads for each.
DIRECTORY_KEYS = {"run_dir": "--run-dir", "data_dir": "--data-dir"}
POSITIONAL_RUN_DIR = {"generate": "run", "export": "run", "plot": "path"}  # the parsers' dests


def note_old_form(old: str, new: str) -> None:
    print(
        f"note: `{old}` is the old spelling, accepted until the next release; use `{new}`",
        file=sys.stderr,
    )


def _dashed_to_key(argv: list[str], command: str) -> list[str]:
    """`--run-dir DIR` / `--run-dir=DIR` -> `run_dir=DIR` (and likewise `--data-dir`)."""
    options = {option: key for key, option in DIRECTORY_KEYS.items()}
    result, i = [], 0
    while i < len(argv):
        name, eq, value = argv[i].partition("=")
        if name in options and (eq or i + 1 < len(argv)):
            if not eq:
                value, i = argv[i + 1], i + 1
            key = options[name]
            note_old_form(f"{command} {name} {value}", f"{command} {key}={value}")
            result.append(f"{key}={value}")
        else:
            result.append(argv[i])
        i += 1
    return result


def doctor_argv(argv: list[str]) -> list[str]:
    """doctor's arguments for its own parser: `run_dir=DIR` -> `--run-dir DIR`."""
    result = []
    for item in _dashed_to_key(argv, "doctor"):
        key, eq, value = item.partition("=")
        if eq and key in DIRECTORY_KEYS:
            result += [DIRECTORY_KEYS[key], value]
        else:
            result.append(item)
    return result


def subcommand_parsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    # argparse keeps each subcommand's parser in the `choices` of the subparsers action.
    for action in parser._actions:
        if isinstance(action.choices, dict) and action.dest == "command":
            return dict(action.choices)
    return {}


def parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """Parse `argv` (argv[0] is the subcommand) with options and `key=value` in any order."""
    command, rest = argv[0], list(argv[1:])
    if command == "doctor":  # doctor parses its own options
        return argparse.Namespace(command="doctor", doctor_argv=doctor_argv(rest))
    sub = subcommand_parsers(parser).get(command)
    if sub is None:  # --help, or an unknown command (argparse's message)
        return parser.parse_args(argv)
    rest = _dashed_to_key(rest, command)
    args = sub.parse_intermixed_args(rest, argparse.Namespace(command=command))
    dest = POSITIONAL_RUN_DIR.get(command)  # generate, export, plot: the run directory
    value = getattr(args, dest) if dest else "run_dir="
    if not value.startswith("run_dir=") and not (command == "plot" and Path(value).is_file()):
        note_old_form(f"{command} {value}", f"{command} run_dir={value}")
    return args
