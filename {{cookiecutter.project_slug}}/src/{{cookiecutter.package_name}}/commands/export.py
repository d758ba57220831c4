"""`python -m <pkg> export run_dir=DIR --out FILE|DIR [--format file|hf|peft]`: the model of a
run's newest checkpoint in one file, as a directory transformers loads, or a LoRA run's adapters
as a directory peft loads (checkpoint/export*.py)."""

from __future__ import annotations

import argparse

from ..config_keys import ConfigError
from ..run.atomic import output_path
from .arguments import run_dir_argument


def add_arguments(cmd: argparse.ArgumentParser) -> None:
    cmd.add_argument("run", type=run_dir_argument, metavar="run_dir=DIR", help="the run directory")
    cmd.add_argument(
        "--out",
        type=output_path,
        required=True,
        help="model.pt, model.safetensors, or a new directory",
    )
    cmd.add_argument(
        "--format",
        choices=("file", "hf", "peft"),
        default="file",
        help="file: one state dict (.pt/.safetensors); hf: a directory transformers loads; "
        "peft: a LoRA run's adapters, a directory peft loads onto the base",
    )


# what a file of weights is called; --format hf and peft write a directory
FILE_SUFFIXES = (".pt", ".pth", ".bin", ".safetensors")


def run(args: argparse.Namespace) -> int:
    if args.format != "file" and args.out.suffix.lower() in FILE_SUFFIXES:
        raise ConfigError(
            f"export --format {args.format} writes a directory (transformers and peft load a "
            f"directory), but --out {args.out} names a {args.out.suffix} file: give a directory "
            "name, or --format file for one file"
        )
    if args.format == "hf":
        from ..checkpoint.export_hf import export_hf

        print(f"wrote {export_hf(args.run, args.out)}")
        return 0
    if args.format == "peft":
        from ..checkpoint.export_peft import export_peft

        print(f"wrote {export_peft(args.run, args.out)}")
        return 0
    from ..checkpoint import export_model

    print(f"wrote {export_model(args.run, args.out)}")
    return 0
