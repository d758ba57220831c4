"""A second Ctrl-C or SIGTERM stops the run at once; a helper process dies with its parent.

The first SIGINT/SIGTERM asks for a clean stop (preemption.py: all ranks finish the step, write a
checkpoint and exit to be requeued), which can take a slow step plus a checkpoint. A user who
does not want to wait sends the signal again: the process says so, names the last complete
checkpoint (where a restart resumes) and exits immediately with 128 + the signal number, the
status a shell reports for a process killed by that signal. Checkpoints are written atomically,
so one cut off in the middle is simply not used.

SIGUSR2 (Slurm's advance warning before the time limit) never counts: the SIGTERM that follows
it at the limit must not cut short the checkpoint the warning started.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

from .rundir import RunDir

log = logging.getLogger(__name__.split(".")[0])

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
PR_SET_PDEATHSIG = 1  # linux/prctl.h
# One event can deliver two signals: Ctrl-C under torchrun reaches a worker from the terminal
# and again from torchrun. Signals this close together count as one.
SAME_EVENT_S = 0.5


class SecondSignal:
    """Called (from the signal handler) for every signal the run receives. `complete_steps`
    lists the steps of the complete checkpoints in a directory, oldest first (the caller's
    checkpoint.complete_steps: run/ knows no checkpoint format)."""

    def __init__(
        self,
        run_dir: str | Path,
        complete_steps: Callable[[Path], list[int]],
        exit: Callable[[int], object] = os._exit,  # no cleanup: "at once" means at once
        clock: Callable[[], float] = time.monotonic,
        is_main: bool = True,  # rank 0 says what happens; the others stay quiet
    ):
        self.run_dir, self.exit, self.clock = Path(run_dir), exit, clock
        self.complete_steps = complete_steps
        self.first_at: float | None = None
        self.is_main = is_main

    def __call__(self, signum: int) -> None:
        if signum not in STOP_SIGNALS:
            return
        name = signal.Signals(signum).name
        now = self.clock()
        if self.first_at is None:
            self.first_at = now
            if self.is_main:
                log.warning(
                    "received %s: stopping cleanly (the ranks agree at their next check, "
                    "write a checkpoint, then exit); send it again to stop at once",
                    name,
                )
            return
        if now - self.first_at < SAME_EVENT_S:
            return
        self.stop_now(signum)

    def stop_now(self, signum: int) -> None:
        if self.is_main:
            steps = self.complete_steps(RunDir(self.run_dir).checkpoints)
            step = steps[-1] if steps else None
            where = (
                f"the last complete checkpoint is step {step} (a restart resumes there)"
                if step is not None
                else "there is no complete checkpoint yet (a restart begins at step 0)"
            )
            log.warning(
                "received %s, a second stop request: stopping now, without finishing the step "
                "or the checkpoint; %s in %s",
                signal.Signals(signum).name,
                where,
                RunDir(self.run_dir).checkpoints,
            )
            for handler in (
                logging.getLogger(__name__.split(".")[0]).handlers + logging.getLogger().handlers
            ):
                try:
                    handler.flush()  # os._exit skips it
                except (OSError, ValueError):  # a closed or broken stream: nothing to save
                    pass
        self.exit(128 + signum)


def die_with_parent(parent: int) -> bool:
    """In a child process (a make-dataset worker, your program under run/program.py): SIGKILL
    when `parent` exits, kill -9 included (Linux's prctl PR_SET_PDEATHSIG), and exit now if it
    already has. False where the system has no such call: the caller watches its parent itself."""
    armed = False
    if sys.platform.startswith("linux"):
        try:
            armed = ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL) == 0
        except (OSError, AttributeError):
            armed = False
    if os.getppid() != parent:  # gone before the line above took effect
        os._exit(1)
    return armed
