"""Checkpoints through torch.distributed.checkpoint (DCP): every rank writes its own shards.

    <run_dir>/checkpoints/step-00000100/
        __0_0.distcp __1_0.distcp ...  each rank's share of the tensors (DCP)
        .metadata                      DCP's index: which bytes of which file hold what
        COMPLETE.json                  written last: every file with its size and sha256

A directory counts only once COMPLETE.json exists. On restart the newest checkpoint whose files
match their checksums is loaded; incomplete or corrupt ones are skipped with a warning naming the
file. A checkpoint written by N ranks loads with M ranks (DCP reshards on load).

What a checkpoint holds is the `parts` given to `CheckpointManager`: objects with
`state_dict()`/`load_state_dict()`, e.g. `ModelAndOptimizer`, `TrainState`, `RNGState`, an LR
scheduler, a GradScaler. `load_model_state`/`export_model` read the model alone, in one process.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import math
import os
import random
import re
import shutil
import subprocess
import time
import warnings
import zlib
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import CheckpointException
from torch.distributed.checkpoint.metadata import BytesStorageMetadata, TensorStorageMetadata
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)

from .config_keys import parse_interval

log = logging.getLogger(__package__)

MARKER = "COMPLETE.json"
NAME = re.compile(r"step-(\d{8})")
CHUNK = 8 << 20  # bytes read at a time when checksumming


def _single_process_is_intended() -> None:
    """DCP warns at every save/load without a process group (also from its writer thread)."""
    warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or")


class CheckpointError(RuntimeError):
    """A checkpoint could not be written, or none of the existing ones can be loaded."""


# --------------------------------------------------------------------------- parts


class ModelAndOptimizer:
    """Model and optimizer through DCP's state-dict helpers: works for a plain module, DDP and
    FSDP2 (`fully_shard`, whose tensors stay sharded); keys carry no `module.`/`_orig_mod.`."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None):
        self.model, self.optimizer = model, optimizer

    def state_dict(self) -> dict:
        if self.optimizer is None:
            return {"model": get_model_state_dict(self.model)}
        model, optim = get_state_dict(self.model, self.optimizer)
        return {"model": model, "optim": optim}

    def load_state_dict(self, state: dict) -> None:
        if self.optimizer is None:
            set_model_state_dict(self.model, state["model"])
        else:
            set_state_dict(
                self.model,
                self.optimizer,
                model_state_dict=state["model"],
                optim_state_dict=state["optim"],
            )


@dataclass
class TrainState:
    """The step, and JSON values in `extra` (data position, dataset fingerprint, config, world
    size, commit, torch version). The same on every rank: one copy is written."""

    step: int = 0
    extra: dict = field(default_factory=dict)

    def state_dict(self) -> dict:
        try:
            extra = json.dumps(self.extra, sort_keys=True)
        except (TypeError, ValueError) as err:
            raise TypeError(
                f"TrainState.extra must hold JSON values (str, number, bool, None, list, dict): "
                f"{err}"
            ) from None
        return {"step": int(self.step), "extra": extra}

    def load_state_dict(self, state: dict) -> None:
        self.step, self.extra = int(state["step"]), json.loads(state["extra"])


class RNGState:
    """Every rank's random generators: torch (CPU, and CUDA if present), Python's `random` and
    `np_rng`. Saving gathers all ranks' states (collective). Loading restores this rank's; a
    rank the checkpoint has no state for (more ranks now) is reseeded deterministically from
    (`seed`, rank, the checkpoint) and says so in `note` and in a warning."""

    def __init__(self, np_rng: np.random.Generator | None = None, seed: int = 0):
        self.np_rng, self.seed = np_rng, seed
        self.note: str | None = None

    def capture(self) -> dict:
        state = {"torch": torch.get_rng_state(), "python": random.getstate()}
        if self.np_rng is not None:
            state["numpy"] = self.np_rng.bit_generator.state
        if torch.cuda.is_available():
            state["cuda"] = torch.cuda.get_rng_state()
        return state

    def restore(self, state: dict) -> None:
        torch.set_rng_state(state["torch"])
        random.setstate(state["python"])
        if self.np_rng is not None and "numpy" in state:
            self.np_rng.bit_generator.state = state["numpy"]
        if "cuda" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state(state["cuda"])

    def state_dict(self) -> dict:
        states = _all_gather(self.capture(), None)
        buffer = io.BytesIO()
        torch.save(states, buffer)
        # One opaque value: DCP would split a list into per-rank keys, and a checkpoint with
        # 2 of them would then not load into a run with 3 ranks.
        return {"per_rank": buffer.getvalue()}

    def load_state_dict(self, state: dict) -> None:
        states = torch.load(io.BytesIO(state["per_rank"]), weights_only=True)
        rank = dist.get_rank() if dist.is_initialized() else 0
        self.note = None
        if rank < len(states):
            self.restore(states[rank])
            return
        mix = zlib.crc32(states[0]["torch"].numpy().tobytes())  # differs between checkpoints
        seq = np.random.SeedSequence([self.seed, rank, mix])
        seed = int(seq.generate_state(1, np.uint64)[0] >> np.uint64(1))
        torch.manual_seed(seed)  # also seeds every CUDA device
        random.seed(seed)
        if self.np_rng is not None:
            self.np_rng.bit_generator.state = type(self.np_rng.bit_generator)(seq).state
        self.note = (
            f"the checkpoint holds random states for {len(states)} rank(s); rank {rank} has "
            "none and is reseeded (dropout/augmentation differ from an uninterrupted run)"
        )
        log.warning("random states: %s", self.note)


