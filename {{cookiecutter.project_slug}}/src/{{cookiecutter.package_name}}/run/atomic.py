"""Files written complete or not at all: a temp file next to the target, fsync, then rename (or
link, for a file that must not exist yet). A crash, a full disk or a read-only file system at any
point leaves the old file or the new one, never a partial one, and no temp file behind."""

from __future__ import annotations

import argparse
import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from ..config_keys import shown

# A name in a path takes at most 255 bytes (NAME_MAX on Linux, Lustre included). The writers put
# a new name's data under a longer hidden one first (`.NAME.tmp-HOST-PID-xxxxxxxx`): the last
# name of an output path leaves room for that.
NAME_MAX = 255
TEMP_ROOM = 64


def fsync(path: Path) -> None:
    """Flush a file, or a directory after a rename or link in it (its entries are data too)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def temp_name(path: Path) -> Path:
    """Hidden, next to `path` (same file system, so the rename is atomic), unique per process."""
    return path.with_name(f".{path.name}.tmp{os.getpid()}")


def output_path(text: str) -> Path:
    """The argparse type of a path a command writes (--out): a name in it that the file system
    cannot take is refused on the command line (exit 2), before any folder of it is made."""
    path = Path(text)
    limits = [(name, NAME_MAX) for name in path.parts[:-1]] + [(path.name, NAME_MAX - TEMP_ROOM)]
    for name, limit in limits:
        size = len(os.fsencode(name))
        if size > limit:
            raise argparse.ArgumentTypeError(
                f"{shown(text)}: a name of {size} bytes in it is too long (a file system takes "
                f"{NAME_MAX}; the last name at most {NAME_MAX - TEMP_ROOM}, as it is written "
                "under a longer temporary name first)"
            )
    return path


def atomic_write(path: Path, write: Callable[[Path], None]) -> None:
    """`write(tmp)` to a temp file next to `path`, fsync, rename over `path`, fsync the
    directory. Any failure (ENOSPC included) removes the temp file and re-raises."""
    path = Path(path)
    tmp = temp_name(path)
    try:
        write(tmp)
        fsync(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    fsync(path.parent)


@contextmanager
def atomic_directory(out: Path) -> Iterator[Path]:
    """A new directory `out`, complete or not at all: the caller fills the temp directory this
    yields (next to `out`); then every file in it is flushed, it is renamed to `out` and the
    parent flushed. Any failure removes it. `out` must not exist (callers refuse that first)."""
    out = Path(out)
    tmp = temp_name(out)
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir(parents=True)
        yield tmp
        for path in tmp.iterdir():
            fsync(path)
        tmp.rename(out)
        fsync(out.parent)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# How torch.save (its C++ zip writer) and safetensors report a failed write: the errno is lost
# ("unexpected pos 704 vs 598") or only in the text ("os error 28").
HIDDEN_WRITE_ERRORS = ("inline_container", "file write failed", "os error")


def hidden_write_cause(err: BaseException, directory: Path) -> str | None:
    """Why a write into `directory` failed, when the writer hid it: a probe file written there
    gets the real OSError (a full disk, a quota, a read-only file system), named with the path.
    None when the error says its cause itself, or the probe succeeds."""
    if not any(text in str(err) for text in HIDDEN_WRITE_ERRORS):
        return None
    probe = Path(directory) / f".write-probe{os.getpid()}"
    try:
        with open(probe, "wb") as f:
            f.write(bytes(1 << 20))
            f.flush()
            os.fsync(f.fileno())
    except OSError as probe_err:
        return f"{probe_err.strerror or probe_err}: {directory}"
    finally:
        probe.unlink(missing_ok=True)
    return None


def atomic_write_bytes(path: Path, data: bytes) -> None:
    atomic_write(path, lambda tmp: tmp.write_bytes(data))


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def create_exclusive(path: Path, data: bytes) -> bool:
    """Create `path` holding `data` only if it does not exist: the data goes to a temp file,
    which is then hard-linked into place (`link` fails if `path` exists, atomically, Lustre
    included). Returns False if `path` existed. Nobody ever sees a partial file."""
    path = Path(path)
    tmp = temp_name(path)
    try:
        tmp.write_bytes(data)
        fsync(tmp)
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
    finally:
        tmp.unlink(missing_ok=True)
    fsync(path.parent)
    return True
