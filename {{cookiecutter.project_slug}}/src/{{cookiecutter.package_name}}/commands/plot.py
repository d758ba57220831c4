"""`python -m <pkg> plot run_dir=DIR [--out FILE.png]`: the loss, the evaluation figures (a
classifier's accuracy and top-5) and the throughput from a run's metrics.jsonl (or the file
itself) as a PNG (telemetry/metrics.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..run.atomic import output_path
from .arguments import run_dir_argument


def plot_source(text: str) -> Path:
    """`run_dir=DIR`, or a metrics.jsonl file."""
    return Path(text) if Path(text).is_file() else run_dir_argument(text)


def add_arguments(cmd: argparse.ArgumentParser) -> None:
    cmd.add_argument(
        "path",
        type=plot_source,
        metavar="run_dir=DIR",
        help="the run directory (or a metrics.jsonl)",
    )
    cmd.add_argument("--out", type=output_path, help="PNG file (default: next to metrics.jsonl)")


def run(args: argparse.Namespace) -> int:
    from ..telemetry.metrics import plot

    print(f"wrote {plot(args.path, args.out)}")
    return 0
