"""`make-dataset --hf SOURCE --tokenizer PATH`: a Hugging Face dataset (a hub name, a data file,
or a folder of parquet/JSONL/arrow files) tokenised by a Hugging Face tokenizer into token shards.

At corpus scale: the source is streamed (never copied into the Hugging Face cache), one thread
reads the next batches of documents while the tokenizer's own thread pool encodes the current
one on `--workers` cores, and the shards are written as the ids come (`shards.write_shards`):
memory stays flat however large the corpus. A document's ids do not depend on the batch it is
in, and the tokenizer keeps the order, so the shards and their fingerprint do not depend on the
number of workers. A progress line (documents, tokens/s, ETA) goes to stderr every 10 s.
"""

from __future__ import annotations

import os
import queue
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from itertools import chain
from pathlib import Path

import numpy as np

from ..config_keys import first_line, optional_import
from ..data.directory import DatasetError, token_dtype
from ..data.tokenizer import companion_files, document_separator, load_tokenizer, vocabulary_size
from .sources import DatasetSource, default_workers, format_seconds
from .tokens import write_shards

# data files a folder or a file SOURCE may hold, by suffix (compressed .gz/.zst/.bz2/.xz too)
BUILDERS = {".parquet": "parquet", ".jsonl": "json", ".json": "json", ".arrow": "arrow"}
# Documents per encode_batch call, per worker: enough to keep every thread busy, few enough that
# the batch's encodings (~100 bytes per token) stay small. A document's ids do not depend on the
# batch it is in, so neither do the shards.
BATCH_DOCUMENTS_PER_WORKER = 64
BATCH_CHARACTERS_PER_WORKER = 2**18


def data_suffix(path: Path) -> str:
    suffixes = [s.lower() for s in path.suffixes]
    if suffixes and suffixes[-1] in (".gz", ".zst", ".bz2", ".xz"):
        suffixes.pop()
    return suffixes[-1] if suffixes else ""


def check_one_kind(folder: Path, source: str) -> None:
    """The data files of a folder (as datasets sees them: not under hidden or `__` folders) are
    of one kind: given parquet and JSONL, datasets would read one kind and drop the rest."""
    suffixes = {
        data_suffix(f)
        for f in folder.rglob("*")
        if f.is_file()
        and data_suffix(f) in BUILDERS
        and not any(part.startswith((".", "__")) for part in f.relative_to(folder).parts)
    }
    if not suffixes:
        raise DatasetError(f"{source}: holds no parquet, JSONL or arrow files")
    if len({BUILDERS[suffix] for suffix in suffixes}) > 1:
        raise DatasetError(
            f"{source}: holds {', '.join(sorted(suffixes))} files; a folder is read as one "
            "kind (the others would be dropped): give a folder or file of one kind"
        )


def open_source(source: str, split: str):
    """(a streaming `datasets.IterableDataset` of `split`, its number of documents or None)."""
    path = Path(source).expanduser()
    local = path.exists() or source.startswith(("/", ".", "~")) or data_suffix(path) in BUILDERS
    if local and not path.exists():
        raise DatasetError(f"{source}: no such file or directory")
    if path.is_file():
        if path.stat().st_size == 0:
            raise DatasetError(f"{source}: the file is empty (no documents)")
        if data_suffix(path) not in BUILDERS:
            raise DatasetError(
                f"{source}: unknown data file type; accepted: .parquet, .jsonl, .json, .arrow"
            )
        args = {"path": BUILDERS[data_suffix(path)], "data_files": {split: [str(path)]}}
    elif path.is_dir():
        check_one_kind(path, source)
        args = {"path": str(path)}
    else:
        args = {"path": source}  # a hub name: needs internet (a login node) or the HF_HOME cache
    datasets = optional_import("datasets", "data", "--hf", DatasetError)
    try:
        dataset = datasets.load_dataset(**args, split=split, streaming=True)
    except Exception as err:  # datasets raises many types: missing split, bad files, no network
        # StopIteration: its builders infer the columns from the first record, and there is none
        why = "no documents (empty files?)" if isinstance(err, StopIteration) else first_line(err)
        raise DatasetError(
            f"{source}: cannot open split {split!r} as a Hugging Face dataset: {why}"
        ) from None
    return dataset, count_documents(dataset, args, split)


