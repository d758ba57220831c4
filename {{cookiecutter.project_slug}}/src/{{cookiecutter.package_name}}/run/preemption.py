"""Preemption and time limits: signals only set a flag; ranks agree at fixed steps and stop
together, save, and exit with REQUEUE_EXIT_CODE so the batch script requeues the job.

Slurm sends `--signal=USR2@<seconds>` before the time limit, and SIGTERM at the limit, on
preemption and on scancel (then SIGKILL after KillWait, 30 s by default). Saving inside the
handler could run in the middle of a backward pass or a collective, so the handler only records
the signal; the training loop acts on it at the next agreement step.
"""

from __future__ import annotations

import math
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .. import distributed
from ..config_keys import AUTO, key, parse_interval
from .atomic import atomic_write_text
from .rundir import RunDir


# fmt: off
@dataclass
class CheckpointKeys:
    checkpoint_every: str = key("100", '"N" steps, "Mmin" minutes, "Xepochs", "auto" '
                                '(Young/Daly), "0" (end)', check=parse_interval)
    keep_checkpoints: int = key(3, "complete checkpoints kept", bounds=(2, 10**6))
    async_checkpoint: str = key("auto", "write in the background: auto (on GPU)",
                                choices=AUTO)
    mtbf_hours: float = key(24.0, 'mean time between failures of the job, for "auto"',
                            bounds=(1e-3, 1e6))


@dataclass
class PreemptionKeys:
    preempt_check_every: int = key(10, "steps between the ranks' agreement on stopping or "
                                   "saving", bounds=(1, 10**6))
    end_time_margin_s: float = key(60.0, "safety margin before SLURM_JOB_END_TIME",
                                   bounds=(0, 86400))
# fmt: on


REQUEUE_EXIT_CODE = 3  # "checkpoint written, please requeue me"; 0 = finished, 1 = failure
# SIGUSR1: what other guides put in `#SBATCH --signal=USR1@...` (the job scripts use USR2);
# without a handler it would end the run at once, with no checkpoint. SIGINT: Ctrl-C.
# SIGHUP: the terminal of a run started by hand went away (a dropped ssh session)
SIGNALS = (signal.SIGUSR2, signal.SIGUSR1, signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class PreemptionFlag:
    """Records SIGUSR2/SIGUSR1/SIGTERM/SIGINT. Install in the main thread; handlers run between
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


def write_requeue_marker(run_dir: RunDir, reason: str) -> None:
    """`<run_dir>/REQUEUE`: the job script requeues when it is newer than the step's start."""
    atomic_write_text(RunDir.of(run_dir).requeue, reason + "\n")


def remove_requeue_marker(run_dir: RunDir) -> None:
    RunDir.of(run_dir).requeue.unlink(missing_ok=True)


# --------------------------------------------------------------------------- checkpoint schedule


def young_daly_interval(cost_s: float, mtbf_s: float) -> float:
    """First-order Young/Daly optimum: sqrt(2 x checkpoint cost x mean time between failures)."""
    return math.sqrt(2.0 * cost_s * mtbf_s)


class CheckpointSchedule:
    """When to save: every N steps ("100"), every M minutes ("30min"), "auto" or "0" (never
    periodically; the final and the preemption checkpoints are always written). Every X epochs
    ("1epoch") is the loop's to decide (training/epochs.py: `every_epochs` here).

    "auto" uses Young/Daly with the cost a save has for training: its stall (with async saves
    much less than the write), but never more often than a write takes."""

    def __init__(self, spec: str, mtbf_hours: float):
        interval = parse_interval(spec)  # the one parser of checkpoint_every
        self.every_steps, self.every_s = interval.steps, interval.minutes * 60.0
        self.auto, self.mtbf_s = interval.auto, mtbf_hours * 3600.0
        self.every_epochs = interval.epochs
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
        if self.every_epochs:
            return f"every {self.every_epochs:g} epoch(s)"
        return f"every {self.every_steps} steps" if self.every_steps else "end only"
