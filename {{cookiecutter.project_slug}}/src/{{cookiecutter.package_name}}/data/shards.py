"""Writing token datasets (the format is described in `tokens.py`): a token stream of unknown
length goes into shards as it comes, so memory stays flat however large the corpus is.

Everything is written into a hidden temp directory next to `--out` and renamed to `--out` in one
step at the end: an interrupted or failed run leaves nothing that looks like a dataset, and running
the same command again simply starts over.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import shutil
import socket
import time
import uuid
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from ..config_keys import integer_option
from ..run.lock import pid_alive
from .sources import DatasetSource
from .tokens import (
    BYTE_VOCAB,
    CHUNK_TOKENS,
    DOCUMENT_END,
    FORMAT,
    INDEX_FILE,
    MAX_VOCAB,
    MIN_VAL_TOKENS,
    SHARD_TOKENS,
    DatasetError,
    file_sha256,
    read_index,
    sample_blocks,
    sample_sha256,
    stdlib_files,
    token_dtype,
)

log = logging.getLogger(__name__.split(".")[0])

# --- sources with a known size: text files (byte tokens), token files ------------------------


def write_text_dataset(
    files: list[Path],
    out: Path,
    val_fraction: float = 0.005,
    shard_tokens: int = SHARD_TOKENS,
    min_val_tokens: int = MIN_VAL_TOKENS,
) -> dict:
    """Tokenise text files byte by byte (each followed by a 0 byte) into a dataset at `out`.
    Returns its index. See `write_shards` for what happens when `out` exists."""
    files = [Path(f) for f in files]
    if not files:
        raise DatasetError("no input files given")
    sizes = []
    for path in files:
        try:
            if not path.is_file():
                raise DatasetError(f"{path}: cannot read: not a file")
            size = path.stat().st_size
        except OSError as err:
            raise DatasetError(f"{path}: cannot read: {err.strerror or err}") from None
        if size == 0:
            raise DatasetError(f"{path}: empty file")
        sizes.append(size)
    check_split_sizes(out, sum(sizes) + len(files), val_fraction, min_val_tokens)
    dtype = token_dtype(BYTE_VOCAB)

    def chunks():
        for path, size in zip(files, sizes, strict=True):
            try:
                data = path.read_bytes()
            except OSError as err:
                raise DatasetError(f"{path}: cannot read: {err.strerror or err}") from None
            if len(data) != size:
                raise DatasetError(f"{path}: changed size while being read; try again")
            tokens = np.empty(size + 1, dtype=dtype)
            tokens[:size] = np.frombuffer(data, dtype=np.uint8)
            tokens[size] = DOCUMENT_END
            yield tokens

    meta = {"tokenizer": "bytes", "document_end": DOCUMENT_END, "sources": describe(files)}
    return write_shards(chunks(), BYTE_VOCAB, meta, out, val_fraction, shard_tokens, min_val_tokens)


def write_token_dataset(
    tokens_file: Path,
    vocab_size: int,
    out: Path,
    val_fraction: float = 0.005,
    shard_tokens: int = SHARD_TOKENS,
    min_val_tokens: int = MIN_VAL_TOKENS,
) -> dict:
    """Shard tokens made by any tokenizer: a 1-D `.npy` of any integer dtype, or a `.bin` of raw
    little-endian uint16 (vocab_size <= 65536) or uint32 (above). Every token must be in
    [0, vocab_size)."""
    path = Path(tokens_file)
    if not isinstance(vocab_size, int) or not 1 <= vocab_size <= MAX_VOCAB:
        raise DatasetError(f"{path}: vocab_size {vocab_size!r} is not in 1 to {MAX_VOCAB}")
    dtype = token_dtype(vocab_size)
    try:
        if path.suffix == ".npy":
            tokens = np.load(path, mmap_mode="r", allow_pickle=False)
        elif path.suffix == ".bin":
            if path.stat().st_size % dtype.itemsize:
                raise DatasetError(f"{path}: odd number of bytes, not raw {dtype.name} tokens")
            tokens = np.memmap(path, dtype=dtype, mode="r") if path.stat().st_size else []
        else:
            raise DatasetError(
                f"{path}: unknown token file type; accepted: .npy, .bin (uint16 up to a "
                "vocabulary of 65536, uint32 above)"
            )
    except OSError as err:
        raise DatasetError(f"{path}: cannot read: {err.strerror or err}") from None
    except ValueError as err:  # not an .npy file, or an object array
        raise DatasetError(f"{path}: not a readable .npy array: {err}") from None
    if isinstance(tokens, np.ndarray) and (tokens.ndim != 1 or tokens.dtype.kind not in "iu"):
        raise DatasetError(
            f"{path}: need a 1-D array of integer tokens, got shape {tokens.shape} {tokens.dtype}"
        )
    if len(tokens) == 0:
        raise DatasetError(f"{path}: empty file")
    check_split_sizes(out, len(tokens), val_fraction, min_val_tokens)

    def chunks():
        for start in range(0, len(tokens), CHUNK_TOKENS):
            chunk = np.asarray(tokens[start : start + CHUNK_TOKENS])
            bad = np.flatnonzero((chunk < 0) | (chunk >= vocab_size))
            if len(bad):
                pos = start + int(bad[0])
                raise DatasetError(
                    f"{path}: token {int(tokens[pos])} at position {pos} is outside "
                    f"[0, vocab_size={vocab_size})"
                )
            yield chunk.astype(dtype)

    meta = {"tokenizer": "external", "document_end": None, "sources": describe([path])}
    return write_shards(chunks(), vocab_size, meta, out, val_fraction, shard_tokens, min_val_tokens)


# make-dataset's options for these two (data/sources.py)
def add_stdlib(make, source) -> None:
    help = "GPT: the Python standard library's sources as byte tokens (offline)"
    source.add_argument("--stdlib", action="store_true", help=help)


def add_text(make, source) -> None:
    help = "GPT: plain text files, byte-level tokens (vocab 256)"
    source.add_argument("--text", type=Path, nargs="+", metavar="FILE", help=help)


def add_tokens(make, source) -> None:
    help = "GPT: tokens from any tokenizer, .npy (1-D integers) or .bin (uint16)"
    source.add_argument("--tokens", type=Path, metavar="FILE", help=help)
    make.add_argument("--vocab-size", type=integer_option, help="with --tokens: the vocab size")


def write_tokens(args) -> dict:
    if args.vocab_size is None:
        raise DatasetError("make-dataset --tokens needs --vocab-size (the tokenizer's)")
    return write_token_dataset(args.tokens, args.vocab_size, args.out)


SOURCES = (
    DatasetSource(
        "--stdlib", add_stdlib, lambda args: write_text_dataset(stdlib_files(), args.out)
    ),
    DatasetSource("--text", add_text, lambda args: write_text_dataset(args.text, args.out)),
    DatasetSource("--tokens", add_tokens, write_tokens),
)


def describe(files: list, keep: int = 5) -> list[str]:
    """A short list of source names for index.json."""
    names = [str(f) for f in files[:keep]]
    return names + ([f"... and {len(files) - keep} more files"] if len(files) > keep else [])


# --- the shard writer ------------------------------------------------------------------------


def check_ids(chunk: np.ndarray, vocab_size: int, sources: list[str]) -> None:
    """Whatever the source: integer ids in [0, vocab_size), or one line naming the source."""
    if chunk.ndim != 1 or chunk.dtype.kind not in "iu":
        raise DatasetError(f"{sources[0]}: not a 1-D array of integer ids ({chunk.dtype})")
    if len(chunk) and (int(chunk.min()) < 0 or int(chunk.max()) >= vocab_size):
        bad = int(chunk.min()) if int(chunk.min()) < 0 else int(chunk.max())
        raise DatasetError(f"{sources[0]}: token {bad} is outside [0, vocab_size={vocab_size})")


def validation_tokens(total: int, val_fraction: float, min_val_tokens: int) -> int:
    return max(math.ceil(total * val_fraction), min_val_tokens)


def check_split_sizes(out: Path, total: int, val_fraction: float, min_val_tokens: int) -> None:
    n_val = validation_tokens(total, val_fraction, min_val_tokens)
    if total - n_val < n_val:
        raise DatasetError(
            f"{out}: only {total} tokens in all; need at least {2 * n_val} "
            f"for a training split at least as large as the validation split ({n_val} tokens)"
        )


def write_shards(
    chunks: Iterable[np.ndarray],
    vocab_size: int,
    meta: dict,
    out: Path,
    val_fraction: float = 0.005,
    shard_tokens: int = SHARD_TOKENS,
    min_val_tokens: int = MIN_VAL_TOKENS,
) -> dict:
    """Write the token stream `chunks` (1-D arrays in [0, vocab_size)) as shards + index.json.

    The stream is written to train shards as it comes; at its end the last `val_fraction` of it
    (at least `min_val_tokens`) is moved to val shards. `meta` gives "tokenizer",
    "document_end", "sources" and optionally "tokenizer_file" (a path copied into the dataset) and
    "tokenizer_companions" (files beside it copied too: tokenizer_config.json...).

    If `out` already holds a dataset, the new one must be identical (same fingerprint): then this
    is a no-op that returns the existing index; otherwise it is an error and `out` is left as it
    was. A non-empty `out` that is not a dataset is never touched. Only a run killed with SIGKILL
    (or a node failure) leaves its `.<out>.tmp-<host>-<pid>-*` directory behind; it is never
    read, and the next write to `out` removes it or names it (`clear_leftovers`)."""
    out = Path(out)
    if not 0.0 < val_fraction < 1.0:
        raise DatasetError(f"{out}: val_fraction must be in (0, 1), got {val_fraction!r}")
    if shard_tokens < 1 or min_val_tokens < 1:
        raise DatasetError(f"{out}: shard_tokens and min_val_tokens must be positive")
    if not isinstance(vocab_size, int) or not 1 <= vocab_size <= MAX_VOCAB:
        raise DatasetError(f"{out}: vocab_size {vocab_size!r} is not in 1 to {MAX_VOCAB}")
    if out.exists() and not (out / INDEX_FILE).exists() and (out.is_file() or any(out.iterdir())):
        raise DatasetError(f"{out}: exists and is not a token dataset; choose a new directory")
    dtype = token_dtype(vocab_size)
    tmp = temporary_directory(out)
    train = ShardWriter(tmp, "train", shard_tokens, dtype)
    val = ShardWriter(tmp, "val", shard_tokens, dtype)
    try:
        for chunk in chunks:
            check_ids(chunk, vocab_size, meta["sources"])
            train.write(chunk)
        train.close()
        total = sum(f["tokens"] for f in train.files)
        check_split_sizes(out, total, val_fraction, min_val_tokens)
        move_tail(train, val, validation_tokens(total, val_fraction, min_val_tokens))
        index = {
            "format": FORMAT,
            "dtype": dtype.name,
            "vocab_size": int(vocab_size),
            "tokenizer": meta["tokenizer"],
            "document_end": meta["document_end"],
        }
        if meta.get("tokenizer_file"):  # travels with the data: generate decodes with it
            shutil.copyfile(meta["tokenizer_file"], tmp / "tokenizer.json")
            index["tokenizer_file"] = {
                "name": "tokenizer.json",
                "sha256": file_sha256(tmp / "tokenizer.json"),
                "source": str(meta["tokenizer_file"]),
            }
            companions = index["tokenizer_file"]["companions"] = {}
            for companion in meta.get("tokenizer_companions", ()):  # special tokens, templates
                shutil.copyfile(companion, tmp / companion.name)
                companions[companion.name] = file_sha256(tmp / companion.name)
        index["train"], index["val"] = train.close(), val.close()
        record_samples(tmp, index["train"]["files"] + index["val"]["files"], dtype.itemsize)
        index["fingerprint"] = fingerprint(tmp, index)
        index["sources"] = meta["sources"]
        write_json(tmp / INDEX_FILE, index)
        return publish(tmp, out, index)
    except OSError as err:  # full disk, lost permission: one line, nothing left under `out`
        name = err.filename or out  # a source's file (read) or the dataset's (written)
        raise DatasetError(f"{name}: {err.strerror or err}") from None
    finally:
        for writer in (train, val):
            if writer.handle is not None:  # left open by an error
                writer.handle.close()
        shutil.rmtree(tmp, ignore_errors=True)  # gone after a successful rename


HOST = socket.gethostname().replace("/", "_")
LEFTOVER_AGE_S = 3600  # a temporary directory unchanged this long has no writer left


def temporary_directory(out: Path) -> Path:
    """A new hidden directory beside `out` that a writer fills and then renames to `out`
    (`publish`); a dead writer's leftover for the same `out` is removed first."""
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        clear_leftovers(out)
        tmp = out.parent / f".{out.name}.tmp-{HOST}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
    except OSError as err:
        raise DatasetError(f"{out}: cannot create: {err.strerror or err}") from None
    return tmp


