"""Checkpoints: full training state in one file per step, written atomically by rank 0.

`<run_dir>/checkpoints/step-00000100.pt` holds the unwrapped model, optimizer, scheduler, grad
scaler, progress (step, epoch, batch in epoch), the RNG states of every rank, the config, the
world size, the git commit and the torch version. The newest file that loads wins on restart;
a truncated or corrupt one is skipped with a warning.
"""

from __future__ import annotations

import logging
import math
import os
import random
import re
import subprocess
import time
from pathlib import Path

import numpy as np
import torch

from . import distributed

log = logging.getLogger(__package__)

NAME = re.compile(r"step-(\d{8})\.pt")


class Checkpointer:
    """`save(state, step)` on every rank (rank 0 writes); `load_latest()` on every rank."""

    def __init__(self, directory: Path, keep: int, is_main: bool):
        self.directory, self.keep, self.is_main = Path(directory), max(keep, 2), is_main
        if is_main:
            self.directory.mkdir(parents=True, exist_ok=True)
            for stale in self.directory.glob(".step-*.tmp*"):  # left by a kill during a write
                stale.unlink(missing_ok=True)
        distributed.barrier()

    def path(self, step: int) -> Path:
        return self.directory / f"step-{step:08d}.pt"

    def steps(self) -> list[int]:
        """Steps of the checkpoint files present, newest first."""
        found = [NAME.fullmatch(p.name) for p in self.directory.iterdir()]
        return sorted((int(m.group(1)) for m in found if m), reverse=True)

    def save(self, state: dict, step: int) -> float:
        """Write (rank 0), drop old files, wait for everyone. Returns the seconds it took."""
        start = time.perf_counter()
        if self.is_main:
            atomic_save(state, self.path(step))
            for old in self.steps()[self.keep :]:
                self.path(old).unlink(missing_ok=True)
        distributed.barrier()  # no rank runs ahead (or exits) before the file is complete
        return time.perf_counter() - start

    def load_latest(self) -> dict | None:
        """Newest loadable checkpoint (rank 0 picks, every rank loads it to CPU), or None."""
        chosen, state, present = None, None, self.steps()
        if self.is_main:
            for step in present:
                try:
                    state = load(self.path(step))
                    chosen = step
                    break
                except Exception as err:  # truncated, corrupt, or not ours
                    log.warning(
                        "skipping unreadable checkpoint %s: %s",
                        self.path(step),
                        " ".join(str(err).split())[:300] or type(err).__name__,
                    )
        chosen = distributed.broadcast_object(chosen)
        if chosen is None and present:  # starting over would silently discard the run
            raise RuntimeError(
                f"none of the checkpoints in {self.directory} can be loaded; "
                "move them away to start a new run"
            )
        if chosen is not None and not self.is_main:
            state = load(self.path(chosen))
        return state


def atomic_save(obj: dict, path: Path) -> None:
    """Temp file in the same directory, fsync, rename, fsync the directory: a crash at any point
    leaves either the old set of checkpoints or the new complete file, never a partial one under
    the final name."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def load(path: Path) -> dict:
    # map_location="cpu": otherwise every rank would materialise the tensors on the GPU they
    # were saved from (cuda:0), wasting its memory or running out of it.
    state = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(state, dict) or "model" not in state or "step" not in state:
        raise ValueError("not a training checkpoint")
    return state


# --------------------------------------------------------------------------- RNG states


def capture_rng(loader_generator: torch.Generator, np_rng: np.random.Generator) -> dict:
    state = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": np_rng.bit_generator.state,
        "loader": loader_generator.get_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def restore_rng(
    state: dict, loader_generator: torch.Generator, np_rng: np.random.Generator
) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np_rng.bit_generator.state = state["numpy"]
    loader_generator.set_state(state["loader"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def gather_rng(loader_generator: torch.Generator, np_rng: np.random.Generator) -> list[dict]:
    """Every rank's RNG states, in rank order (collective: call on all ranks)."""
    return distributed.all_gather_object(capture_rng(loader_generator, np_rng))


def check_replicas(model: torch.nn.Module) -> None:
    """All ranks must hold the same weights (rank 0 saves for everyone). They diverge only
    through a bug, e.g. rank-dependent code around `no_sync`; fail loudly instead of saving."""
    checksum = float(sum(p.detach().double().sum() for p in model.parameters()))
    sums = distributed.all_gather_object(checksum)
    if len(set(sums)) > 1:
        raise RuntimeError(f"model replicas differ between ranks (parameter sums {sums})")


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


def young_daly_interval(save_s: float, mtbf_s: float) -> float:
    """First-order Young/Daly optimum: sqrt(2 x checkpoint cost x mean time between failures)."""
    return math.sqrt(2.0 * save_s * mtbf_s)


class CheckpointSchedule:
    """When to save: every N steps ("100"), every M minutes ("30min"), "auto" or "0" (never
    periodically; the final and the preemption checkpoints are always written)."""

    def __init__(self, spec: str, mtbf_hours: float):
        self.every_steps, self.every_s, self.auto = 0, 0.0, spec == "auto"
        self.mtbf_s = mtbf_hours * 3600.0
        if spec.endswith("min"):
            self.every_s = float(spec[:-3]) * 60.0
        elif not self.auto:
            self.every_steps = int(spec)
        self.last_save = time.monotonic()
        self.save_s: float | None = None  # measured cost of the last save

    def due_by_steps(self, step: int) -> bool:
        return self.every_steps > 0 and step % self.every_steps == 0

    def due_by_time(self) -> bool:
        """Local decision; the training loop agrees on it across ranks before acting."""
        if self.auto:  # the first save measures the cost; Young/Daly from then on
            interval = 0.0 if self.save_s is None else young_daly_interval(self.save_s, self.mtbf_s)
        elif self.every_s > 0:
            interval = self.every_s
        else:
            return False
        return time.monotonic() - self.last_save >= interval

    def record_save(self, seconds: float) -> None:
        self.save_s, self.last_save = seconds, time.monotonic()

    def describe(self) -> str:
        if self.auto and self.save_s is not None:
            return (
                f"auto: Young/Daly interval "
                f"{young_daly_interval(self.save_s, self.mtbf_s) / 60:.1f} min "
                f"(save {self.save_s:.2f} s, MTBF {self.mtbf_s / 3600:g} h)"
            )
        if self.every_s:
            return f"every {self.every_s / 60:g} min"
        return f"every {self.every_steps} steps" if self.every_steps else "end only"
