"""What every kind of dataset directory shares, written once: its index.json, the one error
class, whole-file and sampled hashes, the positional reader of its large files, token ids on
disk, and how a writer publishes a directory complete or not at all. The kinds (tokens.py,
chat.py, images.py, arrays.py) and the writers (make_dataset/) import it; no kind imports
another kind.

Every dataset directory holds an `index.json` whose "format" names its kind ("tokens/1"), its
"fingerprint" (what a resume compares) and, for each large file, its size and the sha256 of a
few blocks sampled over it (checked at every open: about 1 MiB read, whatever the dataset's
size). A writer fills a hidden temporary directory beside `--out` and renames it to `--out` at
the end: an interrupted or failed write leaves nothing that looks like a dataset.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from ..run.lock import pid_alive

log = logging.getLogger(__name__.split(".")[0])

INDEX_FILE = "index.json"  # every dataset directory has one; its "format" names its kind
# Token ids on disk (token shards, chat datasets): little-endian, as numpy writes them on x86 and
# ARM; index.json says "uint16" (vocabularies up to 65,536) or "uint32" (above).
TOKEN_DTYPES = {"uint16": np.dtype("<u2"), "uint32": np.dtype("<u4")}
MAX_VOCAB = 2**32
SAMPLE_BYTES = 16 * 1024  # one sampled block
SAMPLE_BLOCKS = 64  # sampled blocks of a whole dataset, spread over its files by size


class DatasetError(ValueError):
    """A dataset directory or input file that cannot be used; the message names the path."""


def token_dtype(vocab_size: int, where: object = "token ids") -> np.dtype:
    """uint16 when every id fits (vocab_size <= 65536), uint32 above; a vocabulary of no id or
    of more than MAX_VOCAB is one line naming `where` (an input file, a dataset)."""
    if type(vocab_size) is not int or not 1 <= vocab_size <= MAX_VOCAB:
        raise DatasetError(f"{where}: vocab_size {vocab_size!r} is not in 1 to {MAX_VOCAB}")
    return TOKEN_DTYPES["uint16"] if vocab_size <= 2**16 else TOKEN_DTYPES["uint32"]


# --- index.json ------------------------------------------------------------------------------


def read_index(directory: Path, format: str, written_by: str = "") -> dict:
    """The directory's index.json, of the kind whose format is `format`; each problem is one
    DatasetError line. `written_by`: how such a directory is made, said when there is none."""
    path = Path(directory) / INDEX_FILE
    try:
        index = read_json(path)
    except FileNotFoundError:
        how = f": {written_by}" if written_by else ""
        raise DatasetError(f"{path} not found{how}") from None
    except (OSError, ValueError, RecursionError) as err:
        raise DatasetError(f"{path}: unreadable: {json_error(err)}") from None
    found = index.get("format") if isinstance(index, dict) else None
    if found != format:
        raise DatasetError(f"{path}: unknown dataset format {found!r}; expected {format!r}")
    return index


def read_json(path: Path) -> object:
    """A JSON file's value, a UTF-8 byte order mark accepted (json reads bytes in the encoding
    they announce). A nesting too deep for Python's parser raises RecursionError: `json_error`
    says it in words. Only a regular file is read: reading a FIFO waits for a writer for ever."""
    path = Path(path)
    if path.exists() and not path.is_file():
        raise ValueError("not a regular file (a directory, a FIFO or a device)")
    return json.loads(path.read_bytes())


def json_error(err: BaseException) -> str:
    if isinstance(err, RecursionError):
        return "nested too deeply to be read (JSON arrays or objects inside each other)"
    return str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__


def token_ids(directory: Path, index: dict) -> tuple[np.dtype, int]:
    """(dtype, vocab_size) of the token ids an index.json describes (token shards, chat),
    checked: each problem is one DatasetError line."""
    path = Path(directory) / INDEX_FILE
    if index.get("dtype") not in TOKEN_DTYPES:
        raise DatasetError(
            f"{path}: unknown token dtype {index.get('dtype')!r}; expected one of "
            f"{list(TOKEN_DTYPES)}"
        )
    with index_fields(directory):
        vocab_size = int(index["vocab_size"])
    token_dtype(vocab_size, path)
    return TOKEN_DTYPES[index["dtype"]], vocab_size


@contextmanager
def index_fields(directory: Path) -> Iterator[None]:
    """Around a kind's reading of its index's fields: a missing or mistyped one is one line."""
    try:
        yield
    except DatasetError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as err:
        path = Path(directory) / INDEX_FILE
        raise DatasetError(f"{path}: malformed index ({type(err).__name__}: {err})") from None


def content_fingerprint(*parts) -> str:
    """A dataset's fingerprint: the sha256 of what it is (its format, its class names, the
    digest of its data, ...), as JSON."""
    return "sha256:" + hashlib.sha256(json.dumps(list(parts)).encode()).hexdigest()


def check_fingerprint(directory: Path, index: dict, *parts) -> None:
    """index.json's "fingerprint" must be `content_fingerprint(*parts)` of what it says: an
    index edited after make-dataset (class names swapped, renamed) is one line."""
    if index["fingerprint"] != content_fingerprint(*parts):
        raise DatasetError(
            f"{Path(directory) / INDEX_FILE}: its class names or data digests are not those its "
            "fingerprint was made from: edited after make-dataset wrote it; write the dataset again"
        )


# --- hashes ----------------------------------------------------------------------------------


def file_sha256(path: Path) -> str:
    """A whole file's sha256 (a shard at a training start, a tokenizer.json, the arrays)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 24):
            digest.update(block)
    return "sha256:" + digest.hexdigest()


