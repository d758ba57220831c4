"""One argument style for every subcommand.

A directory a command works on is named like a config key, `run_dir=DIR` (and `data_dir=DIR` for
doctor), the same spelling `train` takes, so one command line can be copied from `train` to
`generate`, `export`, `doctor` and `plot`; everything else is an `--option`. Options and
`key=value` items may come in any order (`train run_dir=x --config c.toml dataset=y`), and
`--config` may be repeated (the files merge in order).
"""

from __future__ import annotations

import argparse

# The directory settings written key=value, and the option doctor's own parser reads for each.
DIRECTORY_KEYS = {"run_dir": "--run-dir", "data_dir": "--data-dir"}


def doctor_argv(argv: list[str]) -> list[str]:
    """doctor's arguments for its own parser: `run_dir=DIR` -> `--run-dir DIR`."""
    result = []
    for item in argv:
        key, eq, value = item.partition("=")
        if eq and key in DIRECTORY_KEYS:
            result += [DIRECTORY_KEYS[key], value]
        else:
            result.append(item)
    return result


def parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """Parse `argv` (argv[0] is the subcommand) with options and `key=value` in any order.
    `parser.subcommands` maps each subcommand to its parser (cli.make_parser sets it)."""
    command, rest = argv[0], list(argv[1:])
    if command == "doctor":  # doctor parses its own options
        return argparse.Namespace(command="doctor", doctor_argv=doctor_argv(rest))
    sub = parser.subcommands.get(command)
    if sub is None:  # --help, or an unknown command (argparse's message)
        return parser.parse_args(argv)
    return sub.parse_intermixed_args(rest, argparse.Namespace(command=command))
