"""The arguments several commands share: the run directory written like a config key
(`run_dir=DIR`), and a config file with `key=value` overrides."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..config_keys import ConfigError, split_assignment


def run_dir_argument(text: str) -> Path:
    """`run_dir=DIR`, the spelling of the training overrides."""
    try:
        key, value = split_assignment(text)
    except ConfigError:
        key, value = "", ""
    if key != "run_dir" or not value:
        raise argparse.ArgumentTypeError(f"expected run_dir=DIR, got {text[:80]!r}")
    return Path(value)


def add_config_arguments(cmd: argparse.ArgumentParser) -> None:
    cmd.add_argument(
        "--config",
        type=Path,
        action="append",
        help="TOML file, e.g. configs/tiny.toml; repeat it to merge several, in order",
    )
    cmd.add_argument(
        "overrides",
        nargs="*",
        metavar="key=value",
        help="override config keys, e.g. max_steps=100 run_dir=runs/a",
    )