# --------------------------------------------------------------------------- manager


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
        timeout_s: float = 600.0,
    ):
        self.directory, self.parts = Path(directory), dict(parts)
        self.keep, self.async_save = max(1, keep), async_save
        self.group = None
        if dist.is_initialized():
            # DCP's own collectives go through a separate gloo group: async save needs a CPU
            # backend, and its background thread must not share NCCL with the training loop.
            self.group = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))
        else:
            _single_process_is_intended()
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
        if self.rank == 0:
            self.directory.mkdir(parents=True, exist_ok=True)
        self._barrier()

    def path(self, step: int) -> Path:
        return self.directory / f"step-{step:08d}"

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
        if self.rank == 0 and path.exists():  # an unfinished write, or a branch abandoned
            shutil.rmtree(path)  # by falling back to an older checkpoint
        self._barrier()  # nobody writes into the directory while it is being removed
        path.mkdir(parents=True, exist_ok=True)
        if not self.async_save:
            dcp.save(self.parts, checkpoint_id=path, **self._group_args())
            self._completed.append(self._finish(step, started, None, None))
            return self._completed[-1]
        upload = dcp.async_save(
            self.parts, checkpoint_id=path, storage_writer=self._writer, process_group=self.group
        )
        stall = time.perf_counter() - started
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="checkpoint-finish")
        self._pending = self._executor.submit(self._finish, step, started, stall, upload)
        return SaveStats(step, stall, None, asynchronous=True)

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
        except (Exception, CheckpointException) as err:  # DCP's is not an Exception
            error = describe(err)
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
                self._prune(step)
            except OSError as err:
                error = describe(err)
        # Also a barrier: no rank exits (e.g. to be requeued) before the marker is durable.
        error = self._broadcast(error)
        if error:
            raise CheckpointError(f"writing checkpoint {path} failed: {error}")
        self._last_step = step
        size = sum(rec["size"] for rec in files.values())
        write = time.perf_counter() - started
        return SaveStats(step, write if stall is None else stall, write, size, upload is not None)

    def _prune(self, newest: int) -> None:
        """Keep `newest` and the keep-1 complete ones before it. Everything else goes: older
        ones, unfinished writes, and steps after `newest` (a branch abandoned by a fallback)."""
        older = [s for s in complete_steps(self.directory) if s < newest]
        kept = older[max(0, len(older) - (self.keep - 1)) :] if self.keep > 1 else []
        for step in _all_steps(self.directory):
            if step != newest and step not in kept:
                shutil.rmtree(self.path(step), ignore_errors=True)

    # ------------------------------------------------------------------ loading

    def load_latest(self) -> int | None:
        """Load the newest complete, verified checkpoint into the parts and return its step;
        None if there is none. Collective. Raises CheckpointError if complete checkpoints
        exist but none of them loads (starting over would silently discard the run)."""
        self._finish_pending(block=True)
        found = None
        if self.rank == 0:  # one view of the directory for every rank
            steps = _all_steps(self.directory)[::-1]
            found = [(s, is_complete(self.path(s))) for s in steps]
            old_format = sorted(p.name for p in self.directory.glob("step-*.pt"))
            if old_format and not any(complete for _, complete in found):
                found = f"{old_format[-1]} is a checkpoint of an older version of this code"
        found = self._broadcast(found)
        if isinstance(found, str):
            raise CheckpointError(f"{self.directory}: {found}; move it away to start a new run")
        problems = []
        for step, complete in found:
            path = self.path(step)
            if not complete:
                if self.rank == 0:  # every rank knows, one says it
                    log.warning(
                        "skipping incomplete checkpoint %s (no %s: its write did not finish)",
                        path,
                        MARKER,
                    )
                continue
            problem = self._verify(path) or self._load(path)
            if problem is None:
                self._last_step = step
                return step
            if self.rank == 0:
                log.warning("skipping checkpoint %s: %s", path, problem)
            problems.append(f"{path.name}: {problem}")
        if problems:
            raise CheckpointError(
                f"no checkpoint in {self.directory} can be loaded ({len(problems)} complete, all "
                f"refused: {'; '.join(problems)}); move them away to start a new run"
            )
        return None

    def _verify(self, path: Path) -> str | None:
        """Every file of the checkpoint against COMPLETE.json, the files spread over the ranks."""
        try:
            files = json.loads((path / MARKER).read_text())["files"] if self.rank == 0 else None
        except (OSError, ValueError, KeyError) as err:
            files = f"{MARKER} unreadable: {err}"
        files = self._broadcast(files)
        if isinstance(files, str):
            return files
        mine = sorted(files)[self.rank :: self.world]
        found = [p for n in mine if (p := _check_file(path / n, files[n]))]
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

    def _barrier(self) -> None:
        if self.group is not None:
            dist.barrier(group=self.group)

    def _gather(self, obj: Any) -> list:
        return _all_gather(obj, self.group) if self.group is not None else [obj]

    def _broadcast(self, obj: Any) -> Any:
        if self.group is None:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0, group=self.group)
        return box[0]


