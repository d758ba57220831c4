"""`python -m <pkg> export run_dir=DIR --out FILE|DIR [--format file|hf|peft]`: the model of a
run's newest checkpoint in one file, as a directory transformers loads, or a LoRA run's adapters
as a directory peft loads (checkpoint/export.py's EXPORT_FORMATS)."""

from __future__ import annotations

import argparse

from ..checkpoint.export import export_formats
from ..config_keys import ConfigError
from ..run.atomic import output_path
from .arguments import run_dir_argument


def add_arguments(cmd: argparse.ArgumentParser) -> None:
    formats = export_formats()
    cmd.add_argument("run", type=run_dir_argument, metavar="run_dir=DIR", help="the run directory")
    cmd.add_argument(
        "--out",
        type=output_path,
        required=True,
        help="model.pt, model.safetensors, or a new directory",
    )
    cmd.add_argument(
        "--format",
        choices=tuple(formats),
        default="file",
        help="; ".join(f"{f.name}: {f.help}" for f in formats.values()),
    )


# what a file of weights is called; a format that writes a directory refuses it as --out
FILE_SUFFIXES = (".pt", ".pth", ".bin", ".safetensors")


def run(args: argparse.Namespace) -> int:
    chosen = export_formats()[args.format]
    if chosen.loaded_by and args.out.suffix.lower() in FILE_SUFFIXES:
        raise ConfigError(
            f"export --format {args.format} writes a directory ({chosen.loaded_by} loads a "
            f"directory), but --out {args.out} names a {args.out.suffix} file: give a directory "
            "name, or --format file for one file"
        )
    print(f"wrote {chosen.write(args.run, args.out)}")
    return 0
