"""Command line: `python -m <pkg> [train|benchmark|make-dataset|plot] ...`.

Exit status: 0 done, 3 stopped to be requeued (checkpoint written), 2 configuration error,
1 any other failure.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from .config import ConfigError, load_config
from .distributed import LaunchError

log = logging.getLogger(__package__)

COMMANDS = ("train", "benchmark", "make-dataset", "plot")
PROG = f"python -m {__package__}"


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description="DDP training on CPU or GPU.")
    sub = parser.add_subparsers(dest="command", metavar="{train,benchmark,make-dataset,plot}")
    for name, text in (
        ("train", "train, or resume from the newest checkpoint (default)"),
        ("benchmark", "time the training step against a bare loop (JSON)"),
    ):
        cmd = sub.add_parser(name, help=text, description=text)
        cmd.add_argument("--config", type=Path, help="TOML file, e.g. configs/default.toml")
        cmd.add_argument(
            "overrides",
            nargs="*",
            metavar="key=value",
            help="override config keys, e.g. max_steps=100 run_dir=runs/a",
        )
    make = sub.add_parser("make-dataset", help="write a memmap dataset directory")
    make.add_argument("--out", type=Path, required=True, help="directory to write")
    make.add_argument("--x", type=Path, help="inputs .npy (N, features); default: synthetic")
    make.add_argument("--y", type=Path, help="integer labels .npy (N,)")
    make.add_argument("--samples", type=int, default=16384, help="synthetic: number of samples")
    make.add_argument("--features", type=int, default=64, help="synthetic: input features")
    make.add_argument(
        "--classes", type=int, help="number of classes (synthetic: 10; .npy: max label + 1)"
    )
    make.add_argument("--seed", type=int, default=1234, help="synthetic: seed")
    plot = sub.add_parser("plot", help="PNG of loss and throughput from metrics.jsonl")
    plot.add_argument("path", type=Path, help="run directory or metrics.jsonl")
    plot.add_argument("--out", type=Path, help="PNG file (default: next to metrics.jsonl)")
    return parser


def make_dataset(args: argparse.Namespace) -> int:
    import numpy as np

    from .data import synthetic_arrays, write_dataset

    if (args.x is None) != (args.y is None):
        raise ConfigError("make-dataset needs both --x and --y, or neither (synthetic data)")
    if args.x is not None:
        x, y = np.load(args.x, mmap_mode="r"), np.load(args.y, mmap_mode="r")
        classes = args.classes  # None: the largest label + 1
    else:
        classes = args.classes or 10
        x, y = synthetic_arrays(args.samples, args.features, classes, args.seed)
    out = write_dataset(args.out, x, y, classes)
    print(f"wrote {len(x)} samples x {x.shape[1]} features to {out} (use it with dataset={out})")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or (argv[0] not in COMMANDS and argv[0] not in ("-h", "--help")):
        argv.insert(0, "train")  # `python -m <pkg> --config ... key=value` trains
    args = make_parser().parse_args(argv)
    if not logging.getLogger(__package__).handlers:
        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    try:
        if args.command == "make-dataset":
            return make_dataset(args)
        if args.command == "plot":
            from .metrics import plot

            try:
                print(f"wrote {plot(args.path, args.out)}")
            except (RuntimeError, OSError) as err:  # no matplotlib, no metrics file
                print(f"{PROG} plot: {err}", file=sys.stderr)
                return 1
            return 0
        cfg = load_config(args.config, args.overrides)
        if args.command == "benchmark":
            from .benchmark import main as run_benchmark

            return run_benchmark(cfg)
        from .train import train

        return train(cfg)
    except ConfigError as err:
        print(f"{PROG}: config error: {err}", file=sys.stderr)
        return 2
    except LaunchError as err:
        print(f"{PROG}: launch error: {err}", file=sys.stderr)
        return 1
    except Exception:
        logging.getLogger(__package__).exception("failed")
        return 1