def count_documents(dataset, args: dict, split: str) -> int | None:
    """The number of documents, when the metadata says so cheaply (for the ETA); else None."""
    try:
        splits = dataset.info.splits
        if splits and splits.get(split) and splits[split].num_examples:
            return int(splits[split].num_examples)
        import datasets
        import pyarrow.parquet as pq

        files = datasets.load_dataset_builder(**args).config.data_files[split]
        if files and all(data_suffix(Path(f)) == ".parquet" for f in files):
            return sum(pq.ParquetFile(f).metadata.num_rows for f in files)
    except Exception:  # only the ETA is lost
        pass
    return None


def text_batches(
    dataset,
    column: str,
    source: str,
    batch_documents: int,
    batch_characters: int,
) -> Iterator[list[str]]:
    """Lists of at most `batch_documents` texts and `batch_characters` characters (or one longer
    text), in the source's order."""
    seen = 0
    try:
        for batch in dataset.iter(batch_size=batch_documents):
            if column not in batch:
                raise DatasetError(
                    f"{source}: no column {column!r}; its columns are {sorted(batch)}; "
                    "choose one with --column"
                )
            texts = batch[column]
            for i, text in enumerate(texts):
                if not isinstance(text, str):
                    raise DatasetError(
                        f"{source}: document {seen + i} has {type(text).__name__} in column "
                        f"{column!r}, not text"
                    )
            seen += len(texts)
            yield from split_batch(texts, batch_characters)
    except (DatasetError, KeyboardInterrupt):
        raise
    except Exception as err:  # a corrupt file, a lost connection
        raise DatasetError(f"{source}: cannot read document {seen}: {first_line(err)}") from None


def split_batch(texts: list[str], batch_characters: int) -> Iterator[list[str]]:
    start, size = 0, 0
    for i, text in enumerate(texts):
        if size and size + len(text) > batch_characters:
            yield texts[start:i]
            start, size = i, 0
        size += len(text)
    if start < len(texts):
        yield texts[start:]


def read_ahead(items: Iterable, depth: int = 4) -> Iterator:
    """`items` produced by a background thread, up to `depth` ahead (the tokenizer releases
    Python's lock while it encodes, so reading the next batch overlaps it)."""
    ready: queue.Queue = queue.Queue(depth)
    stop, end = threading.Event(), object()

    def put(item) -> None:
        while not stop.is_set():
            try:
                ready.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    def produce() -> None:
        try:
            for item in items:
                put((item, None))
                if stop.is_set():
                    return
            put((end, None))
        except BaseException as err:  # handed to the consumer, which raises it
            put((end, err))

    thread = threading.Thread(target=produce, name="read-ahead", daemon=True)
    thread.start()
    try:
        while True:
            item, err = ready.get()
            if err is not None:
                raise err
            if item is end:
                return
            yield item
    finally:
        stop.set()
        thread.join(timeout=5)


def encode_batches(
    batches: Iterable[list[str]], tokenizer, separator: int, dtype, name: str = "the tokenizer"
) -> Iterator:
    """(documents, ids) per batch: every document's ids followed by the separator."""
    encode = getattr(tokenizer, "encode_batch_fast", tokenizer.encode_batch)  # fast: no offsets
    for texts in batches:
        try:
            ids = [e.ids for e in encode(texts, add_special_tokens=False)]
        except Exception as err:  # the Rust side raises plain Exception (no [UNK] token ...)
            raise DatasetError(f"{name} cannot encode the documents: {first_line(err)}") from None
        lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
        flat = np.fromiter(chain.from_iterable(ids), dtype=np.int64, count=int(lengths.sum()))
        yield len(texts), np.insert(flat, np.cumsum(lengths), separator).astype(dtype)


