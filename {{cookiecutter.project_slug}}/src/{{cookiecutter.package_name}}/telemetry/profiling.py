"""Profile a window of training steps: `profile_steps=START:END` (and `profile_memory=true`).

Every rank writes, under `<run_dir>/profile/`:
- `rank<R>-steps<START>-<END>.trace.json`: a torch.profiler trace of those optimizer steps (CPU
  ops, and CUDA kernels on a GPU), each step marked `train step N`; Chrome trace format, which
  https://ui.perfetto.dev opens (docs/profiling.md says how to read it);
- with `profile_memory=true` on CUDA, `rank<R>-steps<START>-<END>.memory.pickle`: a CUDA memory
  snapshot of the window (every allocation with its stack), for https://pytorch.org/memory_viz.
  On a CPU there is no CUDA allocator to record: the snapshot is skipped (and said so); the trace
  still carries the CPU memory events.
Only the window is traced: evaluation and checkpoints are outside it.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from ..config_keys import ConfigError, key
from ..run.atomic import atomic_write
from ..run.rundir import RunDir

log = logging.getLogger(__name__.split(".")[0])


@dataclass
class ProfilingKeys:
    profile_steps: str = key(
        "", '"START:END": torch.profiler trace of those steps per rank ("": off)'
    )
    profile_memory: bool = key(False, "with profile_steps: memory events, CUDA memory snapshot")


WINDOW = re.compile(r"([0-9]+):([0-9]+)", re.ASCII)
MEMORY_ENTRIES = 200_000  # allocation events kept in the CUDA memory history


def parse_window(text: str) -> tuple[int, int] | None:
    """`"START:END"` (optimizer steps, 1-based, inclusive) or `""` (no profiling)."""
    if not text:
        return None
    match = WINDOW.fullmatch(text.strip())
    if not match or not 1 <= int(match.group(1)) <= int(match.group(2)):
        raise ConfigError(
            "config key 'profile_steps' expects START:END with 1 <= START <= END (optimizer "
            f'steps, e.g. "10:12"), or "" for no profiling; got {text!r}'
        )
    return int(match.group(1)), int(match.group(2))


def check_profile_keys(profile_steps: str, profile_memory: bool) -> None:
    if parse_window(profile_steps) is None and profile_memory:
        raise ConfigError(
            "config key 'profile_memory' needs profile_steps=START:END, the steps to record"
        )


class StepProfiler:
    """Traces this rank's optimizer steps in the configured window; a no-op outside it."""

    def __init__(self, profile_steps: str, profile_memory: bool, rank: int, device, run_dir):
        self.window = parse_window(profile_steps)
        self.memory = profile_memory
        self.rank, self.device = rank, torch.device(device)
        self.out_dir = RunDir.of(run_dir).profile
        self.profiler: torch.profiler.profile | None = None
        self.first_step = 0
        self.last_step = 0

    @contextmanager
    def step(self, step: int) -> Iterator[None]:
        """Wrap one optimizer step (`with profiler.step(step): train_step(...)`)."""
        if self.window is None or not self.window[0] <= step <= self.window[1]:
            yield
            return
        if self.profiler is None:  # the window's first step (or a resume inside the window)
            self._start(step)
        with torch.profiler.record_function(f"train step {step}"):
            yield
        self.last_step = step
        if step == self.window[1]:
            self.close()

    def _start(self, step: int) -> None:
        cuda = self.device.type == "cuda"
        activities = [torch.profiler.ProfilerActivity.CPU]
        if cuda:
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        if self.memory and cuda:
            torch.cuda.memory._record_memory_history(max_entries=MEMORY_ENTRIES)
        elif self.memory and self.rank == 0:
            log.info(
                "profile_memory: no CUDA device, so the CUDA memory snapshot is skipped (the "
                "trace still records CPU memory events)"
            )
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.profiler = torch.profiler.profile(
            activities=activities, record_shapes=True, profile_memory=self.memory
        )
        self.profiler.start()
        self.first_step = step

    def _path(self, suffix: str) -> Path:
        name = f"rank{self.rank}-steps{self.first_step}-{self.last_step}{suffix}"
        return self.out_dir / name

    def close(self) -> None:
        """Stop and write the files (also when the run ends inside the window)."""
        if self.profiler is None:
            return
        profiler, self.profiler, self.window = self.profiler, None, None  # once per run
        profiler.stop()
        if self.last_step < self.first_step:  # stopped before the first step completed
            if self.memory and self.device.type == "cuda":
                torch.cuda.memory._record_memory_history(enabled=None)
            return
        trace = self._path(".trace.json")
        # never half a trace under the final name
        atomic_write(trace, lambda tmp: profiler.export_chrome_trace(str(tmp)))
        written = [trace]
        if self.memory and self.device.type == "cuda":
            snapshot = self._path(".memory.pickle")
            atomic_write(snapshot, lambda tmp: torch.cuda.memory._dump_snapshot(str(tmp)))
            torch.cuda.memory._record_memory_history(enabled=None)
            written.append(snapshot)
        if self.rank == 0:
            log.info(
                "profiled steps %d-%d: wrote %s (and the other ranks' files beside them); open "
                "the trace in https://ui.perfetto.dev (docs/profiling.md)",
                self.first_step,
                self.last_step,
                ", ".join(str(p) for p in written),
            )
