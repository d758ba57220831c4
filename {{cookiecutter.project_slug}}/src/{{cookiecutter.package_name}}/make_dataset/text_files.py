"""make-dataset's inputs of a known size, written as token shards (make_dataset/tokens.py):
`--stdlib` and `--text` (text files as UTF-8 bytes, vocabulary 256, a 0 byte after each
document: nothing to download) and `--tokens` (ids any tokenizer made, a 1-D `.npy` or raw
`.bin`)."""

from __future__ import annotations

import sysconfig
from pathlib import Path

import numpy as np

from ..config_keys import integer_option
from ..data.directory import DatasetError, token_dtype
from ..data.tokenizer import BYTE_VOCAB, DOCUMENT_END
from ..data.tokens import MIN_VAL_TOKENS
from .sources import DatasetSource
from .tokens import CHUNK_TOKENS, SHARD_TOKENS, check_split_sizes, write_shards


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
    dtype = token_dtype(vocab_size, path)
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


# make-dataset's options (sources.py)
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
