"""End to end on a real two-node Slurm: the generated job scripts across a (virtual) network.

The cluster (tests/slurm/two_node.py) has two Alps-shaped compute nodes, each a network namespace
with its own host name and address on a private bridge, one slurmd each. Ranks on different
nodes talk over that link, so these tests see what one node cannot show: srun spreading ranks
over nodes, torchrun's one agent per node, MASTER_ADDR taken from the node list, the doctor's
measurements between hosts, a preemption signal reaching both nodes, and a node lost mid-job.

The scripts are submitted unchanged, with the same departures as tests/test_slurm_e2e.py (both
take their fixtures and helpers from tests/slurm/fixtures.py and tests/slurm/jobs.py), plus
`--nodes=2` where a configuration asks for one node and fewer tasks per node (this machine has 2
cores for all ranks of both nodes).
Select with `-m slurm`; skips (with the reason) where the cluster cannot start, unless
ALPS_SLURM_REQUIRED=1, where it fails instead.
"""

from __future__ import annotations

import json
import re
import socket
import time
from pathlib import Path

import pytest
import torch
from slurm import jobs
from slurm.two_node import TwoNodeHarness
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(600)]

# srun: one task per node (one GPU each). Two ranks: a sum of two values does not depend on
# the order of the addition, so a resumed run can be compared with an uninterrupted one bit for
# bit (with more ranks, gloo's summation order may differ between runs in the last bit).
SRUN_SHAPE = ("--nodes=2", "--ntasks-per-node=1", "--gpus-per-node=1")
# torchrun: one agent per node starting one worker per GPU, 2 GPUs: ranks 0,1 on the first node,
# 2,3 on the second. (--nodes=2 is the configuration's own.)
TORCHRUN_SHAPE = ("--gpus-per-node=2",)

HOST_LINE = re.compile(
    r"\[rank(\d+)\] \S+ INFO host=(\S+) rank=(\d+) local_rank=(\d+) world=(\d+) .*launcher=(\w+)"
)


def master_port(job_id: int) -> int:
    return 15000 + job_id % 15000  # the job scripts' MASTER_PORT