def clear_leftovers(out: Path) -> None:
    """Remove the temporary directories of writes to `out` that were killed (SIGKILL, a lost
    node): one of this host whose process is gone, or any left unchanged for an hour. Another
    is named: a make-dataset elsewhere may still be writing it."""
    prefix = f".{out.name}.tmp-"
    for tmp in out.parent.glob(prefix + "*"):
        host, _, rest = tmp.name[len(prefix) :].rpartition("-")[0].rpartition("-")
        pid = int(rest) if rest.isascii() and rest.isdigit() else 0
        try:
            age_s = time.time() - max(p.stat().st_mtime for p in [tmp, *tmp.iterdir()])
        except OSError:
            continue  # removed meanwhile, or not a directory: not ours to judge
        if (host == HOST and pid and not pid_alive(pid)) or age_s > LEFTOVER_AGE_S:
            shutil.rmtree(tmp, ignore_errors=True)
            log.warning("removed %s, left by a make-dataset that was killed", tmp)
        else:
            log.warning(
                "%s: a make-dataset of %s may be writing it (started on %s); if none is, delete it",
                tmp,
                out,
                host or "another host",
            )


def move_tail(train: ShardWriter, val: ShardWriter, n_val: int) -> None:
    """Move the last `n_val` tokens of the closed train shards to `val`, in bounded memory
    (plain reads in chunks: a memmap's pages would count in the resident memory)."""
    keep = sum(f["tokens"] for f in train.files) - n_val
    position, itemsize = 0, train.dtype.itemsize
    for entry in list(train.files):
        path = train.directory / entry["name"]
        start, end = position, position + entry["tokens"]
        position = end
        if end <= keep:
            continue
        cut = max(keep - start, 0)  # tokens of this shard that stay in train
        head_max = 0
        for offset in range(0, entry["tokens"], CHUNK_TOKENS):
            count = min(CHUNK_TOKENS, entry["tokens"] - offset)
            chunk = np.fromfile(path, dtype=train.dtype, count=count, offset=offset * itemsize)
            if offset < cut:
                head_max = max(head_max, int(chunk[: cut - offset].max()))
            if offset + count > cut:
                val.write(chunk[max(cut - offset, 0) :])
        if cut:
            os.truncate(path, cut * itemsize)
            entry.update(tokens=cut, max_id=head_max)
        else:
            path.unlink()
            train.files.remove(entry)
    val.close()


