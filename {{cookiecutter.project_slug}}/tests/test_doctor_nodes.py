"""doctor_nodes: the clock offset and all-reduce bandwidth between hosts (one rank per node)."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
import torch
from conftest import PACKAGE, REPO, free_port, rank_env

doctor_nodes = pytest.importorskip(f"{PACKAGE}.doctor.nodes")

# Two gloo ranks on this machine that claim different hosts; RANK_CLOCK_SHIFT_S moves rank 1's
# clock (time.time) as a node with a wrong clock would have it.
DRIVER = """
import importlib, json, os, time
from datetime import timedelta
import torch, torch.distributed as dist

doctor_nodes = importlib.import_module(os.environ["PACKAGE"] + ".doctor.nodes")
rank = int(os.environ["RANK"])
if rank == 1:
    shift, real_time = float(os.environ["RANK_CLOCK_SHIFT_S"]), time.time
    time.time = lambda: real_time() + shift
dist.init_process_group(
    "gloo", init_method="tcp://127.0.0.1:" + os.environ["MASTER_PORT"], rank=rank,
    world_size=int(os.environ["WORLD_SIZE"]), timeout=timedelta(seconds=60),
)
hosts = json.loads(os.environ["FAKE_HOSTS"])
checks = doctor_nodes.between_nodes(rank, hosts, torch.device("cpu"), quick=True)
dist.destroy_process_group()
print(json.dumps(checks))
"""


def between_nodes(hosts: list[str], clock_shift_s: float = 0.0) -> list[list]:
    """Run between_nodes on len(hosts) gloo ranks; rank 0's checks (the others must be [])."""
    port, procs = free_port(), []
    for rank in range(len(hosts)):
        env = rank_env(rank, len(hosts), port)
        env |= {"FAKE_HOSTS": json.dumps(hosts), "RANK_CLOCK_SHIFT_S": str(clock_shift_s)}
        env["PACKAGE"] = PACKAGE
        cmd = [sys.executable, "-c", DRIVER]
        procs.append(
            subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        )
    outputs = [p.communicate(timeout=90) for p in procs]
    for proc, (_, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, err.decode()
    results = [json.loads(out) for out, _ in outputs]
    assert all(r == [] for r in results[1:]), results
    return results[0]


def test_measures_clock_offset_and_bandwidth_between_the_hosts_leaders():
    # ranks 0,1 on node-a and 2 on node-b: leaders 0 and 2. Rank 1's clock is 5 s off, but it is
    # not a leader: only node-b's (rank 2's) clock is measured, and it is this machine's.
    clock, bandwidth = between_nodes(["node-a", "node-a", "node-b"], clock_shift_s=5.0)
    assert clock[:2] == ["OK", "clock_nodes"], clock
    measured = re.search(r"node-b ([+-]\d+\.\d) ms \(within (\d+\.\d) ms", clock[2])
    assert measured, clock
    offset_ms, bound_ms = map(float, measured.groups())
    assert abs(offset_ms) <= bound_ms + 0.1, "one clock: the offset is within its error bound"
    assert bandwidth[:2] == ["OK", "internode"], bandwidth
    assert "one rank on each of 2 nodes (gloo on CPU): reported, not compared" in bandwidth[2]
    assert float(re.search(r"busbw (\d+\.\d+) GB/s", bandwidth[2]).group(1)) > 0


def test_a_node_with_a_wrong_clock_is_named():
    clock, _ = between_nodes(["node-a", "node-b"], clock_shift_s=5.0)
    assert clock[:2] == ["WARN", "clock_nodes"], clock
    assert "node-b's clock is +5.0 s off node-a's" in clock[2]


def test_one_host_measures_nothing():
    # no process group here: a collective would raise
    assert doctor_nodes.between_nodes(0, ["node-a", "node-a"], torch.device("cpu"), True) == []


def test_node_leaders():
    assert doctor_nodes.node_leaders(["a", "a", "b", "b", "c"]) == [0, 2, 4]
    assert doctor_nodes.node_leaders(["b", "a", "b"]) == [0, 1]


def test_estimate_offset_uses_the_shortest_round_trip():
    # remote clock 2.0 s ahead; the second sample's 10 ms round trip bounds the error to 5 ms
    samples = [(100.0, 102.3, 100.5), (101.0, 103.005, 101.01), (102.0, 104.1, 102.2)]
    offset, rtt = doctor_nodes.estimate_offset(samples)
    assert rtt == pytest.approx(0.01) and offset == pytest.approx(2.0)


def test_check_node_bandwidth_against_an_expected_figure():
    mib = doctor_nodes.MIB
    ok = doctor_nodes.check_node_bandwidth(20.0, 64 * mib, 2, "NCCL", (24.0, "Slingshot"))
    slow = doctor_nodes.check_node_bandwidth(5.0, 64 * mib, 2, "NCCL", (24.0, "Slingshot"))
    assert ok[0] == "OK" and "expected 24 GB/s (Slingshot)" in ok[2]
    assert slow[0] == "WARN" and "below half of the 24 GB/s" in slow[2]
