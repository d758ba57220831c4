"""`CheckpointManager`: saves and loads the parts of a run as DCP checkpoints, every rank
writing its own shards, and keeps the newest few. See `integrity` for when one is trusted."""

from __future__ import annotations

import json
import logging
import re
import shutil
import time
import warnings
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import CheckpointException
from torch.distributed.checkpoint.metadata import BytesStorageMetadata, TensorStorageMetadata

from ..run.atomic import atomic_write_text
from .integrity import (
    MARKER,
    CheckpointError,
    all_steps,
    check_file,
    complete_steps,
    describe,
    file_record,
    files_in_metadata,
    is_complete,
    is_interrupted_save,
    marker_files,
    step_path,
    why_unverifiable,
    writing_note,
)
from .state import TrainState, all_gather

log = logging.getLogger(__name__.split(".")[0])


def single_process_is_intended() -> None:
    """DCP warns at every save/load without a process group (also from its writer thread)."""
    warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or")


@dataclass
class SaveStats:
    step: int
    stall_s: float  # the training loop was blocked this long (waiting for the previous write too)
    write_s: float | None  # from save() until the checkpoint was complete; None while writing
    bytes: int = 0
    asynchronous: bool = False


class CheckpointManager:
    """Saves and loads `parts` (name -> object with state_dict/load_state_dict) as DCP
    checkpoints under `directory`, keeping the newest `keep` complete ones.

    Create it on every rank at the same point (it makes a process group). With `async_save`,
    `save` returns once the state is copied to CPU memory and the write goes on in the
    background; the next `save` waits for it. Call `wait()` before exiting (a preemption stop
    included): a write not finished by then is not a checkpoint.
    """

    def __init__(
        self,
        directory: Path,
        parts: dict[str, Any],
        keep: int = 3,
        async_save: bool = False,
        timeout_s: float = 300.0,  # train passes dist_timeout_s
    ):
        self.directory, self.parts = Path(directory), dict(parts)
        self.keep, self.async_save = max(1, keep), async_save
        self.group = None
        if dist.is_initialized():
            # DCP's own collectives go through a separate gloo group: async save needs a CPU
            # backend, and its background thread must not share NCCL with the training loop.
            self.group = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))
        else:
            single_process_is_intended()
        self.rank = dist.get_rank() if self.group else 0
        self.world = dist.get_world_size() if self.group else 1
        self._pending: Future | None = None
        self._completed: list[SaveStats] = []
        self._last_step: int | None = None  # newest checkpoint saved or loaded here
        self._executor: ThreadPoolExecutor | None = None
        self._writer = None
        if async_save and torch.cuda.is_available():
            # Reused for every save: it keeps a pinned CPU copy of the state, so staging is a
            # fast device-to-host copy instead of allocating host memory each time.
            self._writer = dcp.FileSystemWriter(self.directory, cache_staged_state_dict=True)
        error = None
        if self.rank == 0:
            error = _attempt(lambda: self.directory.mkdir(parents=True, exist_ok=True))
        self._raise_any(error, f"cannot create the checkpoint folder {self.directory}")

    def path(self, step: int) -> Path:
        return step_path(self.directory, step)

    def steps(self) -> list[int]:
        """Steps of the complete checkpoints, oldest first."""
        return complete_steps(self.directory)

    # ------------------------------------------------------------------ saving

    def save(self, step: int) -> SaveStats:
        """Checkpoint the parts as step `step` (collective: every rank, same step)."""
        started = time.perf_counter()
        for name, part in self.parts.items():
            if isinstance(part, TrainState) and part.step != step:
                raise ValueError(f"save({step}) but parts[{name!r}].step is {part.step}")
        self._finish_pending(block=True)  # the previous write finishes first
        if step == self._last_step:  # already on disk (e.g. a final save right after another)
            return SaveStats(step, time.perf_counter() - started, 0.0)
        path = self.path(step)
        error = _attempt(lambda: self._prepare(path)) if self.rank == 0 else None
        # also the barrier: nobody writes into the directory while it is being prepared
        self._raise_any(error, f"cannot write checkpoint {path}")
        if not self.async_save:
            try:
                dcp.save(self.parts, checkpoint_id=path, **self._group_args())
            except (OSError, CheckpointException) as err:  # DCP's is not an Exception
                self._discard(path)  # every rank got the error: all writes have ended
                raise CheckpointError(
                    f"writing checkpoint {path} failed: {describe(err, path.parent)}"
                ) from None
            self._completed.append(self._finish(step, started, None, None))
            return self._completed[-1]
        try:
            upload = dcp.async_save(
                self.parts,
                checkpoint_id=path,
                storage_writer=self._writer,
                process_group=self.group,
            )
        except (OSError, CheckpointException) as err:
            raise CheckpointError(
                f"writing checkpoint {path} failed: {describe(err, path.parent)}"
            ) from None
        stall = time.perf_counter() - started
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="checkpoint-finish")
        self._pending = self._executor.submit(self._finish, step, started, stall, upload)
        return SaveStats(step, stall, None, asynchronous=True)

    def _prepare(self, path: Path) -> None:
        """Rank 0, before a write: note that `path` is being written (so that a kill leaves
        a directory known to be an interrupted save), and clear what is in the way."""
        if path.exists() and not is_interrupted_save(path):
            # a checkpoint refused at load (corrupt) on a branch abandoned by a fallback: kept
            aside = path.with_name(f"{path.name}.refused-{int(time.time())}")
            path.rename(aside)
            log.warning("moved checkpoint %s aside to %s (not deleted)", path, aside.name)
        writing_note(path).write_text("")
        if path.exists():
            shutil.rmtree(path)
        path.mkdir()

    def _discard(self, path: Path) -> None:
        """A failed write leaves nothing half-written (rank 0; the other ranks are done)."""
        if self.rank == 0:
            shutil.rmtree(path, ignore_errors=True)
            writing_note(path).unlink(missing_ok=True)

    def poll(self) -> list[SaveStats]:
        """Saves completed since the last call (with their write time), without blocking.
        Raises CheckpointError if a background write failed."""
        return self._collect(block=False)

    def wait(self) -> list[SaveStats]:
        """Block until a background write is complete; then like `poll`."""
        return self._collect(block=True)

    def close(self) -> None:
        self.wait()
        if self._executor is not None:
            self._executor.shutdown()

    def _collect(self, block: bool) -> list[SaveStats]:
        self._finish_pending(block)
        done, self._completed = self._completed, []
        return done

    def _finish_pending(self, block: bool) -> None:
        if self._pending is not None and (block or self._pending.done()):
            pending, self._pending = self._pending, None
            self._completed.append(pending.result())  # re-raises a failed write

    def _finish(
        self, step: int, started: float, stall: float | None, upload: Future | None
    ) -> SaveStats:
        """Checksum (each rank the files it wrote), then rank 0 writes the marker and removes
        old checkpoints. Collective; runs in the background thread for async saves."""
        path, error, names, mine = self.path(step), None, None, {}
        # Errors are passed on, not raised, until every rank has taken part in each collective.
        try:
            if upload is not None:
                upload.result()
            if self.rank == 0:
                names = sorted(p.name for p in path.iterdir())
                # every rank's shards must be here, not where a rank with another run_dir put them
                missing = sorted(files_in_metadata(path) - set(names))
                if missing:
                    error = f"its metadata names {missing[0]}, which is not in {path}"
        except (Exception, CheckpointException) as err:  # DCP's is not an Exception
            error = describe(err, path.parent)
        names = self._broadcast(names)
        try:
            for name in names or []:
                if not error and _writer_of(name, self.world) == self.rank:
                    mine[name] = file_record(path / name)
        except OSError as err:
            error = describe(err)
        results = self._gather((error, mine))
        errors = [e for e, _ in results if e]
        if errors:
            self._discard(path)
            raise CheckpointError(f"writing checkpoint {path} failed: {errors[0]}")
        files = {name: rec for _, recs in results for name, rec in recs.items()}
        if self.rank == 0:
            marker = {
                "step": step,
                "world_size": self.world,
                "parts": {name: type(part).__name__ for name, part in self.parts.items()},
                "torch_version": str(torch.__version__),
                "time": time.time(),
                "files": dict(sorted(files.items())),
            }
            try:
                atomic_write_text(path / MARKER, json.dumps(marker, indent=1) + "\n")
                writing_note(path).unlink(missing_ok=True)
                self._prune(step)
            except OSError as err:
                error = describe(err)
                if not is_complete(path):
                    self._discard(path)
        # Also a barrier: no rank exits (e.g. to be requeued) before the marker is durable.
        error = self._broadcast(error)
        if error:
            raise CheckpointError(f"writing checkpoint {path} failed: {error}")
        self._last_step = step
        size = sum(rec["size"] for rec in files.values())
        write = time.perf_counter() - started
        return SaveStats(step, write if stall is None else stall, write, size, upload is not None)

    def _prune(self, newest: int) -> None:
        """Keep `newest` and the keep-1 complete ones before it. Removed: older ones, and
        interrupted saves. Never removed: a step after `newest` that is not an interrupted
        save (nothing shows it is older than a verified checkpoint)."""
        older = [s for s in complete_steps(self.directory) if s < newest]
        kept = older[max(0, len(older) - (self.keep - 1)) :] if self.keep > 1 else []
        for step in all_steps(self.directory):
            path = self.path(step)
            if step == newest or step in kept:
                continue
            if step < newest or is_interrupted_save(path):
                shutil.rmtree(path, ignore_errors=True)
                writing_note(path).unlink(missing_ok=True)
        for note in self.directory.glob("step-*.writing"):  # left by a kill after the marker
            if not note.with_suffix("").is_dir():
                note.unlink(missing_ok=True)

    # ------------------------------------------------------------------ loading

    def load_latest(self) -> int | None:
        """Load the newest complete, verified checkpoint into the parts and return its step;
        None if there is none. Collective. Raises CheckpointError if complete checkpoints
        exist but none of them loads, or if a step directory that cannot be verified is newer
        than the one loaded (starting over would silently discard the run)."""
        self._finish_pending(block=True)
        found = None
        if self.rank == 0:
            try:
                found = self._survey()
            except OSError as err:  # every rank must learn it, not wait for rank 0
                found = f"cannot read the checkpoints: {describe(err)}"
        found = self._broadcast(found)
        if isinstance(found, str):
            raise CheckpointError(f"{self.directory}: {found}; move it away to start a new run")
        problems, unverifiable, loaded = [], [], None
        for step, kind in found:
            path = self.path(step)
            if kind == "interrupted":
                if self.rank == 0:  # every rank knows, one says it
                    log.warning(
                        "skipping incomplete checkpoint %s (no %s: its write did not finish)",
                        path,
                        MARKER,
                    )
                continue
            if kind != "complete":
                unverifiable.append(kind)
                continue
            problem = self._verify(path) or self._load(path)
            if problem is None:
                loaded = step
                break
            if self.rank == 0:
                log.warning("skipping checkpoint %s: %s", path, problem)
            problems.append(f"{path.name}: {problem}")
        if unverifiable:
            raise CheckpointError(
                f"{self.directory}: cannot verify {', '.join(unverifiable)}, and no save of this "
                "run was interrupted there; starting over (or from an older checkpoint) would "
                f"delete {'them' if len(unverifiable) > 1 else 'it'} at the next save. Move "
                f"{'them' if len(unverifiable) > 1 else 'it'} away to start over, or restore "
                f"{MARKER}"
            )
        if loaded is None and problems:
            raise CheckpointError(
                f"no checkpoint in {self.directory} can be loaded ({len(problems)} complete, all "
                f"refused: {'; '.join(problems)}); move them away to start a new run"
            )
        self._last_step = loaded
        return loaded

    def _survey(self) -> list[tuple[int, str]]:
        """Rank 0: (step, "complete" | "interrupted" | why unverifiable), newest first."""
        found = []
        for step in all_steps(self.directory)[::-1]:
            path = self.path(step)
            if is_complete(path):
                kind = "complete"
            else:
                kind = "interrupted" if is_interrupted_save(path) else why_unverifiable(path)
            found.append((step, kind))
        return found

    def _verify(self, path: Path) -> str | None:
        """Every file of the checkpoint against COMPLETE.json, the files spread over the ranks."""
        files = self._broadcast(marker_files(path) if self.rank == 0 else None)
        if isinstance(files, str):
            return files
        mine = sorted(files)[self.rank :: self.world]
        found = [p for n in mine if (p := check_file(path / n, files[n]))]
        found = [p for ps in self._gather(found) for p in ps]
        return found[0] if found else None

    def _load(self, path: Path) -> str | None:
        try:
            dcp.load(self.parts, checkpoint_id=path, **self._group_args())
            problem = None
        except (Exception, CheckpointException) as err:  # DCP's is not an Exception
            problem = describe(err)
        found = [p for p in self._gather(problem) if p]
        return found[0] if found else None

    # ------------------------------------------------------------------ collectives

    def _group_args(self) -> dict:
        return {"process_group": self.group, "no_dist": self.group is None}

    def _raise_any(self, error: str | None, what: str) -> None:
        """Rank 0's error, on every rank (also a barrier)."""
        error = self._broadcast(error)
        if error:
            raise CheckpointError(f"{what}: {error}")

    def _gather(self, obj: Any) -> list:
        return all_gather(obj, self.group) if self.group is not None else [obj]

    def _broadcast(self, obj: Any) -> Any:
        if self.group is None:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0, group=self.group)
        return box[0]