class ShardWriter:
    """Appends tokens to `<prefix>-00000.bin`, `<prefix>-00001.bin`, ... of `shard_tokens` each,
    recording each shard's token count and largest id."""

    def __init__(self, directory: Path, prefix: str, shard_tokens: int, dtype: np.dtype):
        self.directory, self.prefix, self.shard_tokens = directory, prefix, shard_tokens
        self.dtype = np.dtype(dtype)
        self.files: list[dict] = []
        self.handle = None

    def write(self, tokens: np.ndarray) -> None:
        while len(tokens):
            if self.handle is None or self.files[-1]["tokens"] == self.shard_tokens:
                self._next_shard()
            entry = self.files[-1]
            room = self.shard_tokens - entry["tokens"]
            part, tokens = tokens[:room], tokens[room:]
            self.handle.write(np.ascontiguousarray(part, dtype=self.dtype).tobytes())
            entry["tokens"] += len(part)
            entry["max_id"] = max(entry["max_id"], int(part.max()))

    def _next_shard(self) -> None:
        self._close_handle()
        name = f"{self.prefix}-{len(self.files):05d}.bin"
        self.handle = open(self.directory / name, "wb")  # closed by the next shard or close()
        self.files.append({"name": name, "tokens": 0, "max_id": 0})

    def _close_handle(self) -> None:
        if self.handle is not None:
            self.handle.flush()
            os.fsync(self.handle.fileno())
            self.handle.close()
            self.handle = None

    def close(self) -> dict:
        self._close_handle()
        return {"files": self.files, "tokens": sum(f["tokens"] for f in self.files)}


