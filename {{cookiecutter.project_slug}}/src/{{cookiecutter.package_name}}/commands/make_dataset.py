"""`python -m <pkg> make-dataset SOURCE-OPTION ... --out DIR`: a dataset directory, from the
input its option names (make_dataset/sources.py lists them; none: the classifier's arrays)."""

from __future__ import annotations

import argparse

from ..run.atomic import output_path


def add_arguments(cmd: argparse.ArgumentParser) -> None:
    from ..make_dataset import sources

    cmd.add_argument("--out", type=output_path, required=True, help="directory to write")
    sources.add_arguments(cmd)  # --stdlib, --text, --tokens, --hf, --images, --chat, --x, yours


def run(args: argparse.Namespace) -> int:
    from ..make_dataset import sources

    source = sources.chosen(args)
    print(source.summary(source.write(args), args))
    return 0
