"""The doctor's all-reduce test over every rank: the bus bandwidth measured at a few sizes, as
nccl-tests defines it, and compared with what Alps should deliver (NVLink inside a node,
Slingshot between nodes; the figures: checks.py's EXPECTED_BUSBW)."""

from __future__ import annotations

import argparse
import re
import time

import torch
import torch.distributed as dist

from ..distributed import DistEnv
from .checks import AWS_LIBFABRIC, EXPECTED_BUSBW, MIB, OK, WARN, WARN_FRACTION, Result

FULL_SIZES = tuple(s * MIB for s in (1, 4, 16, 64, 256, 1024))
QUICK_SIZES = tuple(s * MIB for s in (1, 8, 64))


def bus_bandwidth(nbytes: int, seconds: float, world: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s for an all-reduce of `nbytes`, as nccl-tests defines them
    (NVIDIA/nccl-tests doc/PERFORMANCE.md): algbw = size / time; busbw = algbw * 2(n-1)/n, the
    rate each rank's link moves data, comparable with the hardware's link bandwidth."""
    algbw = nbytes / seconds / 1e9
    return algbw, algbw * 2 * (world - 1) / world


def expected_busbw(device_type: str, nodes: int, ranks_per_node: int) -> tuple[float, str] | None:
    if device_type != "cuda":
        return None
    if nodes == 1:
        return EXPECTED_BUSBW["nvlink"] if ranks_per_node > 1 else None
    return EXPECTED_BUSBW["slingshot-4" if ranks_per_node >= 4 else "slingshot-1"]


def check_bandwidth(
    busbw: float, nbytes: int, backend: str, expected: tuple[float, str] | None
) -> Result:
    found = f"busbw {busbw:.1f} GB/s at {format_size(nbytes)} ({backend})"
    if expected is None:
        return Result(OK, "allreduce", f"{found}: reported, not compared")
    figure, where = expected
    if busbw < WARN_FRACTION * figure:
        return Result(
            WARN,
            "allreduce",
            f"{found}: below half of the {figure:g} GB/s expected ({where}); NCCL may be on TCP "
            "sockets or without NVLink: rerun with NCCL_DEBUG=INFO and look for "
            f"'Using network {AWS_LIBFABRIC}'",
        )
    return Result(OK, "allreduce", f"{found}: expected {figure:g} GB/s ({where})")


def format_size(nbytes: int) -> str:
    if nbytes >= 2**30 and nbytes % 2**30 == 0:
        return f"{nbytes // 2**30} GiB"
    if nbytes >= MIB and nbytes % MIB == 0:
        return f"{nbytes // MIB} MiB"
    return f"{nbytes} B"


def parse_sizes(text: str) -> tuple[int, ...]:
    """`1M,64M,1G` -> bytes (K/M/G are powers of 1024; a plain number is bytes)."""
    sizes = []
    for item in text.split(","):
        match = re.fullmatch(r"\s*(\d+)\s*([KMG]?)i?B?\s*", item, re.I | re.ASCII)
        if match is None or int(match.group(1)) == 0:
            raise argparse.ArgumentTypeError(
                f"bad size {item.strip()!r} in --sizes: use e.g. 1M,64M,1G"
            )
        sizes.append(int(match.group(1)) * 1024 ** " KMG".index(match.group(2).upper() or " "))
    return tuple(sizes)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_allreduce(nbytes: int, device: torch.device, group, warmup: int, iters: int) -> float:
    """Seconds per all-reduce of `nbytes` float32 on `group`, for the slowest rank."""
    data = torch.zeros(nbytes // 4, dtype=torch.float32, device=device)  # zeros stay finite
    for _ in range(warmup):
        dist.all_reduce(data, group=group)
    sync(device)
    dist.barrier()  # all ranks start the timed loop together
    start = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(data, group=group)
    sync(device)
    elapsed = torch.tensor([(time.perf_counter() - start) / iters], dtype=torch.float64)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # on the gloo group
    return elapsed.item()


def bandwidth_test(
    env: DistEnv,
    device: torch.device,
    sizes: tuple[int, ...],
    quick: bool,
    hosts: list[str],
    expect: float | None,
) -> tuple[list[str], Result]:
    """Rows of the table (rank 0 prints them) and the verdict on the best bus bandwidth."""
    if env.world_size == 1:
        return [], Result(OK, "allreduce", "single process: no all-reduce to measure")
    group, backend = None, "gloo on CPU"
    if device.type == "cuda":
        group, backend = dist.new_group(backend="nccl"), "NCCL"
    warmup = 1 if quick else 3
    rows = [f"{'size':>10} {'time ms':>10} {'algbw GB/s':>11} {'busbw GB/s':>11}"]
    best = (0.0, sizes[0])
    dist.all_reduce(torch.zeros(1, device=device), group=group)  # communicator set-up, untimed
    for nbytes in sizes:
        iters = 3 if quick else (20 if nbytes <= 64 * MIB else 5)
        seconds = time_allreduce(nbytes, device, group, warmup, iters)
        algbw, busbw = bus_bandwidth(nbytes, seconds, env.world_size)
        rows.append(f"{format_size(nbytes):>10} {seconds * 1e3:10.2f} {algbw:11.2f} {busbw:11.2f}")
        best = max(best, (busbw, nbytes))
    if expect is not None:
        expected = (expect, "--expect-busbw")
    else:
        per_node = max(hosts.count(h) for h in hosts)
        expected = expected_busbw(device.type, len(set(hosts)), per_node)
    return rows, check_bandwidth(best[0], best[1], backend, expected)
