"""`python -m <pkg> [train] --config FILE key=value ...`: train, or resume from the newest
checkpoint in run_dir (the same command does both; the loop: training/loop.py)."""

from __future__ import annotations

import argparse

from .arguments import add_config_arguments


def add_arguments(cmd: argparse.ArgumentParser) -> None:
    add_config_arguments(cmd)
    cmd.add_argument(
        "--job-default",
        action="append",
        default=[],
        metavar="key=value",
        help="a value below every config file: how the job scripts give dataset its default",
    )


def run(args: argparse.Namespace) -> int:
    from ..config.settings import load_config
    from ..training.loop import train

    return train(*load_config(args.config, args.overrides, args.job_default))
