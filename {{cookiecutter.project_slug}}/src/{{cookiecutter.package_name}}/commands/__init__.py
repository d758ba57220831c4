"""The commands of `python -m <pkg>`, as a table: one `Command` each, with its name, its line of
help, and whether it writes files. A command is one module in this folder, named after it
(`make-dataset`: make_dataset.py), with two functions: `add_arguments(parser)` adds its arguments
(a command that parses its own, doctor, has `own_arguments(argv)` instead) and `run(args)` runs
it and returns the exit status. The table imports a command's module only
when that command runs, so a command line loads only its own parser and modules (`train` never
imports the dataset writers), and `--help` lists every command from this table alone. A command
of your own is one module here and one entry in COMMANDS.

One argument style for every command: a directory a command works on is named like a config key,
`run_dir=DIR` (and `data_dir=DIR` for doctor), the spelling `train` takes, so one command line can
be copied from `train` to `generate`, `export`, `doctor` and `plot`; everything else is an
`--option`. Options and `key=value` items may come in any order (`train run_dir=x --config c.toml
dataset=y`), and `--config` may be repeated (the files merge in order).
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

PROG = f"python -m {__package__.rpartition('.')[0]}"


@dataclass(frozen=True)
class Command:
    """`name`: what the command line types; its module is commands/<name, - as _>.py.
    `writes_files`: it writes through temporary names, so a stop signal must let it remove them
    (cli.Stopped). `own_parser`: the command parses its own arguments (doctor): its `run` finds
    them in `args.argv`, as its module's `own_arguments(argv)` gives them."""

    name: str
    help: str
    writes_files: bool = False
    own_parser: bool = False

    def module(self) -> ModuleType:
        return importlib.import_module(f".{self.name.replace('-', '_')}", __package__)

    @property
    def add_arguments(self) -> Callable[[argparse.ArgumentParser], None] | None:
        """The module's function that adds the command's arguments; None: it parses its own."""
        return None if self.own_parser else self.module().add_arguments

    def run(self, args: argparse.Namespace) -> int:
        return self.module().run(args)


COMMANDS = {
    command.name: command
    for command in (
        {%- if cookiecutter.workload != "program" %}
        Command("train", "train, or resume from the newest checkpoint (default)"),
        Command("benchmark", "time the training step against a bare loop (JSON)"),
        {%- endif %}
        Command(
            "doctor", "check this node's environment, then all-reduce bandwidth", own_parser=True
        ),
        {%- if cookiecutter.workload != "program" %}
        Command("make-dataset", "write a dataset directory", writes_files=True),
        {%- if cookiecutter.workload in ["all", "language"] %}
        Command("train-tokenizer", "train a byte-level BPE tokenizer on text", writes_files=True),
        Command("generate", "sample text from a run's newest checkpoint"),
        Command(
            "evaluate",
            "loss, bits per token and perplexity of a run or a Hugging Face dir (JSON)",
        ),
        {%- else %}
        Command("evaluate", "loss and accuracy of a run's newest checkpoint (JSON)"),
        {%- endif %}
        Command(
            "export",
            "the model of a run's newest checkpoint: one file{{ ', or a Hugging Face dir' if cookiecutter.workload in ['all', 'language'] else '' }}",
            writes_files=True,
        ),
        Command("plot", "PNG of loss and throughput from metrics.jsonl"),
        Command("compare", "runs side by side: one table, one PNG"),
        Command("keys", "every config key of every registered model (markdown table)"),
        Command("plan", "GPU memory and step time of the run under each layout, before a job"),
        {%- endif %}
    )
}


def commands_parser() -> argparse.ArgumentParser:
    """`python -m <pkg> --help`: every command with its line of help, none of their arguments."""
    {%- if cookiecutter.workload == "program" %}
    description = "The job scripts' preflight check (your own program runs through them)."
    {%- else %}
    description = "Training on CPU or GPU."
    {%- endif %}
    parser = argparse.ArgumentParser(prog=PROG, description=description)
    sub = parser.add_subparsers(dest="command", metavar="{" + ",".join(COMMANDS) + "}")
    for command in COMMANDS.values():
        sub.add_parser(command.name, help=command.help)
    return parser


def parse(argv: list[str]) -> argparse.Namespace:
    """Parse `argv` (argv[0] is the command) with options and `key=value` in any order; only that
    command's parser is built. A ConfigError names a `key=value` item that is not one."""
    command, rest = COMMANDS[argv[0]], argv[1:]
    if command.add_arguments is None:
        return argparse.Namespace(command=command.name, argv=command.module().own_arguments(rest))
    parser = argparse.ArgumentParser(prog=f"{PROG} {command.name}")
    command.add_arguments(parser)
    return parser.parse_intermixed_args(rest, argparse.Namespace(command=command.name))
