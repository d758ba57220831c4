"""How `benchmark` times its loops and compares them: blocks of steps, timed by the wall clock
and by the process's CPU time, and the median over rounds of the ratios of two loops' blocks."""

from __future__ import annotations

import dataclasses
import statistics
import time
from dataclasses import dataclass

import torch


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class Blocks:
    """One loop's timed blocks, in seconds per step: by the wall clock, and by this process's
    CPU time (time.process_time: its own work, whatever else runs on the cores)."""

    wall: list[float] = dataclasses.field(default_factory=list)
    cpu: list[float] = dataclasses.field(default_factory=list)

    def time(self, step, device: torch.device, n: int) -> None:
        """Run `n` steps, synchronised at the ends only, and record their time per step."""
        sync(device)
        wall, cpu = time.perf_counter(), time.process_time()
        for _ in range(n):
            step()
        sync(device)
        self.wall.append((time.perf_counter() - wall) / n)
        self.cpu.append((time.process_time() - cpu) / n)


def paired_ratio(ours: list[float], theirs: list[float]) -> float:
    """The median over the rounds of the package's block time over the other loop's block of the
    same round. Blocks of one round run back to back and share the machine's load; a median of
    each loop's blocks would compare blocks from different load phases (on a shared CPU the two
    medians scattered by up to 30 % run to run)."""
    return statistics.median(o / t for o, t in zip(ours, theirs, strict=True))


def round_quartiles(ours: list[float], theirs: list[float]) -> list[float]:
    """The first and third quartiles of the rounds' ratios: how far single rounds scatter."""
    ratios = [o / t for o, t in zip(ours, theirs, strict=True)]
    if len(ratios) < 2:
        return ratios * 2
    first, _, third = statistics.quantiles(ratios, n=4, method="inclusive")
    return [first, third]