def _all_gather(obj: Any, group) -> list:
    if not dist.is_initialized():
        return [obj]
    out: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, obj, group=group)
    return out


def check_replicas(model: torch.nn.Module) -> None:
    """DDP: all ranks must hold the same weights (DCP writes each replicated tensor from one of
    them). They diverge only through a bug, e.g. rank-dependent code around `no_sync`; fail
    loudly instead of saving. Collective. Not for FSDP, whose ranks hold different shards."""
    checksum = float(sum(p.detach().double().sum() for p in model.parameters()))
    sums = _all_gather(checksum, None)
    if len(set(sums)) > 1:
        raise RuntimeError(f"model replicas differ between ranks (parameter sums {sums})")


def describe(err: BaseException) -> str:
    """One line: DCP wraps each rank's exception, with its traceback, in a CheckpointException."""
    if isinstance(err, CheckpointException) and err.failures:
        rank, (err, _) = next(iter(err.failures.items()))
        return f"rank {rank}: {describe(err)}"
    return " ".join(f"{type(err).__name__}: {err}".split())[:500]


def _writer_of(name: str, world: int) -> int:
    """The rank that wrote a file (DCP names them `__<rank>_<n>.distcp`): it checksums it while
    the file is still in its page cache. Anything else goes to rank 0."""
    match = re.match(r"__(\d+)_", name)
    return int(match.group(1)) % world if match else 0


# --------------------------------------------------------------------------- files


def _all_steps(directory: Path) -> list[int]:
    """Steps of every checkpoint directory, complete or not, oldest first."""
    if not Path(directory).is_dir():
        return []
    found = (NAME.fullmatch(p.name) for p in Path(directory).iterdir() if p.is_dir())
    return sorted(int(m.group(1)) for m in found if m)


def is_complete(path: Path) -> bool:
    return (path / ".metadata").is_file() and (path / MARKER).is_file()


def complete_steps(directory: Path) -> list[int]:
    """Steps of the complete checkpoints in `directory`, oldest first (not verified)."""
    return [s for s in _all_steps(directory) if is_complete(Path(directory) / f"step-{s:08d}")]


def file_record(path: Path) -> dict:
    digest, size = hashlib.sha256(), 0
    buffer = bytearray(CHUNK)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buffer):
            digest.update(memoryview(buffer)[:n])
            size += n
    return {"size": size, "sha256": digest.hexdigest()}


