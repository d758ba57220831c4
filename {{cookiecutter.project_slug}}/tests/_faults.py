"""I/O faults injected without root or a special file system (tests run as any user, and
`chmod` does not stop root): every file opened for writing under one directory fails as a full
disk (ENOSPC: at the first write) or a read-only file system / missing permission (EROFS,
EACCES: at open) would fail. Files opened by `open`, `io.open` and `pathlib` are covered."""

from __future__ import annotations

import builtins
import errno
import io
import os
from pathlib import Path

AT_OPEN = (errno.EROFS, errno.EACCES)


class _FailingWrites:
    """The real file, whose writes fail."""

    def __init__(self, file, error: OSError):
        self._file, self._error = file, error

    def write(self, data):
        raise self._error

    def writelines(self, lines):
        raise self._error

    def __getattr__(self, name):
        return getattr(self._file, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._file.close()


def _path_of(file) -> str:
    if isinstance(file, int):
        return os.readlink(f"/proc/self/fd/{file}")
    return os.path.realpath(os.fspath(file))


def fail_writes(monkeypatch, root: Path, code: int = errno.ENOSPC, also_mkdir: bool = False):
    """From now on (until monkeypatch undoes it), writing under `root` fails with `code`."""
    real_open, real_mkdir, root = io.open, os.mkdir, os.path.realpath(root)

    def under(path: str) -> bool:
        return path == root or path.startswith(root + os.sep)

    def opened(file, mode="r", *args, **kwargs):
        writing = any(c in mode for c in "wax+")
        if writing and not isinstance(file, int) and under(_path_of(file)) and code in AT_OPEN:
            raise OSError(code, os.strerror(code), os.fspath(file))
        handle = real_open(file, mode, *args, **kwargs)
        if writing and under(_path_of(file)):
            return _FailingWrites(handle, OSError(code, os.strerror(code), _path_of(file)))
        return handle

    def mkdir(path, *args, **kwargs):
        if also_mkdir and under(os.path.realpath(os.fspath(path))):
            raise OSError(code, os.strerror(code), os.fspath(path))
        return real_mkdir(path, *args, **kwargs)

    monkeypatch.setattr(io, "open", opened)
    monkeypatch.setattr(builtins, "open", opened)
    monkeypatch.setattr(os, "mkdir", mkdir)
