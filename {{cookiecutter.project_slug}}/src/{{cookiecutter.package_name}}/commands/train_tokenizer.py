"""`python -m <pkg> train-tokenizer (--text FILE... | --hf SOURCE) --vocab-size V --out FILE`: a
byte-level BPE tokenizer trained on your text (make_dataset/tokenizer.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..config_keys import integer_option
from ..run.atomic import output_path


def add_arguments(cmd: argparse.ArgumentParser) -> None:
    """The same sources as make-dataset, text files or --hf (JSONL/parquet/CSV files or folders,
    hub datasets) with --split and --column."""
    source = cmd.add_mutually_exclusive_group(required=True)
    source.add_argument("--text", type=Path, nargs="+", metavar="FILE", help="text files")
    source.add_argument(
        "--hf", metavar="SOURCE", help="as make-dataset --hf: a data file, folder or hub name"
    )
    cmd.add_argument("--split", default="train", help="with --hf: the split (default: train)")
    cmd.add_argument("--column", default="text", help="with --hf: the text column (default: text)")
    cmd.add_argument("--vocab-size", type=integer_option, required=True, help="ids, at least 257")
    cmd.add_argument("--out", type=output_path, required=True, help="the tokenizer.json to write")


def run(args: argparse.Namespace) -> int:
    from ..make_dataset.hf_datasets import open_source, text_batches
    from ..make_dataset.tokenizer import train_tokenizer

    documents = None
    if args.hf:  # the documents make-dataset --hf would read, in batches
        dataset, _ = open_source(args.hf, args.split)
        documents = text_batches(dataset, args.column, args.hf, 1000, 1 << 24)
    size = train_tokenizer(args.text or [], args.vocab_size, args.out, documents)
    print(
        f"wrote {args.out}: byte-level BPE of {size} ids; tokenise with make-dataset --hf SOURCE "
        f"--tokenizer {args.out} --out DIR"
    )
    return 0