def _attempt(action) -> str | None:
    try:
        action()
    except OSError as err:
        return describe(err)
    return None


def _writer_of(name: str, world: int) -> int:
    """The rank that wrote a file (DCP names them `__<rank>_<n>.distcp`): it checksums it while
    the file is still in its page cache. Anything else goes to rank 0."""
    match = re.match(r"__(\d+)_", name)
    return int(match.group(1)) % world if match else 0


def read_checkpoint(path: Path, wanted: Callable[[str], bool] = lambda key: True) -> dict:
    """The entries of checkpoint `path` (not verified), flat (`<part>.<key>...` -> value),
    tensors whole and on CPU, in one process: for tools and tests."""
    reader = dcp.FileSystemReader(path)
    # The metadata knows every tensor's full shape: allocate them empty and let DCP fill them,
    # assembling the shards written by each rank.
    flat = {}
    for key, meta in reader.read_metadata().state_dict_metadata.items():
        if wanted(key) and isinstance(meta, TensorStorageMetadata):
            flat[key] = torch.empty(meta.size, dtype=meta.properties.dtype)
        elif wanted(key) and isinstance(meta, BytesStorageMetadata):
            flat[key] = None
    single_process_is_intended()
    dcp.load(flat, storage_reader=reader, no_dist=True)
    return flat
