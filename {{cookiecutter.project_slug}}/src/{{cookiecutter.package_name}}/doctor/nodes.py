"""Doctor checks between nodes: how far apart the hosts' clocks are, and the all-reduce bandwidth
of the network between them (one rank per node, so the links inside a node do not count).

The doctor's all-reduce over every rank mixes NVLink inside a node with the network between
nodes; a slow or misconfigured network link hides behind the fast local one. Here the lowest rank
of each host (its "leader") alone all-reduces, so the figure is the network's. The clock check
is NTP's: rank 0 sends its time to each other leader and gets that leader's time back; the offset
is the leader's time minus the midpoint of the round trip, exact to half the round trip.

Every rank calls `between_nodes` at the same point (it runs collectives on the default group,
gloo in the doctor); on one node it returns nothing and communicates nothing.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch
import torch.distributed as dist

from .checks import MAX_CLOCK_SKEW_S, MIB, OK, WARN, WARN_FRACTION

PING_ROUNDS = 8  # round trips per node; the shortest one gives the estimate
QUICK_SIZES = (MIB, 16 * MIB)
FULL_SIZES = (MIB, 64 * MIB, 256 * MIB)

Check = tuple[str, str, str]  # (status, check name, one-line message): the doctor's Result


def node_leaders(hosts: Sequence[str]) -> list[int]:
    """The lowest rank on each host (`hosts[rank]`), in the order the hosts first appear."""
    first: dict[str, int] = {}
    for rank, host in enumerate(hosts):
        first.setdefault(host, rank)
    return list(first.values())


def estimate_offset(samples: Sequence[tuple[float, float, float]]) -> tuple[float, float]:
    """(offset, round trip) in seconds from (sent, remote time, received) samples: the sample
    with the shortest round trip; offset = remote - midpoint, its error at most round trip / 2."""
    sent, remote, received = min(samples, key=lambda s: s[2] - s[0])
    return remote - (sent + received) / 2, received - sent


def check_clock_offsets(reference: str, offsets: dict[str, tuple[float, float]]) -> Check:
    """`offsets`: host -> (offset, round trip) against rank 0's host `reference`."""
    parts = [
        f"{host} {offset * 1e3:+.1f} ms (within {rtt * 1e3 / 2:.1f} ms, half the round trip)"
        for host, (offset, rtt) in offsets.items()
    ]
    shown = ", ".join(parts[:3]) + (", ..." if len(parts) > 3 else "")
    worst_host, (worst, rtt) = max(offsets.items(), key=lambda item: abs(item[1][0]))
    if abs(worst) - rtt / 2 > MAX_CLOCK_SKEW_S:
        return (
            WARN,
            "clock_nodes",
            f"{worst_host}'s clock is {worst:+.1f} s off {reference}'s: timestamps of different "
            "nodes do not line up; report the node to CSCS",
        )
    return OK, "clock_nodes", f"clock offsets against {reference}: {shown}"


def check_node_bandwidth(
    busbw: float, nbytes: int, nodes: int, backend: str, expected: tuple[float, str] | None
) -> Check:
    found = f"busbw {busbw:.2f} GB/s at {nbytes // MIB} MiB, one rank on each of {nodes} nodes"
    if expected is None:
        return OK, "internode", f"{found} ({backend}): reported, not compared"
    figure, where = expected
    if busbw < WARN_FRACTION * figure:
        return (
            WARN,
            "internode",
            f"{found} ({backend}): below half of the {figure:g} GB/s expected ({where}) between "
            "nodes: rerun with NCCL_DEBUG=INFO and look for 'Using network AWS Libfabric'",
        )
    return OK, "internode", f"{found} ({backend}): expected {figure:g} GB/s ({where})"


def clock_offsets(rank: int, leaders: Sequence[int], rounds: int) -> dict[int, tuple[float, float]]:
    """Rank 0 exchanges times with each other leader (point to point, default group); on rank 0
    {leader: (offset, round trip)}, elsewhere {}."""
    found = {}
    buffer = torch.zeros(1, dtype=torch.float64)
    for peer in leaders[1:]:
        if rank == 0:
            samples = []
            for _ in range(rounds):
                sent = time.time()
                dist.send(torch.tensor([sent], dtype=torch.float64), dst=peer)
                dist.recv(buffer, src=peer)
                samples.append((sent, buffer.item(), time.time()))
            found[peer] = estimate_offset(samples)
        elif rank == peer:
            for _ in range(rounds):
                dist.recv(buffer, src=0)
                buffer.fill_(time.time())
                dist.send(buffer, dst=0)
    return found


def leaders_allreduce_s(
    rank: int, leaders: list[int], group, nbytes: int, device: torch.device, iters: int
) -> float:
    """Seconds per all-reduce of `nbytes` among the leaders (`group`), for the slowest one."""
    elapsed = 0.0
    if rank in leaders:
        data = torch.zeros(nbytes // 4, dtype=torch.float32, device=device)  # zeros stay finite
        dist.all_reduce(data, group=group)  # connection set-up and warm-up, untimed
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(data, group=group)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        elapsed = (time.perf_counter() - start) / iters
    slowest = torch.tensor([elapsed], dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)  # default group: every rank
    return slowest.item()


def between_nodes(
    rank: int,
    hosts: Sequence[str],
    device: torch.device,
    quick: bool,
    expected: tuple[float, str] | None = None,
) -> list[Check]:
    """The clock and bandwidth checks between the hosts in `hosts` (rank -> host, the same list
    on every rank), on rank 0; [] on the other ranks and on a single host."""
    leaders = node_leaders(hosts)
    if len(leaders) < 2:
        return []
    offsets = clock_offsets(rank, leaders, PING_ROUNDS)
    backend = "nccl" if device.type == "cuda" else "gloo"
    group = dist.new_group(ranks=leaders, backend=backend)  # every rank takes part in making it
    best, n = (0.0, 0), len(leaders)
    for nbytes in QUICK_SIZES if quick else FULL_SIZES:
        seconds = leaders_allreduce_s(rank, leaders, group, nbytes, device, 3 if quick else 10)
        best = max(best, (nbytes / seconds / 1e9 * 2 * (n - 1) / n, nbytes))  # busbw, nccl-tests
    if rank in leaders:
        dist.destroy_process_group(group)
    if rank != 0:
        return []
    clock = check_clock_offsets(hosts[0], {hosts[peer]: offsets[peer] for peer in offsets})
    shown = "NCCL" if device.type == "cuda" else "gloo on CPU"
    return [clock, check_node_bandwidth(*best, n, shown, expected)]
