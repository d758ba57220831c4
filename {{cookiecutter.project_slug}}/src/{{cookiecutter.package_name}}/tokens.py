"""Token datasets for language models: a few large shards of uint16 tokens read with memmap.

A dataset directory (written by `python -m <pkg> make-dataset --text/--stdlib/--tokens`):

    index.json                            format, dtype, vocab_size, token counts, fingerprint
    train-00000.bin, train-00001.bin ...  raw little-endian uint16 tokens, 2**28 per shard
    val-00000.bin ...                     the last `val_fraction` of the token stream

Few large files suit Lustre (every file open is a metadata operation), and memmap reads only the
pages a batch touches. Text is tokenised byte by byte (UTF-8 bytes, vocabulary 256, nothing to
download): every byte value is a token, so any file is accepted, UTF-8 or not. A 0 byte ends each
document (text files practically never contain one). Tokens made by any other tokenizer (e.g. a
Hugging Face one, run elsewhere) come in as one `.npy` or `.bin` file with their vocabulary size.

Training reads random windows of block_size + 1 tokens. Their positions are a function of
(seed, step, rank, micro-step) only, so a resumed run needs no sampler state and every world size
is well defined. A window never crosses a shard boundary (the few positions that would are never
drawn: at most block_size per 2**28 tokens).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import sysconfig
import uuid
from pathlib import Path

import numpy as np
import torch

INDEX_FILE = "index.json"
FORMAT = "tokens/1"
DTYPE = np.dtype("<u2")  # "uint16" in index.json: little-endian, as numpy writes it on x86/ARM
MAX_VOCAB = 2**16  # token ids must fit uint16
BYTE_VOCAB = 256
DOCUMENT_END = 0  # byte tokenizer: the token after every document
SHARD_TOKENS = 2**28  # 512 MiB per shard
MIN_VAL_TOKENS = 1025  # at least one window of block_size 1024 (+1 for the shifted targets)
CHUNK_TOKENS = 2**24  # bounded memory when copying large token files


class DatasetError(ValueError):
    """A token file or dataset directory that cannot be used; the message names the path."""


# --- the byte-level tokenizer ---------------------------------------------------------------


def encode_bytes(text: str) -> np.ndarray:
    """Text -> its UTF-8 bytes as uint16 tokens (vocabulary 256)."""
    return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.uint16)


def decode_bytes(tokens) -> str:
    """Tokens -> text; bytes that are not valid UTF-8 (and ids > 255) become U+FFFD."""
    values = np.asarray(tokens, dtype=np.int64).reshape(-1)
    values = np.where((values >= 0) & (values < BYTE_VOCAB), values, 0xFF)  # 0xFF: never UTF-8
    return values.astype(np.uint8).tobytes().decode("utf-8", errors="replace")


def stdlib_files() -> list[Path]:
    """The Python standard library's `.py` sources without tests: about 10 MB of real text on
    every machine with Python, so `make-dataset --stdlib` needs no download."""
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"}
    files = [
        path
        for path in sorted(root.rglob("*.py"))
        if not skip & set(path.relative_to(root).parts) and path.stat().st_size > 0
    ]
    if not files:
        raise DatasetError(f"{root}: no Python sources found in the standard library directory")
    return files


# --- writing ---------------------------------------------------------------------------------


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

    def chunks():
        for path, size in zip(files, sizes, strict=True):
            try:
                data = path.read_bytes()
            except OSError as err:
                raise DatasetError(f"{path}: cannot read: {err.strerror or err}") from None
            if len(data) != size:
                raise DatasetError(f"{path}: changed size while being read; try again")
            tokens = np.empty(size + 1, dtype=DTYPE)
            tokens[:size] = np.frombuffer(data, dtype=np.uint8)
            tokens[size] = DOCUMENT_END
            yield tokens

    meta = {"tokenizer": "bytes", "document_end": DOCUMENT_END, "sources": describe(files)}
    total = sum(sizes) + len(files)
    return write_shards(
        chunks(), total, BYTE_VOCAB, meta, out, val_fraction, shard_tokens, min_val_tokens
    )


def write_token_dataset(
    tokens_file: Path,
    vocab_size: int,
    out: Path,
    val_fraction: float = 0.005,
    shard_tokens: int = SHARD_TOKENS,
    min_val_tokens: int = MIN_VAL_TOKENS,
) -> dict:
    """Shard tokens made by any tokenizer: a 1-D `.npy` of any integer dtype, or a `.bin` of raw
    little-endian uint16. Every token must be in [0, vocab_size) and vocab_size <= 65536."""
    path = Path(tokens_file)
    if not isinstance(vocab_size, int) or not 1 <= vocab_size <= MAX_VOCAB:
        raise DatasetError(
            f"{path}: vocab_size {vocab_size!r} does not fit uint16 tokens "
            f"(accepted: 1 to {MAX_VOCAB}); shard larger vocabularies yourself"
        )
    try:
        if path.suffix == ".npy":
            tokens = np.load(path, mmap_mode="r", allow_pickle=False)
        elif path.suffix == ".bin":
            if path.stat().st_size % DTYPE.itemsize:
                raise DatasetError(f"{path}: odd number of bytes, not raw uint16 tokens")
            tokens = np.memmap(path, dtype=DTYPE, mode="r") if path.stat().st_size else []
        else:
            raise DatasetError(f"{path}: unknown token file type; accepted: .npy, .bin (uint16)")
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
            yield chunk.astype(DTYPE)

    meta = {"tokenizer": "external", "document_end": None, "sources": describe([path])}
    return write_shards(
        chunks(), len(tokens), vocab_size, meta, out, val_fraction, shard_tokens, min_val_tokens
    )


def describe(files: list[Path], keep: int = 5) -> list[str]:
    """A short list of source names for index.json."""
    names = [str(f) for f in files[:keep]]
    return names + ([f"... and {len(files) - keep} more files"] if len(files) > keep else [])


def write_shards(
    chunks,
    total: int,
    vocab_size: int,
    meta: dict,
    out: Path,
    val_fraction: float,
    shard_tokens: int,
    min_val_tokens: int,
) -> dict:
    """Write the token stream `chunks` (`total` tokens) as shards + index.json at `out`.

    Everything is written into a hidden temp directory next to `out`, then renamed to `out` in
    one step: a killed or failed run leaves nothing under `out`, and of concurrent writers one
    wins the rename. If `out` already holds a dataset, the new one must be identical (same
    fingerprint): then this is a no-op that returns the existing index; otherwise it is an error
    and `out` is left as it was. A non-empty `out` that is not a dataset is never touched. Only a
    run killed with SIGKILL (or a node failure) leaves its `.<out>.tmp-*` directory behind; it is
    never read and can be deleted.
    """
    out = Path(out)
    if not 0.0 < val_fraction < 1.0:
        raise DatasetError(f"{out}: val_fraction must be in (0, 1), got {val_fraction!r}")
    if shard_tokens < 1 or min_val_tokens < 1:
        raise DatasetError(f"{out}: shard_tokens and min_val_tokens must be positive")
    if out.exists() and not (out / INDEX_FILE).exists() and (out.is_file() or any(out.iterdir())):
        raise DatasetError(f"{out}: exists and is not a token dataset; choose a new directory")
    n_val = max(math.ceil(total * val_fraction), min_val_tokens)
    if total - n_val < n_val:
        raise DatasetError(
            f"{out}: only {total} tokens in all; need at least {2 * n_val} "
            f"for a training split at least as large as the validation split ({n_val} tokens)"
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    train, val = ShardWriter(tmp, "train", shard_tokens), ShardWriter(tmp, "val", shard_tokens)
    try:
        written = 0
        for chunk in chunks:
            cut = min(max(total - n_val - written, 0), len(chunk))  # the rest goes to val
            train.write(chunk[:cut])
            val.write(chunk[cut:])
            written += len(chunk)
        if written != total:
            raise DatasetError(f"{out}: expected {total} tokens but read {written}; try again")
        index = {
            "format": FORMAT,
            "dtype": "uint16",
            "vocab_size": int(vocab_size),
            "tokenizer": meta["tokenizer"],
            "document_end": meta["document_end"],
            "train": train.close(),
            "val": val.close(),
        }
        index["fingerprint"] = fingerprint(tmp, index)
        index["sources"] = meta["sources"]
        write_json(tmp / INDEX_FILE, index)
        return publish(tmp, out, index)
    finally:
        for writer in (train, val):
            if writer.handle is not None:  # left open by an error
                writer.handle.close()
        shutil.rmtree(tmp, ignore_errors=True)  # gone after a successful rename


class ShardWriter:
    """Appends tokens to `<prefix>-00000.bin`, `<prefix>-00001.bin`, ... of `shard_tokens` each."""

    def __init__(self, directory: Path, prefix: str, shard_tokens: int):
        self.directory, self.prefix, self.shard_tokens = directory, prefix, shard_tokens
        self.files: list[dict] = []
        self.handle = None

    def write(self, tokens: np.ndarray) -> None:
        while len(tokens):
            if self.handle is None or self.files[-1]["tokens"] == self.shard_tokens:
                self._next_shard()
            room = self.shard_tokens - self.files[-1]["tokens"]
            part, tokens = tokens[:room], tokens[room:]
            self.handle.write(np.ascontiguousarray(part, dtype=DTYPE).tobytes())
            self.files[-1]["tokens"] += len(part)

    def _next_shard(self) -> None:
        self._close_handle()
        name = f"{self.prefix}-{len(self.files):05d}.bin"
        self.handle = open(self.directory / name, "wb")  # closed by the next shard or close()
        self.files.append({"name": name, "tokens": 0})

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
    """sha256 over the format, dtype and vocab size, then every shard (train, then val) as a
    line "<split> <name> <tokens>" followed by the shard's bytes. Equal fingerprints mean equal
    training data; it is computed from the files on disk."""
    digest = hashlib.sha256(f"{FORMAT} uint16 vocab_size={index['vocab_size']}\n".encode())
    for split in ("train", "val"):
        for entry in index[split]["files"]:
            digest.update(f"{split} {entry['name']} {entry['tokens']}\n".encode())
            with open(Path(directory) / entry["name"], "rb") as f:
                while block := f.read(1 << 24):
                    digest.update(block)
    return "sha256:" + digest.hexdigest()


def write_json(path: Path, data: dict) -> None:
    with open(path, "w") as f:
        f.write(json.dumps(data, indent=2) + "\n")
        f.flush()
        os.fsync(f.fileno())


def publish(tmp: Path, out: Path, index: dict) -> dict:
    """Rename the finished `tmp` to `out`; if another writer (or an earlier run) got there first,
    accept its dataset only when it is the same data."""
    try:
        os.rename(tmp, out)  # atomic; replaces `out` only when it is an empty directory
        return index
    except OSError:
        if not (out / INDEX_FILE).exists():
            raise DatasetError(
                f"{out}: exists and is not a token dataset; choose a new directory"
            ) from None
    existing = read_index(out)
    if existing.get("fingerprint") != index["fingerprint"]:
        raise DatasetError(
            f"{out}: already holds a different token dataset (fingerprint "
            f"{existing.get('fingerprint')}, new data {index['fingerprint']}); "
            "choose another --out or delete it"
        )
    return existing


# --- reading ---------------------------------------------------------------------------------


def read_index(directory: Path) -> dict:
    path = Path(directory) / INDEX_FILE
    try:
        index = json.loads(path.read_text())
    except FileNotFoundError:
        raise DatasetError(
            f"{path} not found: token datasets are written by "
            f"`python -m {__package__} make-dataset --stdlib | --text FILE... | --tokens FILE "
            "--vocab-size V --out DIR`"
        ) from None
    except (OSError, ValueError) as err:
        raise DatasetError(f"{path}: unreadable: {err}") from None
    if not isinstance(index, dict) or index.get("format") != FORMAT:
        found = index.get("format") if isinstance(index, dict) else None
        raise DatasetError(f"{path}: unknown dataset format {found!r}; expected {FORMAT!r}")
    if index.get("dtype") != "uint16":
        raise DatasetError(f"{path}: unsupported token dtype {index.get('dtype')!r} (uint16)")
    try:
        for split in ("train", "val"):
            for entry in index[split]["files"]:
                str(entry["name"]), int(entry["tokens"])
        int(index["vocab_size"]), str(index["fingerprint"])
    except (KeyError, TypeError, ValueError) as err:
        raise DatasetError(f"{path}: malformed index ({type(err).__name__}: {err})") from None
    return index


class TokenDataset:
    """Train and validation token splits, each a list of 1-D uint16 arrays (memmapped shards)."""

    def __init__(self, train: list, val: list, vocab_size: int, fingerprint: str, tokenizer: str):
        self.train, self.val = train, val
        self.vocab_size, self.fingerprint, self.tokenizer = vocab_size, fingerprint, tokenizer
        self.train_tokens = sum(len(s) for s in train)
        self.val_tokens = sum(len(s) for s in val)

    @classmethod
    def open(cls, directory: Path) -> TokenDataset:
        """Memmap the shards of a make-dataset directory, checking their sizes against the index."""
        directory = Path(directory)
        index = read_index(directory)
        splits = {}
        for split in ("train", "val"):
            shards = []
            for entry in index[split]["files"]:
                path = directory / entry["name"]
                try:
                    size = path.stat().st_size
                except OSError as err:
                    raise DatasetError(f"{path}: cannot read: {err.strerror or err}") from None
                if size != entry["tokens"] * DTYPE.itemsize or not size:
                    raise DatasetError(
                        f"{path}: {size} bytes, but index.json says {entry['tokens']} uint16 "
                        "tokens; the dataset is incomplete or was modified, write it again"
                    )
                shards.append(np.memmap(path, dtype=DTYPE, mode="r"))
            splits[split] = shards
        return cls(
            splits["train"],
            splits["val"],
            int(index["vocab_size"]),
            index["fingerprint"],
            index.get("tokenizer", "external"),
        )

    @classmethod
    def synthetic(
        cls, vocab_size: int, tokens: int, seed: int, val_tokens: int | None = None
    ) -> TokenDataset:
        """Uniform random tokens in memory (for benchmarks: there is nothing to learn)."""
        if not 1 <= vocab_size <= MAX_VOCAB:
            raise DatasetError(f"synthetic tokens: vocab_size must be 1 to {MAX_VOCAB}")
        val_tokens = val_tokens or max(tokens // 100, MIN_VAL_TOKENS)
        rng = np.random.default_rng(seed)
        train = rng.integers(0, vocab_size, tokens, dtype=np.uint16)
        val = rng.integers(0, vocab_size, val_tokens, dtype=np.uint16)
        name = f"synthetic:vocab_size={vocab_size}:tokens={tokens}+{val_tokens}:seed={seed}"
        return cls([train], [val], vocab_size, name, "synthetic")

    def window_starts(
        self, seed: int, step: int, micro: int, rank: int, batch_size: int, block_size: int
    ) -> np.ndarray:
        """`batch_size` random start positions (int64, in the concatenated train split) of
        windows of block_size + 1 tokens, each inside one shard. A function of (seed, step, rank,
        micro) only: uniform over all such windows, drawn with replacement."""
        window = block_size + 1
        counts = np.array([max(len(s) - window + 1, 0) for s in self.train], dtype=np.int64)
        if counts.sum() == 0:
            raise DatasetError(
                f"no train shard holds a window of block_size + 1 = {window} tokens "
                f"(the longest has {max(len(s) for s in self.train)})"
            )
        rng = np.random.default_rng([seed, step, rank, micro])
        draws = rng.integers(0, counts.sum(), batch_size, dtype=np.int64)
        shard = np.searchsorted(np.cumsum(counts), draws, side="right")
        shard_starts = np.cumsum([0] + [len(s) for s in self.train[:-1]], dtype=np.int64)
        valid_before = np.concatenate([[0], np.cumsum(counts)[:-1]])
        return shard_starts[shard] + (draws - valid_before[shard])

    def train_batch(
        self, seed: int, step: int, micro: int, rank: int, batch_size: int, block_size: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs x and targets y, CPU int64 (batch_size, block_size): y is x shifted by one."""
        starts = self.window_starts(seed, step, micro, rank, batch_size, block_size)
        windows = gather(self.train, starts, block_size + 1)
        return split_window(windows)

    def val_batches(
        self, batch_size: int, block_size: int, rank: int, world: int, max_batches: int
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Fixed validation batches for this rank. Windows of block_size + 1 tokens start every
        block_size tokens in each val shard, so every token is a target exactly once; window k
        goes to rank k % world. Every rank gets the same number of windows (at most
        max_batches * batch_size; the last batch may be smaller), so all ranks run the same
        number of forward passes."""
        window = block_size + 1
        shard_starts = np.cumsum([0] + [len(s) for s in self.val[:-1]], dtype=np.int64)
        starts = np.concatenate(
            [
                offset + np.arange(0, len(s) - window + 1, block_size, dtype=np.int64)
                for offset, s in zip(shard_starts, self.val, strict=True)
            ]
        )
        per_rank = min(len(starts) // world, max_batches * batch_size)
        if per_rank == 0:
            raise DatasetError(
                f"the validation split ({self.val_tokens} tokens) has {len(starts)} windows of "
                f"block_size + 1 = {window} tokens, fewer than one per rank ({world} ranks)"
            )
        mine = starts[rank::world][:per_rank]
        return [
            split_window(gather(self.val, mine[i : i + batch_size], window))
            for i in range(0, per_rank, batch_size)
        ]


def gather(shards: list, starts: np.ndarray, window: int) -> np.ndarray:
    """Rows of `window` tokens at `starts` (positions in the concatenated shards; a window lies
    inside one shard): one fancy-indexing read per shard touched, not one per token."""
    bounds = np.cumsum([len(s) for s in shards], dtype=np.int64)
    shard = np.searchsorted(bounds, starts, side="right")
    out = np.empty((len(starts), window), dtype=np.int64)
    offsets = np.arange(window, dtype=np.int64)
    for i in np.unique(shard):
        rows = np.flatnonzero(shard == i)
        local = starts[rows] - (bounds[i] - len(shards[i]))
        out[rows] = shards[i][local[:, None] + offsets]
    return out


def split_window(windows: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    w = torch.from_numpy(windows)
    return w[:, :-1].contiguous(), w[:, 1:].contiguous()
