"""The run directory and the paths in it, named once:

    <run_dir>/
        checkpoints/step-00000100/   sharded checkpoints (see `checkpoint`)
        metrics.jsonl                one JSON record per log step, eval and checkpoint
        config.toml                  the resolved configuration of the run
        LOCK                         who trains here now (see `run/lock.py`)
        REQUEUE                      "checkpoint written, requeue me" (the job script reads it)
        tracker.json                 the experiment tracker's run id (W&B)
        tensorboard/  wandb/         tracker output, if one is configured

Pass a `RunDir` around, not a string. I/O failures on these paths end the run with
`RunDirError`: one line naming the path and the cause.
"""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

CHECKPOINTS = "checkpoints"
METRICS = "metrics.jsonl"
CONFIG = "config.toml"
LOCK = "LOCK"
REQUEUE = "REQUEUE"  # the job script tests "${RUN_DIR}/REQUEUE": keep the two equal
TRACKER_STATE = "tracker.json"


class RunDirError(RuntimeError):
    """The run directory, or a file in it, cannot be used (one line: path and cause)."""


def os_error_text(err: OSError) -> str:
    """'No space left on device: /path' — the errno text and the path, one line."""
    cause = err.strerror or (errno.errorcode.get(err.errno, "") if err.errno else "") or str(err)
    name = err.filename if err.filename is not None else ""
    return f"{cause}: {name}" if name else cause


@contextmanager
def reported(what: str) -> Iterator[None]:
    """Turn an OSError inside into RunDirError("<what>: <cause>: <path>")."""
    try:
        yield
    except OSError as err:
        named = err.filename is not None and str(err.filename) in what
        cause = err.strerror or str(err) if named else os_error_text(err)
        raise RunDirError(f"{what}: {cause}") from None


@contextmanager
def removed_if_refused(
    run_dir: RunDir, is_main: bool, refusals: tuple[type[Exception], ...]
) -> Iterator[None]:
    """A run directory made inside (on rank 0) is removed again when the start is refused for
    bad input before any checkpoint (`refusals`: the errors that say so, e.g. a ConfigError for
    an init_from that is not the model, a DatasetError for data the model cannot read): a
    refused run leaves no empty run directory behind."""
    new = is_main and not run_dir.path.exists()
    try:
        yield
    except refusals:
        if new and not any(run_dir.checkpoints.glob("step-*")):
            shutil.rmtree(run_dir.path, ignore_errors=True)
        raise


@dataclass(frozen=True)
class RunDir:
    path: Path

    def __init__(self, path: str | os.PathLike) -> None:
        object.__setattr__(self, "path", Path(path))

    @classmethod
    def of(cls, value: RunDir | str | os.PathLike) -> RunDir:
        return value if isinstance(value, RunDir) else cls(value)

    def __fspath__(self) -> str:
        return os.fspath(self.path)

    def __str__(self) -> str:
        return str(self.path)

    @property
    def checkpoints(self) -> Path:
        return self.path / CHECKPOINTS

    @property
    def metrics(self) -> Path:
        return self.path / METRICS

    @property
    def config(self) -> Path:
        return self.path / CONFIG

    @property
    def lock(self) -> Path:
        return self.path / LOCK

    @property
    def requeue(self) -> Path:
        return self.path / REQUEUE

    @property
    def tracker_state(self) -> Path:
        return self.path / TRACKER_STATE

    @property
    def tensorboard(self) -> Path:
        return self.path / "tensorboard"

    @property
    def profile(self) -> Path:
        """profile_steps traces (profiling.py)."""
        return self.path / "profile"

    def create(self) -> None:
        """The run directory exists and can be written (checked before the lock is taken)."""
        self._folder(self.path)

    def prepare(self) -> None:
        """The checkpoints folder exists and can be written, and metrics.jsonl can be appended
        to: checked before training, so that a read-only file system, a full disk or a file
        where a folder belongs ends here, in one line, not in the middle of a run."""
        self._folder(self.checkpoints)
        if self.metrics.is_dir():
            raise RunDirError(f"{self.metrics} is a directory, not a file: move it away")
        with reported(f"cannot append to {self.metrics}"), open(self.metrics, "a"):
            pass

    @staticmethod
    def _folder(folder: Path) -> None:
        if folder.exists() and not folder.is_dir():
            raise RunDirError(
                f"{folder} is a file, not a directory: move it away or choose another run_dir"
            )
        with reported(f"cannot create the directory {folder}"):
            folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".probe{os.getpid()}"
        with reported(f"cannot write into {folder}"):
            try:
                with open(probe, "wb") as f:
                    f.write(b"probe")
            finally:
                probe.unlink(missing_ok=True)