def record_samples(directory: Path, files: list[dict], itemsize: int) -> None:
    """Add to each shard's entry the hash of its sampled blocks (checked at every open)."""
    sizes = [entry["tokens"] * itemsize for entry in files]
    for entry, size, blocks in zip(files, sizes, sample_blocks(sizes), strict=True):
        entry["sampled_blocks"] = blocks
        entry["sample_sha256"] = sample_sha256(directory / entry["name"], size, blocks)


def fingerprint(directory: Path, index: dict) -> str:
    """sha256 over the format, dtype and vocab size (and the tokenizer file's hash, if any), then
    a line "<split> <name> <tokens> <sha256>" per shard (train, then val), each shard's whole-file
    sha256 recorded in its entry as it is read (a training start compares every shard with it,
    `TokenDataset.verify`). Equal fingerprints mean equal training data; it is computed from the
    files on disk."""
    header = f"{FORMAT} {index['dtype']} vocab_size={index['vocab_size']}\n"
    if index.get("tokenizer_file"):
        header += f"tokenizer {index['tokenizer_file']['sha256']}\n"
    digest = hashlib.sha256(header.encode())
    for split in ("train", "val"):
        for entry in index[split]["files"]:
            entry["sha256"] = file_sha256(Path(directory) / entry["name"])
            digest.update(f"{split} {entry['name']} {entry['tokens']} {entry['sha256']}\n".encode())
    return "sha256:" + digest.hexdigest()


def write_json(path: Path, data: dict) -> None:
    with open(path, "w") as f:
        f.write(json.dumps(data, indent=2) + "\n")
        f.flush()
        os.fsync(f.fileno())


def publish(
    tmp: Path, out: Path, index: dict, what: str = "token dataset", read_existing=read_index
) -> dict:
    """Rename the finished `tmp` to `out`; if another writer (or an earlier run) got there first,
    accept its dataset only when it is the same data (the same fingerprint). `read_existing`
    reads the index.json already there (one DatasetError line when it cannot)."""
    try:
        os.rename(tmp, out)  # atomic; replaces `out` only when it is an empty directory
        return index
    except OSError:
        if not (out / INDEX_FILE).exists():
            raise DatasetError(
                f"{out}: exists and is not a {what}; choose a new directory"
            ) from None
    existing = read_existing(out)
    if existing.get("fingerprint") != index["fingerprint"]:
        raise DatasetError(
            f"{out}: already holds a different {what} (fingerprint "
            f"{existing.get('fingerprint')}, new data {index['fingerprint']}); "
            "choose another --out or delete it"
        )
    return existing
