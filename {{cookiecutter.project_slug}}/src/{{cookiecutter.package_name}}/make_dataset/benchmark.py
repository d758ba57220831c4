"""`python -m <pkg>.make_dataset.benchmark --tokenizer tokenizer.json (--hf SOURCE |
--synthetic-mb N)`: time `make-dataset --hf` against the tokenizer alone, and print one JSON line.

- pipeline_tokens_per_s: the whole make-dataset run (read, encode, convert, write the shards,
  fingerprint them) into a temporary directory;
- encode_batch_tokens_per_s: only the tokenizer's own batch encoder on the same batches of the
  same text, on the same threads (the texts read beforehand, outside the clock): the call
  make-dataset makes, `encode_batch_fast` (encode_batch without character offsets) where the
  tokenizers version has it, else `encode_batch` (named in "encode_call");
- ratio: pipeline / encode_batch (goal: at least 0.8); with --rounds N the two alternate N
  times and the medians are compared (a shared machine's load then hits both alike);
- peak_rss_mib: this process's peak resident memory after the pipeline (goal: flat as the corpus
  grows: run it with two --synthetic-mb sizes).

--synthetic-mb N writes an N MiB parquet folder of the Python standard library's sources (repeated,
in row groups, so making it needs little memory) to the temporary directory first.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from ..config_keys import integer_option, optional_import
from ..data.directory import DatasetError
from ..data.tokenizer import load_tokenizer
from . import hf_datasets
from .text_files import stdlib_files


def synthetic_corpus(directory: Path, megabytes: int, rows_per_group: int = 512) -> Path:
    """A folder of one parquet file holding `megabytes` MiB of text, documents = stdlib files."""
    pa = optional_import("pyarrow", "data", "--synthetic-mb", DatasetError)
    import pyarrow.parquet as pq

    texts = [f.read_text(errors="replace") for f in stdlib_files()]
    folder = directory / "corpus"
    folder.mkdir()
    target, written, i = megabytes * 2**20, 0, 0
    with pq.ParquetWriter(folder / "part-0.parquet", pa.schema([("text", pa.string())])) as out:
        while written < target:
            group = []
            while len(group) < rows_per_group and written < target:
                group.append(texts[i % len(texts)])
                written += len(group[-1].encode())
                i += 1
            out.write_table(pa.table({"text": group}))
    return folder


def encode_batch_alone(source: str, tokenizer, args: argparse.Namespace, workers: int) -> tuple:
    """(tokens, seconds inside encode_batch) over the same batches as the pipeline."""
    dataset, _ = hf_datasets.open_source(source, args.split)
    documents = hf_datasets.BATCH_DOCUMENTS_PER_WORKER * workers
    characters = hf_datasets.BATCH_CHARACTERS_PER_WORKER * workers
    encode = getattr(tokenizer, "encode_batch_fast", tokenizer.encode_batch)  # as make-dataset
    tokens, seconds = 0, 0.0
    for texts in hf_datasets.text_batches(dataset, args.column, source, documents, characters):
        start = time.perf_counter()
        encodings = encode(texts, add_special_tokens=False)
        seconds += time.perf_counter() - start
        tokens += sum(len(e.ids) for e in encodings) + len(texts)  # + the separators
    return tokens, seconds


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def run(args: argparse.Namespace) -> dict:
    workers = hf_datasets.use_workers(args.workers)
    for module in ("datasets", "tokenizers", "pyarrow.parquet"):
        optional_import(module, "data", "the make-dataset --hf benchmark", DatasetError)
    imports_rss = peak_rss_mib()  # torch, datasets, pyarrow: the constant part
    with tempfile.TemporaryDirectory(prefix="data-benchmark-", dir=args.tmp) as tmp:
        source = (
            str(synthetic_corpus(Path(tmp), args.synthetic_mb)) if args.synthetic_mb else args.hf
        )
        corpus_mib = (
            sum(f.stat().st_size for f in Path(source).rglob("*") if f.is_file()) / 2**20
            if Path(source).exists()
            else None
        )
        tokenizer, _ = load_tokenizer(args.tokenizer)
        pipeline_rates, alone_rates = [], []
        for round_ in range(args.rounds):  # alternated: a shared machine's load hits both alike
            out = Path(tmp) / f"dataset-{round_}"
            start = time.perf_counter()
            index = hf_datasets.write_hf_dataset(
                source, args.tokenizer, out, args.split, args.column, workers, progress_every_s=60.0
            )
            pipeline_s = time.perf_counter() - start
            rss = peak_rss_mib()  # the reference below holds one batch at a time
            shutil.rmtree(out)
            tokens = index["train"]["tokens"] + index["val"]["tokens"]
            pipeline_rates.append(tokens / pipeline_s)
            alone_tokens, alone_s = encode_batch_alone(source, tokenizer, args, workers)
            alone_rates.append(alone_tokens / alone_s)
    pipeline, alone = statistics.median(pipeline_rates), statistics.median(alone_rates)
    return {
        "source": args.hf or f"synthetic {args.synthetic_mb} MiB (stdlib sources, parquet)",
        "text_mib": args.synthetic_mb,
        "files_mib": round(corpus_mib, 1) if corpus_mib else None,
        "workers": workers,
        "vocab_size": index["vocab_size"],
        "tokens": tokens,
        "pipeline_tokens_per_s": round(pipeline),
        "encode_batch_tokens_per_s": round(alone),
        "ratio": round(pipeline / alone, 3),
        "rounds": args.rounds,
        "peak_rss_mib": round(rss, 1),
        "rss_after_imports_mib": round(imports_rss, 1),
        "encode_call": "encode_batch_fast"
        if hasattr(tokenizer, "encode_batch_fast")
        else "encode_batch",
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=f"python -m {__package__}.benchmark", description=__doc__.splitlines()[0]
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--hf", metavar="SOURCE", help="as make-dataset --hf")
    source.add_argument(
        "--synthetic-mb", type=integer_option, metavar="N", help="a generated N MiB corpus"
    )
    parser.add_argument("--tokenizer", type=Path, required=True)
    parser.add_argument("--split", default="train")
    parser.add_argument("--column", default="text")
    parser.add_argument("--workers", type=integer_option, help="default: as make-dataset")
    parser.add_argument(
        "--rounds", type=integer_option, default=1, help="alternated runs (medians)"
    )
    parser.add_argument("--tmp", type=Path, help="where to write (default: $TMPDIR)")
    args = parser.parse_args(argv)
    try:
        print(json.dumps(run(args)), flush=True)
    except DatasetError as err:
        print(f"data_benchmark: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