def sample_sha256(path: Path, size: int, blocks: int) -> str:
    """sha256 of `blocks` blocks of SAMPLE_BYTES spread evenly over the file of `size` bytes (its
    first and last block included)."""
    digest, span = hashlib.sha256(), max(size - SAMPLE_BYTES, 0)
    with open(path, "rb") as f:
        for k in range(blocks):
            f.seek(span * k // max(blocks - 1, 1))
            digest.update(f.read(SAMPLE_BYTES))
    return "sha256:" + digest.hexdigest()


def sample_blocks(sizes: list[int]) -> list[int]:
    """How many blocks of each file (of `sizes` bytes) make-dataset samples: SAMPLE_BLOCKS in
    all, in proportion to size, at least one per file."""
    total = sum(sizes) or 1
    return [max(1, round(SAMPLE_BLOCKS * size / total)) for size in sizes]


def record_samples(directory: Path, entries: list[dict], sizes: list[int]) -> None:
    """Add to each file's index entry (of `sizes` bytes) its sampled blocks and their hash."""
    for entry, size, blocks in zip(entries, sizes, sample_blocks(sizes), strict=True):
        entry["sampled_blocks"] = blocks
        entry["sample_sha256"] = sample_sha256(Path(directory) / entry["name"], size, blocks)


# --- reading the large files -----------------------------------------------------------------


def open_checked(directory: Path, entry: dict, size: int, dtype, unit: str) -> ShardFile:
    """The file of the dataset directory that an index.json `entry` describes (its "name", the
    "sampled_blocks" and their "sample_sha256"), refused in one line when it is missing, not of
    `size` bytes, or when its sampled blocks are not those make-dataset hashed. Its items are of
    `dtype`, called `unit` in messages ("token"). Every number of the entry is checked against
    the file before any work proportional to it."""
    path = Path(directory) / file_name(directory, entry["name"])
    blocks = entry["sampled_blocks"]
    if type(blocks) is not int or not 1 <= blocks <= SAMPLE_BLOCKS:
        raise DatasetError(
            f"{Path(directory) / INDEX_FILE}: sampled_blocks {blocks!r} of {path.name} is not in "
            f"1 to {SAMPLE_BLOCKS} (make-dataset samples at most {SAMPLE_BLOCKS} blocks of a "
            "file); write the dataset again"
        )
    try:
        found = path.stat().st_size
    except FileNotFoundError:
        raise DatasetError(
            f"{path}: missing, but index.json lists it; the dataset is incomplete, write it again"
        ) from None
    except OSError as err:
        raise DatasetError(f"{path}: cannot read: {err.strerror or err}") from None
    if found != size or not size:
        raise DatasetError(
            f"{path}: {found} bytes, but index.json says {size}: the dataset is incomplete or "
            "was modified, write it again"
        )
    try:
        same = sample_sha256(path, size, blocks) == entry["sample_sha256"]
    except OSError as err:
        raise DatasetError(f"{path}: cannot read: {err.strerror or err}") from None
    if not same:
        raise DatasetError(
            f"{path}: changed since make-dataset wrote it (its sampled blocks differ from "
            "index.json's), so the dataset's fingerprint no longer describes it; write the "
            "dataset again"
        )
    return ShardFile(path, size // np.dtype(dtype).itemsize, dtype, unit)


def file_name(directory: Path, name: object) -> str:
    """A file name index.json lists: a plain name inside the dataset directory, never a path
    that leads out of it (`/etc/passwd`, `../other/train.bin`)."""
    plain = isinstance(name, str) and name not in ("", ".", "..") and "\0" not in name
    if not plain or Path(name).name != name:
        raise DatasetError(
            f"{Path(directory) / INDEX_FILE}: lists {name!r}, which is not a file name inside "
            "the dataset directory; write the dataset again"
        )
    return name


class ShardFile:
    """One large file of `items` items of `dtype`, read at positions with os.pread: one
    descriptor, opened on first read by the process that reads (a loader process, started by
    fork or spawn, opens its own), no file open per sample and no memmap. A file cut short
    under a live run (truncated, or rewritten by another make-dataset) is then a short read,
    named in one line, where the missing pages of a memmap would end the process with SIGBUS."""

    def __init__(self, path: Path, items: int, dtype, unit: str = "byte"):
        self.path, self.items, self.dtype, self.unit = Path(path), items, np.dtype(dtype), unit
        self._fd: int | None = None
        self._pid = os.getpid()

    def __len__(self) -> int:
        return self.items

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_fd": None}

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        """The whole file (np.asarray(shard)): for looking at the data, not for training."""
        data = np.fromfile(self.path, dtype=self.dtype, count=self.items)
        return data.astype(dtype or self.dtype)

    def _descriptor(self) -> int:
        if self._pid != os.getpid():  # forked: the parent's descriptor is not this process's
            self._fd, self._pid = None, os.getpid()
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDONLY)
        return self._fd

    def read(self, start: int, count: int) -> bytes:
        """Items [start, start + count) as bytes."""
        size = self.dtype.itemsize
        data = os.pread(self._descriptor(), count * size, start * size)
        if len(data) != count * size:
            self._cut_short(start + count)
        return data

    def windows(self, starts: np.ndarray, window: int) -> np.ndarray:
        """Rows of `window` items from the positions `starts` (in this file)."""
        fd, size = self._descriptor(), self.dtype.itemsize
        rows = np.empty((len(starts), window), dtype=self.dtype)
        for row, start in enumerate(starts.tolist()):
            data = os.pread(fd, window * size, start * size)
            if len(data) != window * size:
                self._cut_short(start + window)
            rows[row] = np.frombuffer(data, dtype=self.dtype)
        return rows

    def _cut_short(self, end: int) -> None:
        raise DatasetError(
            f"{self.path}: ends before {self.unit} {end} of {self.items}: the file was cut short "
            "while this run read it; write the dataset again"
        )

    def __del__(self, getpid=os.getpid, close=os.close) -> None:  # `os` may be gone at exit
        if self._fd is not None and self._pid == getpid():
            close(self._fd)


# --- writing: a directory published complete or not at all ------------------------------------

HOST = socket.gethostname().replace("/", "_")
LEFTOVER_AGE_S = 3600  # a temporary directory unchanged this long has no writer left


def check_out(out: Path, what: str) -> None:
    """`--out` may be new, empty, or a dataset (the same data is then a no-op: `publish`); a
    file, or a folder holding anything else, is never touched."""
    if out.exists() and not (out / INDEX_FILE).exists() and (out.is_file() or any(out.iterdir())):
        raise DatasetError(f"{out}: exists and is not a {what}; choose a new directory")


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


def write_json(path: Path, data: dict) -> None:
    with open(path, "w") as f:
        f.write(json.dumps(data, indent=2) + "\n")
        f.flush()
        os.fsync(f.fileno())


def publish(tmp: Path, out: Path, index: dict, what: str) -> dict:
    """Rename the finished `tmp` to `out`; if another writer (or an earlier run) got there first,
    accept its dataset only when it is the same data (the same fingerprint)."""
    try:
        os.rename(tmp, out)  # atomic; replaces `out` only when it is an empty directory
        return index
    except OSError:
        if not (out / INDEX_FILE).exists():
            raise DatasetError(
                f"{out}: exists and is not a {what}; choose a new directory"
            ) from None
    try:
        existing = json.loads((out / INDEX_FILE).read_text())
        fingerprint = existing.get("fingerprint")
    except (OSError, ValueError, AttributeError) as err:
        raise DatasetError(f"{out / INDEX_FILE}: unreadable: {err}") from None
    if fingerprint != index["fingerprint"]:
        raise DatasetError(
            f"{out}: already holds a different {what} (fingerprint {fingerprint}, new data "
            f"{index['fingerprint']}); choose another --out or delete it"
        )
    return existing


def written(out: Path, what: str, write: Callable[[Path], dict]) -> dict:
    """`write(tmp)` fills a temporary directory beside `out` with a dataset and returns its
    index (written into it); the directory is then published as `out`. A full disk or lost
    permission is one line, and nothing is left under `out` or beside it."""
    tmp = temporary_directory(out)
    try:
        index = write(tmp)
        write_json(tmp / INDEX_FILE, index)
        return publish(tmp, out, index, what)
    except OSError as err:  # a source's file (read) or the dataset's (written)
        raise DatasetError(f"{err.filename or out}: {err.strerror or err}") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # gone after a successful rename
