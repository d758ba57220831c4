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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from . import distributed

REQUEUE_EXIT_CODE = 3  # "checkpoint written, please requeue me"; 0 = finished, 1 = failure
REQUEUE_MARKER = "REQUEUE"
SIGNALS = (signal.SIGUSR2, signal.SIGTERM, signal.SIGINT)  # SIGINT: Ctrl-C


class PreemptionFlag:
    """Records SIGUSR2/SIGTERM/SIGINT. Install in the main thread; handlers run between
    bytecodes. `on_signal(signum)` sees each signal first (interrupts.SecondSignal)."""

    def __init__(self, on_signal: Callable[[int], None] | None = None) -> None:
        self.received: int | None = None
        self.on_signal = on_signal
        self._previous: dict[int, object] = {}

    def __enter__(self) -> PreemptionFlag:
        for sig in SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handler)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _handler(self, signum: int, frame) -> None:
        if self.on_signal is not None:
            self.on_signal(signum)  # a second SIGINT/SIGTERM exits there
        self.received = signum  # nothing else: no I/O, no collectives here

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


@dataclass(frozen=True)
class Decision:
    stop: bool  # all ranks stop after this step (a checkpoint is written first)
    save: bool  # all ranks write a checkpoint after this step
    reason: str = ""  # why they stop


class StopPolicy:
    """When to stop and when to save, decided alike on every rank.

    Checkpoints by step count and the last step need no communication; a signal, the job's end
    time and a time-based checkpoint are local observations, so every `check_every` steps the
    ranks agree on them (one tiny all-reduce). `poll(step)` after every optimizer step.
    """

    def __init__(
        self,
        flag,
        deadline: Deadline,
        schedule,
        check_every: int,
        max_steps: int,
        device: torch.device,
    ):
        self.flag, self.deadline, self.schedule = flag, deadline, schedule
        self.check_every, self.max_steps, self.device = check_every, max_steps, device
        self.restart_clock(0)

    def restart_clock(self, step: int) -> None:
        """Exclude a checkpoint or an evaluation from the step-time estimate."""
        self._clock, self._clock_step = time.perf_counter(), step

    def poll(self, step: int) -> Decision:
        save = self.schedule.due_by_steps(step) or step == self.max_steps
        if step % self.check_every or step >= self.max_steps:
            return Decision(False, save)
        now = time.perf_counter()
        step_s = (now - self._clock) / max(step - self._clock_step, 1)
        self.restart_clock(step)
        write_s = self.schedule.write_s or 0.0  # a stop must wait for its checkpoint to be durable
        near_end = self.deadline.near(step_s * self.check_every, write_s)
        stop, save_by_time = agree(
            self.flag.requested or near_end, self.schedule.due_by_time(), self.device
        )
        if not stop:
            return Decision(False, save or save_by_time)
        if self.flag.requested:
            reason = f"received {signal.Signals(self.flag.received).name}"
        elif near_end:
            reason = "SLURM_JOB_END_TIME near"
        else:
            reason = "another rank asked to stop"
        return Decision(True, True, reason)


def write_requeue_marker(run_dir: Path, reason: str) -> None:
    (Path(run_dir) / REQUEUE_MARKER).write_text(reason + "\n")


def remove_requeue_marker(run_dir: Path) -> None:
    (Path(run_dir) / REQUEUE_MARKER).unlink(missing_ok=True)