def check_placement(sub: jobs.Submission, cluster: TwoNodeHarness, per_node: int, starts: int = 1):
    """Ranks 0..per_node-1 ran on the first node, the next ones on the second, each start; all
    of them rendezvoused on the first node (MASTER_ADDR from the node list)."""
    found = HOST_LINE.findall(sub.text())
    assert len(found) == sub.ranks * starts, found
    for _, host, rank, local_rank, world, _ in found:
        node = cluster.nodes[int(rank) // per_node]
        assert (host, int(local_rank), int(world)) == (node, int(rank) % per_node, sub.ranks)
    assert {host for _, host, *_ in found} == set(cluster.nodes)
    rendezvous = f"init_process_group via tcp://{cluster.nodes[0]}:{master_port(sub.job_id)}"
    assert sub.text().count(rendezvous) >= starts, f"no {rendezvous!r} in the log"


def connections(cluster: TwoNodeHarness, node: str) -> set[tuple[str, int]]:
    """(remote address, port) of the established TCP connections in `node`'s namespace."""
    pids = cluster.pids_in(node)
    if not pids:
        return set()
    found = set()
    for line in Path(f"/proc/{pids[0]}/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[3] != "01":  # ESTABLISHED
            continue
        addr, port = fields[2].split(":")
        found.add((socket.inet_ntoa(bytes.fromhex(addr)[::-1]), int(port, 16)))
    return found


def checkpoint_tensors(checkpoint: Path, scratch: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a DCP checkpoint (model, optimizer; the RNG states as bytes), by its path
    in the state."""
    dcp_to_torch_save(checkpoint, scratch)
    state = torch.load(scratch, weights_only=False)
    tensors = {}

    def walk(value, path: str) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                walk(item, f"{path}/{key}")
        elif isinstance(value, list | tuple):
            for index, item in enumerate(value):
                walk(item, f"{path}/{index}")
        elif isinstance(value, torch.Tensor | bytes):  # bytes: the pickled RNG states
            tensors[path] = (
                value
                if isinstance(value, torch.Tensor)
                else torch.frombuffer(bytearray(value), dtype=torch.uint8)
            )

    walk(state, "")
    return tensors


def train_records(sub: jobs.Submission) -> list[dict]:
    lines = (sub.run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


# ----------------------------------------------------------------------------- the cluster


def test_two_node_cluster_runs_a_step_on_each_host(cluster, tmp_path):
    """srun -N2: one task per node, each with the node's name and address; names resolve."""
    show = 'echo "$(hostname) $(hostname -I) $(getent hosts "$1")"'
    proc = cluster.run(
        "srun",
        "-N2",
        "--ntasks-per-node=1",
        "-l",
        "bash",
        "-c",
        show,
        "x",
        cluster.nodes[1],
        cwd=tmp_path,
    )
    lines = sorted(proc.stdout.splitlines())
    peer = f"{cluster.addresses[cluster.nodes[1]]}"
    assert [line.split()[:3] for line in lines] == [
        ["0:", cluster.nodes[0], cluster.addresses[cluster.nodes[0]]],
        ["1:", cluster.nodes[1], cluster.addresses[cluster.nodes[1]]],
    ], proc.stdout
    assert all(line.split()[3] == peer for line in lines), proc.stdout


# ------------------------------------------------------------------ generated repos, two nodes


def test_two_node_srun_ddp_preempted_on_both_nodes_resumes_bit_exactly(
    cluster, repo, tmp_path, dataset
):
    """container + srun, DDP, one rank on each node: USR2 sent to the job stops both ranks at
    one step, one checkpoint is written, the job requeues and resumes; its final checkpoint
    equals that of an uninterrupted run (a second job, alongside) bit for bit: model,
    optimizer, scheduler and RNG states."""
    target = repo("default", "container")
    sub = jobs.submit(
        cluster,
        target,
        tmp_path / "preempted",
        jobs.PREEMPT,
        dataset,
        jobs.slow_first_start(target),
        sbatch_args=SRUN_SHAPE,
        ranks=2,
        single_node=False,
    )
    reference = jobs.submit(
        cluster,
        target,
        tmp_path / "reference",
        jobs.PREEMPT,
        dataset,
        sbatch_args=SRUN_SHAPE,
        ranks=2,
        single_node=False,
    )
    with jobs.explained(reference), jobs.explained(sub):
        sub.wait_for_log(r"INFO step [1-9]\d*/")
        # the ranks on the second node talk to the first node's address: over the link
        first = cluster.addresses[cluster.nodes[0]]
        across = connections(cluster, cluster.nodes[1])
        assert first in {addr for addr, _ in across}, across
        cluster.run("scancel", "--signal=USR2", str(sub.job_id))
        job = sub.wait(timeout=jobs.JOB_TIMEOUT)
        text = sub.text()
        assert job.state == "COMPLETED" and job.restarts == 1
        assert text.count(jobs.SLOWED) == 1, "the first start was not slowed, or the second was"
        stops = re.findall(r"\[rank(\d)\] \S+ WARNING stopping at step (\d+) \(([^)]*)\)", text)
        assert sorted(rank for rank, _, _ in stops) == ["0", "1"], stops
        # scancel signals both nodes' tasks, not at the same instant: a rank the signal reaches
        # after the ranks' agreement step stops because the other asked, at the same step
        reasons = [reason for *_, reason in stops]
        assert "received SIGUSR2" in reasons, stops
        assert set(reasons) <= {"received SIGUSR2", "another rank asked to stop"}, stops
        stop_step = int(stops[0][1])
        assert {int(step) for _, step, _ in stops} == {stop_step} and stop_step < jobs.PREEMPT_STEPS
        assert f"requeueing job {sub.job_id}" in text
        resumed = re.findall(r"\[rank0\] \S+ WARNING RESUMING .* from checkpoint step (\d+)", text)
        assert resumed == [str(stop_step)]
        check_placement(sub, cluster, per_node=1, starts=2)
        jobs.check_log_path(sub, job)
        jobs.check_ranks_trained(sub, max_steps=jobs.PREEMPT_STEPS, starts=2)
        jobs.check_checkpoint(sub, jobs.PREEMPT_STEPS)
        jobs.check_environment_requests(sub, restarts=1)
        records = train_records(sub)
        assert [r["step"] for r in records if r["kind"] == "checkpoint"] == [
            stop_step,
            jobs.PREEMPT_STEPS,
        ]

        ref_job = reference.wait(timeout=jobs.JOB_TIMEOUT)
        assert ref_job.state == "COMPLETED" and ref_job.restarts == 0
        final = f"checkpoints/step-{jobs.PREEMPT_STEPS:08d}"
        resumed_state = checkpoint_tensors(sub.run_dir / final, tmp_path / "resumed.pt")
        reference_state = checkpoint_tensors(reference.run_dir / final, tmp_path / "reference.pt")
        assert resumed_state.keys() == reference_state.keys()
        differ = [k for k in resumed_state if not torch.equal(resumed_state[k], reference_state[k])]
        assert not differ, f"the resumed run is not the uninterrupted one: {differ}"
        assert any(key.startswith("/model/optim/") for key in resumed_state), sorted(resumed_state)
        assert any(key.startswith("/rng/") for key in resumed_state), sorted(resumed_state)


def test_two_node_torchrun_hsdp_after_the_doctor_trains_and_resumes_bit_exactly(
    cluster, repo, tmp_path, dataset
):
    """uenv + torchrun (its configuration asks for 2 nodes), HSDP with one shard group per node
    (hsdp_shard=0: the node's 2 ranks) replicated across the two: one agent per node, the doctor
    first (clock offset and all-reduce bandwidth between the hosts), then training. Then the
    same command again, without the doctor, on the run directory with its last checkpoint moved
    aside: it resumes from step 20 and ends on the first job's step 40 bit for bit (2 x 2: every
    reduction adds two values, whose sum does not depend on the order)."""
    target = repo("uenv-torchrun", "uenv")
    doctor = {"DOCTOR": "1", "DOCTOR_ARGS": "--device cpu"}
    args = [*jobs.QUICK, "parallelism=hsdp"]
    sub = jobs.submit(
        cluster, target, tmp_path, args, dataset, doctor, TORCHRUN_SHAPE, ranks=4, single_node=False
    )
    with jobs.explained(sub):
        job = sub.wait(timeout=jobs.JOB_TIMEOUT)
        text = sub.text()
        assert job.state == "COMPLETED" and job.exit_code == (0, 0)
        nodes = ", ".join(cluster.nodes)
        assert f"doctor: 4 rank(s) on 2 node(s) ({nodes})" in text, text[-3000:]
        assert "doctor: 0 FAIL" in text
        offset = re.search(
            rf"OK +clock_nodes .*{cluster.nodes[1]} [+-]\d+\.\d ms .*round trip", text
        )
        assert offset, text[-3000:]
        between = re.search(r"OK +internode +busbw (\d+\.\d+) GB/s .*2 node", text)
        assert between and float(between.group(1)) > 0, text[-3000:]
        # ranks 0, 1 on the first node and 2, 3 on the second: a node's ranks are one group
        check_placement(sub, cluster, per_node=2)
        assert "parallelism=hsdp: each block sharded over a group of 2 ranks, 2 replicas" in text
        jobs.check_ranks_trained(sub, max_steps=40)
        jobs.check_checkpoint(sub, 40)
        assert 'parallelism = "hsdp"' in (sub.run_dir / "config.toml").read_text()
        jobs.check_environment_requests(sub)

    first = tmp_path / "first-step-40"
    (sub.run_dir / "checkpoints" / "step-00000040").rename(first)
    again = jobs.submit(
        cluster, target, tmp_path, args, dataset, {}, TORCHRUN_SHAPE, ranks=4, single_node=False
    )
    with jobs.explained(again):
        job = again.wait(timeout=jobs.JOB_TIMEOUT)
        text = again.text()
        assert job.state == "COMPLETED" and job.exit_code == (0, 0)
        resumed = re.findall(r"\[rank0\] \S+ WARNING RESUMING .* from checkpoint step (\d+)", text)
        assert resumed == ["20"], text[-3000:]
        check_placement(again, cluster, per_node=2)
        final = again.run_dir / "checkpoints" / "step-00000040"
        resumed_state = checkpoint_tensors(final, tmp_path / "resumed.pt")
        first_state = checkpoint_tensors(first, tmp_path / "first.pt")
        assert resumed_state.keys() == first_state.keys()
        differ = [k for k in resumed_state if not torch.equal(resumed_state[k], first_state[k])]
        assert not differ, f"the resumed run is not the uninterrupted one: {differ}"


def test_two_node_hello_ddp_with_both_launchers(cluster, repo, tmp_path):
    """docs/your-program.md's hello_ddp.py as the page submits it (`--nodes=2`), at once with
    srun (container flavour, one task per node) and torchrun (uenv flavour, one agent per node
    starting one worker): one process group across the hosts, the rendezvous on the first node,
    each rank's file naming its RANK, LOCAL_RANK and WORLD_SIZE. (Not the Alps Extended
    configurations: their srun --mpi=pmix steps collide in the /tmp both nodes share here.)"""
    subs = {}
    for name, flavour, shape in (
        ("default", "container", ("--ntasks-per-node=1", "--gpus-per-node=0")),
        ("uenv-torchrun", "uenv", ("--gpus-per-node=1",)),
    ):
        target = repo(name, flavour)
        jobs.save_page_files(target)
        line = jobs.page_command(target, "hello_ddp.py")
        assert "--nodes=2" in line
        work = tmp_path / target.launcher
        subs[target.launcher] = jobs.submit_line(
            cluster, target, work, line, {"OMP_NUM_THREADS": None}, ("--cpus-per-task=8", *shape), 2
        )
    for launcher, sub in subs.items():
        with jobs.explained(sub):
            job = sub.wait(timeout=jobs.JOB_TIMEOUT)
            text = sub.text()
            assert job.state == "COMPLETED" and job.exit_code == (0, 0), text[-3000:]
            port = str(master_port(sub.job_id))
            for rank, node in enumerate(cluster.nodes):
                path = sub.run_dir / "hello" / f"rank-{rank}.txt"
                seen = dict(item.split("=", 1) for item in path.read_text().split())
                assert seen["host"] == node and seen["sum"] == "1", (launcher, seen)
                assert (seen["RANK"], seen["LOCAL_RANK"]) == (str(rank), "0"), (launcher, seen)
                assert (seen["WORLD_SIZE"], seen["LOCAL_WORLD_SIZE"]) == ("2", "1")
                assert (seen["MASTER_ADDR"], seen["MASTER_PORT"]) == (cluster.nodes[0], port)
                assert seen["OMP_NUM_THREADS"] == "8"  # the CPUs of one process
            said = re.findall(r"rank \d of 2 on alps2n-\d: sum of the ranks 1$", text, re.M)
            assert len(said) == 2, text[-3000:]


LOSS_TIMEOUT_S = 10  # dist_timeout_s of the lost-node test; the cluster's SlurmdTimeout is 20


def jobcomp_states(cluster: TwoNodeHarness, job_id: int) -> list[str]:
    """The state of each end of the job (a requeue ends one start), from the job completion log."""
    states = []
    for line in cluster.jobcomp_log.read_text().splitlines():
        fields = dict(part.split("=", 1) for part in line.split() if "=" in part)
        if fields.get("JobId") == str(job_id):
            states.append(fields.get("JobState"))
    return states


def test_two_node_lost_node_fails_the_survivors_then_the_requeue_resumes(
    cluster, repo, tmp_path, dataset
):
    """The second node's link is cut after the checkpoint of step 20 (the node vanishes; its
    processes keep running): the rank on the first node gives up after dist_timeout_s, Slurm
    declares the node DOWN and ends the start NODE_FAIL, requeueing the job (--requeue); once the
    node is back the job runs again and resumes from the last complete checkpoint."""
    target = repo("default", "container")
    args = [*jobs.QUICK, "max_steps=80", "checkpoint_every=20", f"dist_timeout_s={LOSS_TIMEOUT_S}"]
    shape = ("--nodes=2", "--ntasks-per-node=1", "--gpus-per-node=1")
    sub = jobs.submit(
        cluster, target, tmp_path, args, dataset, sbatch_args=shape, ranks=2, single_node=False
    )
    lost = cluster.nodes[1]
    survivor_error = r"\[rank0\] \S+ ERROR a collective did not complete within dist_timeout_s"
    with jobs.explained(sub):
        sub.wait_for_log(r"checkpoint step 20 complete")
        cluster.cut_link(lost)
        cut_at = time.monotonic()
        try:
            failed_after = None
            while True:  # until Slurm has ended this start (the requeued job is PENDING)
                if failed_after is None and re.search(survivor_error, sub.text()):
                    failed_after = time.monotonic() - cut_at
                state = cluster.job(sub.job_id).state
                if state not in {"RUNNING", "COMPLETING"}:
                    break
                assert time.monotonic() - cut_at < 120, f"still {state} 120 s after the cut"
                time.sleep(0.5)
            complete = [
                int(marker.parent.name.removeprefix("step-"))
                for marker in (sub.run_dir / "checkpoints").glob("step-*/COMPLETE.json")
            ]
        finally:
            cluster.restore_link(lost)
        assert state in {"PENDING", "REQUEUED"}, f"not requeued: {state}"
        cluster.resume_node(lost)  # as an admin would once the node is healthy again
        job = sub.wait(timeout=jobs.JOB_TIMEOUT)
        text = sub.text()
        assert failed_after is not None, "the surviving rank did not name the timeout"
        assert LOSS_TIMEOUT_S - 1 <= failed_after <= LOSS_TIMEOUT_S + 10, failed_after
        # Slurm says the node failed in the log: slurmstepd's "CANCELLED ... DUE TO NODE FAILURE"
        # when the kill reaches the batch step while it runs, srun's "Node failure on <node>" when
        # the batch script ended first (a race between the two; the job record below is the proof)
        assert "DUE TO NODE FAILURE" in text or f"srun: error: Node failure on {lost}" in text
        assert jobcomp_states(cluster, sub.job_id) == ["NODE_FAIL", "COMPLETED"]
        assert job.state == "COMPLETED" and job.restarts == 1
        resumed = re.findall(r"\[rank0\] \S+ WARNING RESUMING .* from checkpoint step (\d+)", text)
        assert complete and resumed == [str(max(complete))], (complete, resumed)
        check_placement(sub, cluster, per_node=1, starts=2)
        jobs.check_ranks_trained(sub, max_steps=80, starts=2)
        jobs.check_checkpoint(sub, 80)
