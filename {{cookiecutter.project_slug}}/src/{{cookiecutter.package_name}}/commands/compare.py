"""`python -m <pkg> compare run_dir=A run_dir=B ... [--out FILE.png]`: runs side by side, one
table and one PNG (telemetry/compare.py)."""

from __future__ import annotations

import argparse

from ..run.atomic import output_path
from .arguments import run_dir_argument


def add_arguments(cmd: argparse.ArgumentParser) -> None:
    cmd.add_argument(
        "runs", type=run_dir_argument, nargs="+", metavar="run_dir=DIR", help="two runs or more"
    )
    help = "PNG file, or a directory for compare.png (default: the first run's directory)"
    cmd.add_argument("--out", type=output_path, help=help)


def run(args: argparse.Namespace) -> int:
    from ..telemetry.compare import compare

    text, out = compare(args.runs, args.out)
    print(f"{text}\nwrote {out}")
    return 0
