"""Rank/world/device resolution from torchrun and Slurm variables, node lists, srun check."""

import os
import re
import subprocess
from pathlib import Path

import pytest
import torch

from {{ cookiecutter.package_name }} import distributed
from {{ cookiecutter.package_name }}.distributed import LaunchError, choose_device, expand_nodelist, resolve_env


@pytest.mark.parametrize(
    ("nodelist", "hosts"),
    [
        ("nid001234", ["nid001234"]),
        (
            "nid[001234-001237,001240]",
            ["nid001234", "nid001235", "nid001236", "nid001237", "nid001240"],
        ),
        ("a[1-2],b3", ["a1", "a2", "b3"]),
        ("nid[0098-0101]", ["nid0098", "nid0099", "nid0100", "nid0101"]),
        ("x[1,3]-ib,login", ["x1-ib", "x3-ib", "login"]),
        ("r[1-2]n[01-02]", ["r1n01", "r1n02", "r2n01", "r2n02"]),
    ],
)
def test_expand_nodelist(nodelist, hosts):
    assert expand_nodelist(nodelist) == hosts


@pytest.mark.parametrize("bad", ["nid[001-", "nid]1[", "nid[a-b]"])
def test_malformed_nodelist_is_an_error(bad):
    with pytest.raises(ValueError):
        expand_nodelist(bad)


SRUN_STEP = {
    "SLURM_JOB_ID": "4242",
    "SLURM_NTASKS": "8",
    "SLURM_STEP_NUM_TASKS": "8",
    "SLURM_PROCID": "5",
    "SLURM_LOCALID": "1",
    "SLURM_NODEID": "1",
    "SLURM_STEP_ID": "0",
    "SLURM_STEP_TASKS_PER_NODE": "4(x2)",
    "SLURM_JOB_NODELIST": "nid[001236-001237]",
    "SLURM_STEP_NODELIST": "nid[001236-001237]",
}


def test_torchrun_variables_win():
    env = resolve_env(
        {
            "RANK": "3",
            "WORLD_SIZE": "4",
            "LOCAL_RANK": "1",
            "LOCAL_WORLD_SIZE": "2",
            "MASTER_ADDR": "nodeA",
            "MASTER_PORT": "1234",
            **SRUN_STEP,
        }
    )
    assert (env.rank, env.world_size, env.local_rank, env.local_world_size) == (3, 4, 1, 2)
    assert (env.master_addr, env.master_port, env.launcher) == ("nodeA", 1234, "env")


def test_srun_step_variables():
    env = resolve_env(SRUN_STEP)
    assert (env.rank, env.world_size, env.local_rank, env.local_world_size) == (5, 8, 1, 4)
    assert env.master_addr == "nid001236"  # first host, parsed without scontrol
    assert env.master_port == distributed.port_from_job_id("4242")
    assert env.launcher == "srun"


def test_master_port_from_job_id_is_stable_and_below_ephemeral_range():
    ports = {distributed.port_from_job_id(str(j)) for j in range(100000, 100100)}
    assert len(ports) == 100 and all(15000 <= p < 30000 for p in ports)
    assert distributed.port_from_job_id("77") == distributed.port_from_job_id("77")


def test_job_script_port_is_the_packages():
    """The job scripts (their shared jobs/common.sh) set MASTER_PORT for torchrun; without it
    (plain srun) the package derives the same port: the two formulas must not drift apart."""
    script = Path(__file__).parents[1] / "jobs" / "common.sh"
    (line,) = re.findall(r"^MASTER_PORT=.*$", script.read_text(), re.M)
    for job_id in ("1", "14999", "15000", "123456789"):
        out = subprocess.run(
            ["bash", "-c", f'SLURM_JOB_ID={job_id}\n{line}\necho "$MASTER_PORT"'],
            capture_output=True,
            text=True,
            check=True,
        )
        assert int(out.stdout) == distributed.port_from_job_id(job_id), (script.name, job_id)


def test_master_addr_and_port_from_env_take_precedence():
    env = resolve_env({**SRUN_STEP, "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29999"})
    assert (env.master_addr, env.master_port) == ("10.0.0.1", 29999)


def test_single_process_without_launcher():
    env = resolve_env({})
    assert (env.rank, env.world_size, env.launcher) == (0, 1, "single")
    one_task = resolve_env({"SLURM_NTASKS": "1", "SLURM_PROCID": "0", "SLURM_JOB_ID": "1"})
    assert one_task.world_size == 1


