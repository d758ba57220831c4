"""The inputs `make-dataset` turns into datasets, one option each: `--stdlib`, `--text`,
`--tokens` (text_files.py), `--hf` (hf_datasets.py): token shards (tokens.py writes them);
`--images` (images.py): an ImageFolder packed into image shards; `--chat` (chat.py):
conversations; `--x --y` (arrays.py): the classifier's arrays, also what make-dataset writes
when no other source is named. An input format of your own is one module in this folder with a
`SOURCES` tuple and its name in SOURCE_MODULES below: one line (docs/data.md, "Your own input
format").
"""

from __future__ import annotations

import argparse
import functools
import importlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..config_keys import integer_option

SOURCE_MODULES = (
    {%- if cookiecutter.workload in ["all", "language"] %}
    "text_files",  # --stdlib, --text (byte tokens), --tokens (ids from any tokenizer)
    "hf_datasets",  # --hf: Hugging Face datasets and tokenizers (the [data] extra)
    {%- endif %}
    {%- if cookiecutter.workload in ["all", "images"] %}
    "images",  # --images: an ImageFolder packed into shards (the [vision] extra)
    {%- endif %}
    {%- if cookiecutter.workload in ["all", "language"] %}
    "chat",  # --chat: conversations rendered with a chat template (the [hf] extra)
    {%- endif %}
    "arrays",  # --x --y: the classifier's arrays, or synthetic ones (no source named)
)
DEFAULT_SOURCE = "--x"  # make-dataset --out DIR alone: synthetic arrays for model=mlp


def token_summary(index: dict, args: argparse.Namespace) -> str:
    """make-dataset's line after writing token shards."""
    return (
        f"wrote {index['train']['tokens']} training and {index['val']['tokens']} validation "
        f"tokens (vocabulary {index['vocab_size']}) to {args.out}; train with dataset={args.out}"
    )


@dataclass(frozen=True)
class DatasetSource:
    """One make-dataset option. `add_arguments(make, group)` adds `option` to `group` (the
    mutually exclusive sources) and any options of its own to `make`; `write(args)` writes the
    dataset at `args.out` (token shards: with `tokens.write_shards`) and returns its index;
    `summary(index, args)` is the line make-dataset prints then. Errors are `DatasetError`s, one
    line naming the file."""

    option: str
    add_arguments: Callable[[argparse.ArgumentParser, Any], None]
    write: Callable[[argparse.Namespace], dict]
    summary: Callable[[dict, argparse.Namespace], str] = token_summary

    @property
    def dest(self) -> str:
        return self.option.lstrip("-").replace("-", "_")


@functools.cache
def sources() -> dict[str, DatasetSource]:
    """Every registered source by option (loaded on first use: the modules import this one)."""
    found: dict[str, DatasetSource] = {}
    for module in SOURCE_MODULES:
        for source in importlib.import_module(f".{module}", __package__).SOURCES:
            if source.option in found:
                raise ImportError(
                    f"two dataset sources use {source.option} (make_dataset/{module}.py)"
                )
            found[source.option] = source
    return found


def default_workers() -> int:
    """The cores this task may use: SLURM_CPUS_PER_TASK under Slurm, else the CPU affinity."""
    cpus = os.environ.get("SLURM_CPUS_PER_TASK", "")
    if cpus.isdigit() and int(cpus) > 0:
        return int(cpus)
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def format_seconds(seconds: float) -> str:
    """A writer's progress: h:mm:ss."""
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes // 60}:{minutes % 60:02d}:{secs:02d}"


def add_arguments(make: argparse.ArgumentParser) -> Any:
    """Every source's options, and --workers, which the writers share; returns the sources'
    mutually exclusive group."""
    make.add_argument(
        "--workers",
        type=integer_option,
        help="parallel workers of the writers that use them (threads or processes; default: "
        "SLURM_CPUS_PER_TASK, else the CPUs given)",
    )
    group = make.add_mutually_exclusive_group()
    for source in sources().values():
        source.add_arguments(make, group)
    return group


def chosen(args: argparse.Namespace) -> DatasetSource:
    """The source the command line names (argparse allows one), else DEFAULT_SOURCE."""
    named = (s for s in sources().values() if getattr(args, s.dest, None))
    return next(named, sources()[DEFAULT_SOURCE])
