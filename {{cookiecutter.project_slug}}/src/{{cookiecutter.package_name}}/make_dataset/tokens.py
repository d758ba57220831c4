"""Writing token datasets (the format, and its reader: data/tokens.py): a token stream of unknown
length goes into shards as it comes, so memory stays flat however large the corpus is. The
sources that feed it: make_dataset/text_files.py (text and id files), hf_datasets.py (Hugging
Face datasets), yours (docs/data.md).

Everything is written into a hidden temp directory next to `--out` and renamed to `--out` in one
step at the end (data/directory.py, `written`): an interrupted or failed run leaves nothing that
looks like a dataset, and running the same command again simply starts over.
"""

from __future__ import annotations

import hashlib
import math
import os
import shutil
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from ..data.directory import (
    DatasetError,
    check_out,
    file_sha256,
    record_samples,
    token_dtype,
    written,
)
from ..data.tokenizer import TOKENIZER_FILE, tokenizer_record
from ..data.tokens import FORMAT, MIN_VAL_TOKENS

SHARD_TOKENS = 2**28  # 512 MiB (uint16) or 1 GiB (uint32) per shard
CHUNK_TOKENS = 2**24  # bounded memory when copying or scanning large token files


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
    dtype = token_dtype(vocab_size, out)
    check_out(out, "token dataset")

    def write(tmp: Path) -> dict:
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
                index["tokenizer_file"] = copy_tokenizer(meta, tmp)
            index["train"], index["val"] = train.close(), val.close()
        finally:
            for writer in (train, val):
                if writer.handle is not None:  # left open by an error
                    writer.handle.close()
        files = index["train"]["files"] + index["val"]["files"]
        record_samples(tmp, files, [entry["tokens"] * dtype.itemsize for entry in files])
        index["fingerprint"] = fingerprint(tmp, index)
        index["sources"] = meta["sources"]
        return index

    return written(out, "token dataset", write)


def copy_tokenizer(meta: dict, directory: Path) -> dict:
    """The tokenizer.json that made the ids, and the files kept beside it (special tokens,
    templates), copied into the dataset: its index.json entry."""
    shutil.copyfile(meta["tokenizer_file"], directory / TOKENIZER_FILE)
    for companion in meta.get("tokenizer_companions", ()):
        shutil.copyfile(companion, directory / companion.name)
    return tokenizer_record(directory, meta["tokenizer_file"])


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