def test_refuses_several_tasks_outside_an_srun_step():
    """`python -m pkg` directly in an sbatch with --ntasks=8 would wait forever for 7 peers."""
    batch_script = {k: v for k, v in SRUN_STEP.items() if not k.startswith("SLURM_STEP")} | {
        "SLURM_PROCID": "0"
    }
    with pytest.raises(LaunchError, match="srun"):
        resolve_env(batch_script)


def test_uneven_tasks_per_node():
    assert distributed.tasks_on_node("3,2", 1) == 2
    assert distributed.tasks_on_node("4(x3),1", 2) == 4
    assert distributed.tasks_on_node("4(x3),1", 3) == 1


@pytest.mark.parametrize(
    ("requested", "local_rank", "local_world", "gpus", "visible", "expected"),
    [
        ("auto", 0, 1, 0, None, "cpu"),
        ("auto", 3, 4, 0, None, "cpu"),
        ("cpu", 1, 2, 4, None, "cpu"),  # CPU on a GPU node when asked
        ("auto", 3, 4, 4, "0,1,2,3", "cuda:3"),  # all four GPUs visible: index = local rank
        ("cuda", 3, 4, 1, "3", "cuda:0"),  # --gpus-per-task=1: its own GPU, as index 0
        ("auto", 0, 1, 1, None, "cuda:0"),  # one process on a one-GPU machine
    ],
)
def test_choose_device(requested, local_rank, local_world, gpus, visible, expected):
    assert choose_device(requested, local_rank, local_world, gpus, 0, visible) == torch.device(
        expected
    )


def test_two_ranks_on_one_gpu_is_a_clear_error_before_nccl():
    with pytest.raises(LaunchError, match=r"rank 1 .*local rank 1 of 2.*only 1 GPU.*device=cpu"):
        choose_device("auto", 1, 2, 1, rank=1, visible=None)


def test_cuda_without_a_gpu_names_the_rank_and_the_fix():
    with pytest.raises(LaunchError, match=r"rank 5: device=cuda but no GPU.*--gpus-per-node"):
        choose_device("cuda", 1, 4, 0, rank=5, visible="")


def test_process_group_binds_the_device_from_the_visible_count(monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    for key in ("RANK", "WORLD_SIZE", "SLURM_NTASKS", "SLURM_STEP_NUM_TASKS"):
        monkeypatch.delenv(key, raising=False)
    threads = torch.get_num_threads()
    with distributed.process_group(timeout_s=10, threads=1, device="auto") as (env, device):
        assert env.world_size == 1 and device == torch.device("cpu")
        assert not torch.distributed.is_initialized()
    torch.set_num_threads(threads)


def test_cpu_threads_per_rank():
    env = resolve_env({})
    assert distributed.cpu_threads(3, env, {}) == 3
    assert distributed.cpu_threads(0, env, {"OMP_NUM_THREADS": "2"}) == 2
    assert distributed.cpu_threads(0, env, {"SLURM_CPUS_PER_TASK": "72"}) == 72


def test_cpu_threads_under_torchrun_share_the_task_cpus():
    """torchrun puts OMP_NUM_THREADS=1 in every worker's environment: on a task bound to 288
    cores with 4 workers each rank gets 72 threads, not 1; cpu_threads=N still wins."""
    torchrun = {
        "TORCHELASTIC_RUN_ID": "none",
        "RANK": "1",
        "WORLD_SIZE": "4",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "4",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29500",
    }
    env = resolve_env(torchrun)
    assert env.local_world_size == 4
    worker = {**torchrun, "OMP_NUM_THREADS": "1", "SLURM_CPUS_PER_TASK": "288"}
    assert distributed.cpu_threads(0, env, worker, bound_cpus=288) == 72
    assert distributed.cpu_threads(0, env, worker, bound_cpus=2) == 1  # never 0
    assert distributed.cpu_threads(5, env, worker, bound_cpus=288) == 5
    # by default the CPUs this process is bound to, whatever SLURM_CPUS_PER_TASK claims
    expected = max(1, len(os.sched_getaffinity(0)) // 4)
    assert distributed.cpu_threads(0, env, worker) == expected