class Progress:
    """`make-dataset: 120,000 of 1,000,000 documents (12%), 98.1M tokens, 2.10M tokens/s, ETA
    0:07:00` on stderr every `every_s` seconds, and once at the end."""

    def __init__(self, total_documents: int | None, every_s: float = 10.0, stream=None):
        self.total, self.every_s, self.stream = total_documents, every_s, stream or sys.stderr
        self.start = self.last = time.monotonic()
        self.documents = self.tokens = 0

    def update(self, documents: int, tokens: int) -> None:
        self.documents += documents
        self.tokens += tokens
        if time.monotonic() - self.last >= self.every_s:
            self.report()

    def report(self, final: bool = False) -> None:
        self.last = now = time.monotonic()
        elapsed = max(now - self.start, 1e-9)
        rate = self.tokens / elapsed
        done = f"{self.documents:,} documents"
        eta = ""
        if self.total and not final:
            fraction = min(self.documents / self.total, 1.0)
            done = f"{self.documents:,} of {self.total:,} documents ({fraction:.0%})"
            if fraction > 0:
                eta = f", ETA {format_seconds(elapsed * (1 - fraction) / fraction)}"
        end = f" in {format_seconds(elapsed)}" if final else eta
        print(
            f"make-dataset: {done}, {self.tokens:,} tokens, {rate / 1e6:.2f}M tokens/s{end}",
            file=self.stream,
            flush=True,
        )


def use_workers(workers: int | None) -> int:
    """Size the tokenizer's thread pool (Rust rayon, sized once, at its first use)."""
    workers = default_workers() if workers is None else workers
    if workers < 1:
        raise DatasetError(f"--workers {workers}: need at least 1")
    os.environ["RAYON_NUM_THREADS"] = str(workers)
    os.environ["TOKENIZERS_PARALLELISM"] = "true"
    return workers


def write_hf_dataset(
    source: str,
    tokenizer_path: Path,
    out: Path,
    split: str = "train",
    column: str = "text",
    workers: int | None = None,
    separator: str | None = None,
    batch_documents: int | None = None,
    progress_every_s: float = 10.0,
    **shard_options,
) -> dict:
    """Tokenise `source` into a token dataset at `out` (see `shards.write_shards` for `out`
    existing already, and `shard_options`). The tokenizer.json is copied into the dataset."""
    workers = use_workers(workers)
    batch_documents = batch_documents or BATCH_DOCUMENTS_PER_WORKER * workers
    batch_characters = BATCH_CHARACTERS_PER_WORKER * workers
    tokenizer, file = load_tokenizer(tokenizer_path)
    vocab_size = vocabulary_size(tokenizer)
    _, separator_id = document_separator(tokenizer, file, separator)
    dataset, total = open_source(str(source), split)
    progress = Progress(total, progress_every_s)
    batches = read_ahead(
        text_batches(dataset, column, str(source), batch_documents, batch_characters)
    )

    def chunks():
        for documents, ids in encode_batches(
            batches, tokenizer, separator_id, token_dtype(vocab_size), str(file)
        ):
            progress.update(documents, len(ids))
            yield ids

    meta = {
        "tokenizer": "huggingface",
        "document_end": separator_id,
        "tokenizer_file": file,
        "tokenizer_companions": companion_files(file),
        "sources": [f"{source} (split {split}, column {column})"],
    }
    try:
        index = write_shards(chunks(), vocab_size, meta, out, **shard_options)
    finally:
        batches.close()  # stops the reading thread after an error
    progress.report(final=True)
    return index


# --- command line (sources.py) ----------------------------------------------------------------


def add_arguments(make, source) -> None:
    """make-dataset's --hf options; `source` is its group of mutually exclusive sources."""
    source.add_argument(
        "--hf",
        metavar="SOURCE",
        help="GPT: a Hugging Face dataset: hub name, data file, or folder of parquet/JSONL/arrow "
        "files (needs --tokenizer and the [data] extra)",
    )
    make.add_argument(
        "--split", default="train", help="with --hf, --chat: the split (default: train)"
    )
    make.add_argument("--column", default="text", help="with --hf: the text column (default: text)")
    make.add_argument(
        "--tokenizer",
        type=Path,
        help="with --hf: a tokenizer.json or a directory holding one; with --chat: the directory",
    )
    make.add_argument(
        "--separator", help="with --hf: the token that ends a document (default: the tokenizer's)"
    )


def make_dataset(args) -> dict:
    if args.tokenizer is None:
        raise DatasetError("make-dataset --hf needs --tokenizer (a tokenizer.json or its folder)")
    return write_hf_dataset(
        args.hf, args.tokenizer, args.out, args.split, args.column, args.workers, args.separator
    )


SOURCES = (DatasetSource("--hf", add_arguments, make_dataset),)  # make-dataset --hf (sources.py)
