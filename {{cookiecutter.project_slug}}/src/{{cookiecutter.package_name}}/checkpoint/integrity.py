"""When a checkpoint directory is trusted, and what is said when it is not.

    checkpoints/step-00000100/      .metadata, __<rank>_<n>.distcp ..., COMPLETE.json (last)
    checkpoints/step-00000100.writing   exists while that step is being written

A checkpoint is trusted only if COMPLETE.json lists exactly the files present (`.metadata` and
every shard), each with its size and sha256, and every file matches. A step directory without
COMPLETE.json is either an interrupted save of this code (its `.writing` note exists, or it is
empty): safe to remove; or something this run cannot verify (the marker was lost, another
tool wrote it): never removed, and a run will not start over next to it.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from torch.distributed.checkpoint import CheckpointException

from ..run.atomic import hidden_write_cause
from ..run.rundir import RunDir

MARKER = "COMPLETE.json"
METADATA = ".metadata"  # DCP's index: which bytes of which file hold which tensor
NAME = re.compile(r"step-(\d{8})")
CHUNK = 8 << 20  # bytes read at a time when checksumming


class CheckpointError(RuntimeError):
    """A checkpoint could not be written, or none of the existing ones can be loaded."""


def describe(err: BaseException, written: Path | None = None) -> str:
    """One line: DCP wraps each rank's exception, with its traceback, in a CheckpointException.
    `written`: the directory a failed write went to, to name a cause torch's writer hid."""
    if isinstance(err, CheckpointException) and err.failures:
        rank, (err, _) = next(iter(err.failures.items()))
        return f"rank {rank}: {describe(err, written)}"
    cause = hidden_write_cause(err, written) if written is not None else None
    return cause or " ".join(f"{type(err).__name__}: {err}".split())[:500]


def step_path(directory: Path, step: int) -> Path:
    return Path(directory) / f"step-{step:08d}"


def writing_note(path: Path) -> Path:
    """Beside the step directory (not in it: COMPLETE.json lists exactly what is inside)."""
    return path.with_name(path.name + ".writing")


def all_steps(directory: Path) -> list[int]:
    """Steps of every checkpoint directory, complete or not, oldest first."""
    if not Path(directory).is_dir():
        return []
    found = (NAME.fullmatch(p.name) for p in Path(directory).iterdir() if p.is_dir())
    return sorted(int(m.group(1)) for m in found if m)


def is_complete(path: Path) -> bool:
    """Its write finished (COMPLETE.json exists); whether it is intact is `verify`'s job."""
    return (Path(path) / MARKER).is_file()


def complete_steps(directory: Path) -> list[int]:
    """Steps of the complete checkpoints in `directory`, oldest first (not verified)."""
    return [s for s in all_steps(directory) if is_complete(step_path(directory, s))]


def complete_checkpoints(path: Path) -> list[Path]:
    """The complete checkpoints `path` names, newest first (not verified): `path` itself if it
    is a checkpoint, else those of the run directory `path`, or of the checkpoints directory
    `path` (a run directory's `checkpoints/`)."""
    path = Path(path)
    if (path / MARKER).exists():
        return [path]
    checkpoints = RunDir(path).checkpoints
    directory = checkpoints if checkpoints.is_dir() else path
    return [step_path(directory, s) for s in complete_steps(directory)[::-1]]


def is_interrupted_save(path: Path) -> bool:
    """No COMPLETE.json, and left by a save of this code (or holding nothing at all)."""
    path = Path(path)
    if is_complete(path):
        return False
    return writing_note(path).exists() or not any(path.iterdir())


def why_unverifiable(path: Path) -> str:
    has_metadata = (Path(path) / METADATA).is_file()
    what = f"{METADATA} but no {MARKER}" if has_metadata else f"neither {METADATA} nor {MARKER}"
    return f"{Path(path).name} ({what})"


def marker_files(path: Path) -> dict | str:
    """The files COMPLETE.json lists ({name: {size, sha256}}) if they are exactly the files
    present; otherwise what is wrong."""
    path = Path(path)
    try:
        marker = json.loads((path / MARKER).read_text())
    except OSError as err:
        return f"{MARKER} cannot be read: {describe(err)}"
    except ValueError as err:
        return f"{MARKER} is not valid JSON ({err})"
    files = marker.get("files") if isinstance(marker, dict) else None
    valid = isinstance(files, dict) and all(
        isinstance(rec, dict)
        and isinstance(rec.get("size"), int)
        and isinstance(rec.get("sha256"), str)
        for rec in files.values()
    )
    if not valid:
        return f"{MARKER} holds no list of files with size and sha256"
    try:
        present = {p.name for p in path.iterdir()} - {MARKER}
    except OSError as err:
        return f"cannot list it: {describe(err)}"
    if METADATA not in present:
        return f"it has no {METADATA} (DCP's index of the tensors): it cannot be loaded"
    missing, unlisted = sorted(files.keys() - present), sorted(present - files.keys())
    if missing:
        return f"file {missing[0]} is missing"
    if unlisted:
        return (
            f"{MARKER} does not list {len(unlisted)} file(s) present ({', '.join(unlisted[:3])})"
            ": it does not describe this checkpoint"
        )
    return files


def files_in_metadata(path: Path) -> set[str]:
    """The files DCP's `.metadata` says hold the tensors (every rank's shards)."""
    from torch.distributed.checkpoint import FileSystemReader

    metadata = FileSystemReader(str(path)).read_metadata()
    return {info.relative_path for info in (metadata.storage_data or {}).values()}


def file_record(path: Path) -> dict:
    digest, size = hashlib.sha256(), 0
    buffer = bytearray(CHUNK)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buffer):
            digest.update(memoryview(buffer)[:n])
            size += n
    return {"size": size, "sha256": digest.hexdigest()}


def check_file(path: Path, expected: dict) -> str | None:
    try:
        if not path.is_file():
            return f"file {path.name} is missing"
        if path.stat().st_size != expected["size"]:
            return f"file {path.name} has {path.stat().st_size} bytes, {expected['size']} expected"
        if file_record(path)["sha256"] != expected["sha256"]:
            return f"file {path.name} does not match its sha256 checksum (corrupted)"
    except OSError as err:
        return f"file {path.name} cannot be read: {describe(err)}"
    return None


def verify(path: Path) -> str | None:
    """In one process: None if checkpoint `path` can be trusted, else why not."""
    files = marker_files(path)
    if isinstance(files, str):
        return files
    return next((p for n, rec in files.items() if (p := check_file(Path(path) / n, rec))), None)
