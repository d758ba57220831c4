"""Preemption and time limits: signals only set a flag; ranks agree at fixed steps and stop
together, save, and exit with REQUEUE_EXIT_CODE so the batch script requeues the job.

Slurm sends `--signal=USR2@<seconds>` before the time limit, and SIGTERM at the limit, on
preemption and on scancel (then SIGKILL after KillWait, 30 s by default). Saving inside the
handler could run in the middle of a backward pass or a collective, so the handler only records
the signal; the training loop acts on it at the next agreement step.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import torch

from . import distributed

REQUEUE_EXIT_CODE = 3  # "checkpoint written, please requeue me"; 0 = finished, 1 = failure
REQUEUE_MARKER = "REQUEUE"
SIGNALS = (signal.SIGUSR2, signal.SIGTERM)


class PreemptionFlag:
    """Records SIGUSR2/SIGTERM. Install in the main thread; handlers run between bytecodes."""

    def __init__(self) -> None:
        self.received: int | None = None
        self._previous: dict[int, object] = {}

    def __enter__(self) -> PreemptionFlag:
        for sig in SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handler)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _handler(self, signum: int, frame) -> None:
        self.received = signum  # nothing else: no I/O, no logging, no collectives here

    @property
    def requested(self) -> bool:
        return self.received is not None


class Deadline:
    """Stop before SLURM_JOB_END_TIME (epoch seconds), independent of any signal."""

    def __init__(self, end_time: float | None, safety_s: float) -> None:
        self.end_time, self.safety_s = end_time, safety_s

    @classmethod
    def from_env(cls, safety_s: float) -> Deadline:
        value = os.environ.get("SLURM_JOB_END_TIME", "")
        return cls(float(value) if value.strip().isdigit() else None, safety_s)

    def near(self, until_next_check_s: float, save_s: float, now: float | None = None) -> bool:
        """True if waiting for the next agreement step could leave no time to save."""
        if self.end_time is None:
            return False
        now = time.time() if now is None else now
        return now + until_next_check_s + save_s + self.safety_s >= self.end_time


def agree(stop: bool, save: bool, device: torch.device) -> tuple[bool, bool]:
    """Any rank's wish counts (MAX): all ranks stop, or save, at the same step."""
    flags = torch.tensor([float(stop), float(save)], device=device)
    distributed.all_reduce(flags, torch.distributed.ReduceOp.MAX)
    stop_all, save_all = flags.tolist()
    return stop_all > 0, save_all > 0


def write_requeue_marker(run_dir: Path, reason: str) -> None:
    (Path(run_dir) / REQUEUE_MARKER).write_text(reason + "\n")


def remove_requeue_marker(run_dir: Path) -> None:
    (Path(run_dir) / REQUEUE_MARKER).unlink(missing_ok=True)