def _check_file(path: Path, expected: dict) -> str | None:
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


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, write: Callable[[Path], None]) -> None:
    """`write(tmp)` to a temp file next to `path`, fsync, rename, fsync the directory: a crash
    at any point leaves the old file or the complete new one, never a partial one."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        write(tmp)
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(path.parent)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    atomic_write(path, lambda tmp: tmp.write_bytes(data))


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


# --------------------------------------------------------------------------- model export


def _find_checkpoint(run_dir: Path) -> list[Path]:
    """Candidates, newest first: `run_dir` itself if it is a checkpoint, else the checkpoints
    in `run_dir/checkpoints` (or in `run_dir`)."""
    run_dir = Path(run_dir)
    if (run_dir / MARKER).exists():
        return [run_dir]
    directory = run_dir / "checkpoints" if (run_dir / "checkpoints").is_dir() else run_dir
    return [directory / f"step-{s:08d}" for s in complete_steps(directory)[::-1]]


def load_model_state(run_dir: Path) -> tuple[dict, dict]:
    """(saved config, full unsharded model state dict on CPU) from the newest complete and
    verified checkpoint of `run_dir` (or from the checkpoint directory `run_dir`). One process,
    no process group needed, whatever the number of ranks that wrote it."""
    candidates = _find_checkpoint(run_dir)
    if not candidates:
        raise CheckpointError(f"no complete checkpoint in {run_dir}")
    for path in candidates:
        marker = json.loads((path / MARKER).read_text())
        problem = next(
            (p for n, rec in marker["files"].items() if (p := _check_file(path / n, rec))), None
        )
        if problem:
            log.warning("skipping checkpoint %s: %s", path, problem)
            continue
        return _read_model(path, marker["parts"])
    raise CheckpointError(f"none of the checkpoints in {run_dir} passes its checksums")


def _read_model(path: Path, parts: dict[str, str]) -> tuple[dict, dict]:
    model_part = next((n for n, kind in parts.items() if kind == "ModelAndOptimizer"), None)
    train_part = next((n for n, kind in parts.items() if kind == "TrainState"), None)
    if model_part is None:
        raise CheckpointError(f"checkpoint {path} holds no ModelAndOptimizer part")
    prefix, extra = f"{model_part}.model.", f"{train_part}.extra"
    flat = read_checkpoint(path, lambda key: key.startswith(prefix) or key == extra)
    config = json.loads(flat.pop(extra, "{}")).get("config", {})
    return config, {key[len(prefix) :]: tensor for key, tensor in flat.items()}


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
    _single_process_is_intended()
    dcp.load(flat, storage_reader=reader, no_dist=True)
    return flat


def export_model(run_dir: Path, out: Path) -> Path:
    """Write the model of the newest checkpoint as one file: `.pt` (a torch.save'd state dict)
    or `.safetensors` (needs the optional `safetensors` package)."""
    out = Path(out)
    if out.suffix not in (".pt", ".safetensors"):
        raise ValueError(f"export: --out must end in .pt or .safetensors, got {str(out)!r}")
    if out.suffix == ".safetensors":
        try:
            import safetensors.torch
        except ImportError:
            raise CheckpointError(
                "exporting .safetensors needs the safetensors package: pip install safetensors"
            ) from None
    config, state = load_model_state(run_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.suffix == ".pt":
        atomic_write(out, lambda tmp: torch.save(state, tmp))
    else:
        meta = {"format": "pt", "config": json.dumps(config, sort_keys=True)}
        atomic_write(out, lambda tmp: safetensors.torch.save_file(state, str(tmp), metadata=meta))
    return out


# --------------------------------------------------------------------------- provenance


def git_commit() -> str | None:
    """Commit of the code being run, or None (no git, not a repository): never fails."""
    try:
        result = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=Path(__file__).parent,
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if result.returncode != 0:
        return None
    return result.stdout.strip() or None


# --------------------------------------------------------------------------- interval


def young_daly_interval(cost_s: float, mtbf_s: float) -> float:
    """First-order Young/Daly optimum: sqrt(2 x checkpoint cost x mean time between failures)."""
    return math.sqrt(2.0 * cost_s * mtbf_s)


class CheckpointSchedule:
    """When to save: every N steps ("100"), every M minutes ("30min"), "auto" or "0" (never
    periodically; the final and the preemption checkpoints are always written).

    "auto" uses Young/Daly with the cost a save has for training: its stall (with async saves
    much less than the write), but never more often than a write takes."""

    def __init__(self, spec: str, mtbf_hours: float):
        interval = parse_interval(spec)  # the one parser of checkpoint_every
        self.every_steps, self.every_s = interval.steps, interval.minutes * 60.0
        self.auto, self.mtbf_s = interval.auto, mtbf_hours * 3600.0
        self.last_save = time.monotonic()
        self.stall_s: float | None = None  # measured stall of the last save
        self.write_s: float | None = None  # measured time of the last complete write

    def due_by_steps(self, step: int) -> bool:
        return self.every_steps > 0 and step % self.every_steps == 0

    def interval_s(self) -> float:
        if self.auto:  # the first save measures the cost; Young/Daly from then on
            if self.stall_s is None:
                return 0.0
            return max(young_daly_interval(self.stall_s, self.mtbf_s), self.write_s or 0.0)
        return self.every_s

    def due_by_time(self) -> bool:
        """Local decision; the training loop agrees on it across ranks before acting."""
        if not self.auto and self.every_s <= 0:
            return False
        return time.monotonic() - self.last_save >= self.interval_s()

    def record_save(self, stall_s: float) -> None:
        self.stall_s, self.last_save = stall_s, time.monotonic()

    def record_write(self, write_s: float) -> None:
        self.write_s = write_s

    def describe(self) -> str:
        if self.auto and self.stall_s is not None:
            return (
                f"auto: Young/Daly interval {self.interval_s() / 60:.1f} min "
                f"(stall {self.stall_s:.2f} s per save, MTBF {self.mtbf_s / 3600:g} h)"
            )
        if self.every_s:
            return f"every {self.every_s / 60:g} min"
        return f"every {self.every_steps} steps" if self.every_steps else "end only"
