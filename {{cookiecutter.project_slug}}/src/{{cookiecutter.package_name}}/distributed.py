"""Distributed setup: who this process is, which device it uses, the process group, logging.

Resolution order for rank / world size / local rank:
1. `RANK`, `WORLD_SIZE`, `LOCAL_RANK` (torchrun, or a wrapper that exports them);
2. Slurm task variables `SLURM_PROCID`, `SLURM_NTASKS`, `SLURM_LOCALID` (one `srun` task per GPU);
3. a single process.
"""

from __future__ import annotations

import faulthandler
import gc
import logging
import os
import re
import socket
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from .config_keys import first_line, key

log = logging.getLogger(__package__)


@dataclass
class DistributedKeys:
    dist_timeout_s: float = key(300.0, "a collective that hangs this long fails the job",
                                bounds=(1, 86400))  # fmt: skip
    cpu_threads: int = key(0, "threads per rank; 0: OMP_NUM_THREADS, SLURM_CPUS_PER_TASK, or "
                           "cores", bounds=(0, 1024))  # fmt: skip


DEFAULT_PORT = 29500


class LaunchError(RuntimeError):
    """The process was started in a way that cannot work (e.g. an sbatch without srun)."""


@dataclass(frozen=True)
class DistEnv:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: str
    master_port: int
    launcher: str  # "env" (torchrun or exported RANK/WORLD_SIZE), "srun" or "single"

    @property
    def is_main(self) -> bool:
        return self.rank == 0


# --------------------------------------------------------------------------- Slurm parsing


def expand_nodelist(nodelist: str) -> list[str]:
    """Expand a Slurm host list such as `nid[001234-001237,001240],login3` into host names.

    Done in Python because `scontrol show hostnames` is often missing inside containers.
    """
    hosts: list[str] = []
    for group in _split_top_level(nodelist):
        hosts.extend(_expand_group(group))
    return hosts


def _split_top_level(text: str) -> list[str]:
    """Split on commas that are not inside brackets."""
    parts, depth, current = [], 0, []
    for char in text:
        depth += (char == "[") - (char == "]")
        if depth < 0:
            raise ValueError(f"unbalanced ']' in node list {text!r}")
        if char == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    if depth:
        raise ValueError(f"unbalanced '[' in node list {text!r}")
    parts.append("".join(current))
    return [p.strip() for p in parts if p.strip()]


def _expand_group(group: str) -> list[str]:
    match = re.fullmatch(r"([^\[\]]*)\[([^\]]*)\](.*)", group)
    if match is None:
        if "[" in group or "]" in group:
            raise ValueError(f"cannot parse node list group {group!r}")
        return [group]
    prefix, ranges, rest = match.groups()
    tails = _expand_group(rest) if rest else [""]
    hosts = []
    for item in ranges.split(","):
        low, _, high = item.strip().partition("-")
        if not low.isdigit() or (high and not high.isdigit()):
            raise ValueError(f"bad range {item!r} in node list group {group!r}")
        width = len(low)  # zero padding is kept: nid[001-003] -> nid001, nid002, nid003
        for number in range(int(low), int(high or low) + 1):
            hosts.extend(f"{prefix}{str(number).zfill(width)}{tail}" for tail in tails)
    return hosts


def tasks_on_node(tasks_per_node: str, node_id: int) -> int:
    """Number of tasks on node `node_id` from a Slurm spec such as `4(x2),3`."""
    counts: list[int] = []
    for item in tasks_per_node.split(","):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", item.strip())
        if match is None:
            raise ValueError(f"cannot parse tasks per node {tasks_per_node!r}")
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts[min(node_id, len(counts) - 1)]


def port_from_job_id(job_id: str) -> int:
    """A port every task of a job derives alike; differs between jobs sharing a node.

    Kept in 15000-29999, below Linux's ephemeral range (32768+), so it does not collide with
    outgoing connections.
    """
    return 15000 + int(job_id) % 15000


# --------------------------------------------------------------------------- environment


def env_int(env: Mapping[str, str], name: str, default: int | None = None) -> int:
    """A launcher's variable as a whole number, or one line naming it (RANK=abc, a Unicode
    digit, a negative number); `default` when it is not set."""
    value = env.get(name)
    if value is None:
        if default is None:
            raise LaunchError(f"{name} is not set (the launcher sets it: srun or torchrun)")
        return default
    if not re.fullmatch(r"[0-9]{1,9}", value.strip()):
        raise LaunchError(f"{name}={value[:40]!r} is not a whole number (set by srun or torchrun)")
    return int(value)


def resolve_env(environ: Mapping[str, str] | None = None) -> DistEnv:
    env = os.environ if environ is None else environ
    if "RANK" in env and "WORLD_SIZE" in env:
        rank, world = env_int(env, "RANK"), env_int(env, "WORLD_SIZE")
        local_rank = env_int(env, "LOCAL_RANK", env_int(env, "SLURM_LOCALID", 0))
        local_world = env_int(env, "LOCAL_WORLD_SIZE", world)
        launcher = "env"
    elif env_int(env, "SLURM_STEP_NUM_TASKS", env_int(env, "SLURM_NTASKS", 1)) > 1:
        world = env_int(env, "SLURM_STEP_NUM_TASKS", env_int(env, "SLURM_NTASKS", 1))
        # srun sets the step variables; a plain `python` in an sbatch with --ntasks=8 sees
        # SLURM_NTASKS=8 but is one process, and would wait forever for 7 missing peers.
        if "SLURM_STEP_ID" not in env and "SLURM_STEPID" not in env:
            raise LaunchError(
                f"SLURM_NTASKS={world} but this process is not part of an srun step "
                "(SLURM_STEP_ID is not set), so the other ranks will never start. Launch it "
                f"with `srun python -m {__package__} ...` (one task per GPU), or run a single "
                "process with `srun --ntasks=1 ...`."
            )
        rank = env_int(env, "SLURM_PROCID")
        local_rank = env_int(env, "SLURM_LOCALID", 0)
        per_node = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE")
        node_id = env_int(env, "SLURM_NODEID", 0)
        local_world = tasks_on_node(per_node, node_id) if per_node else world
        launcher = "srun"
    else:
        return DistEnv(0, 1, 0, 1, "127.0.0.1", DEFAULT_PORT, "single")

    if not 0 <= rank < world or not 0 <= local_rank < max(local_world, 1):
        raise LaunchError(f"inconsistent ranks: rank={rank} world={world} local={local_rank}")
    nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST")
    addr = env.get("MASTER_ADDR") or (expand_nodelist(nodelist)[0] if nodelist else "127.0.0.1")
    if env.get("MASTER_PORT"):
        port = env_int(env, "MASTER_PORT")
    elif env.get("SLURM_JOB_ID"):
        port = port_from_job_id(env["SLURM_JOB_ID"])
    else:
        port = DEFAULT_PORT
    return DistEnv(rank, world, local_rank, local_world, addr, port, launcher)


def choose_device(
    requested: str,
    local_rank: int,
    local_world: int,
    cuda_devices: int,
    rank: int = 0,
    visible: str | None = None,
) -> torch.device:
    """The device of this rank: `requested` is the `device` config key (auto, cpu, cuda).

    With as many visible GPUs as ranks on the node (all 4 GPUs visible to every task, which
    NCCL needs for NVLink), rank i takes GPU i. With exactly one visible GPU and a
    CUDA_VISIBLE_DEVICES that Slurm set per task (`--gpus-per-task=1`), it is index 0. Anything
    else would put two ranks on one GPU (NCCL fails with "invalid usage" much later), so it is
    an error here, before NCCL is touched.
    """
    if requested == "cpu" or (requested == "auto" and cuda_devices == 0):
        return torch.device("cpu")
    shown = "<unset>" if visible is None else repr(visible)
    if cuda_devices == 0:
        raise LaunchError(
            f"rank {rank}: device=cuda but no GPU is visible (CUDA_VISIBLE_DEVICES={shown}). "
            "Request GPUs from Slurm (--gpus-per-node=4), or train with device=cpu."
        )
    if cuda_devices >= local_world:
        return torch.device("cuda", local_rank)
    if cuda_devices == 1 and visible and "," not in visible:
        return torch.device("cuda", 0)
    raise LaunchError(
        f"rank {rank} is local rank {local_rank} of {local_world} on this node, but only "
        f"{cuda_devices} GPU(s) are visible (CUDA_VISIBLE_DEVICES={shown}): two ranks would share "
        f"a GPU. Start at most {cuda_devices} rank(s) per node (--ntasks-per-node or "
        "torchrun --nproc-per-node), give every task its own GPU (--gpus-per-task=1), or "
        "train with device=cpu."
    )


def cpu_threads(
    requested: int,
    env: DistEnv,
    environ: Mapping[str, str] | None = None,
    bound_cpus: int | None = None,
) -> int:
    """Intra-op threads per rank (`cpu_threads`, 0: derived here). torch's default of one thread
    per core oversubscribes the node when several ranks share it. srun does not set
    OMP_NUM_THREADS; torchrun sets it to 1 for every worker, which would leave each rank one
    core of a 288-core node, so under torchrun (TORCHELASTIC_RUN_ID) the CPUs the task is bound
    to (`bound_cpus`, default: this process's affinity, which torchrun's workers inherit from
    the task) are divided by the local ranks."""
    environ = os.environ if environ is None else environ
    if bound_cpus is None:
        bound_cpus = len(os.sched_getaffinity(0))
    if requested > 0:
        return requested
    if environ.get("TORCHELASTIC_RUN_ID"):
        return max(1, bound_cpus // env.local_world_size)
    if environ.get("OMP_NUM_THREADS"):
        return int(environ["OMP_NUM_THREADS"])
    if environ.get("SLURM_CPUS_PER_TASK"):
        return int(environ["SLURM_CPUS_PER_TASK"])
    return max(1, bound_cpus // env.local_world_size)


# --------------------------------------------------------------------------- logging


def configure_logging(rank: int, level: int = logging.INFO) -> None:
    """Every rank logs with a rank prefix; `set_quiet_ranks` later silences INFO off rank 0."""
    handler = logging.StreamHandler()
    handler.setFormatter(
        logging.Formatter(f"[rank{rank}] %(asctime)s %(levelname)s %(message)s", "%H:%M:%S")
    )
    pkg_log = logging.getLogger(__package__)
    pkg_log.handlers[:] = [handler]
    pkg_log.setLevel(level)
    pkg_log.propagate = False


def set_quiet_ranks(rank: int) -> None:
    """After the start-up line only rank 0 logs INFO (LOG_ALL_RANKS=1 keeps every rank's)."""
    if rank != 0 and os.environ.get("LOG_ALL_RANKS") != "1":
        logging.getLogger(__package__).setLevel(logging.WARNING)


# --------------------------------------------------------------------------- process group


@contextmanager
def process_group(
    timeout_s: float, threads: int = 0, device: str = "auto"
) -> Iterator[tuple[DistEnv, torch.device]]:
    """Resolve the environment, bind the device, create the process group, always destroy it.

    `device`: auto (CUDA when a GPU is visible, else CPU), cpu or cuda. The backend follows the
    device: NCCL on GPUs, gloo on CPU.
    """
    env = resolve_env()
    configure_logging(env.rank)
    cuda_count = torch.cuda.device_count() if device != "cpu" else 0
    device = choose_device(
        device,
        env.local_rank,
        env.local_world_size,
        cuda_count,
        env.rank,
        os.environ.get("CUDA_VISIBLE_DEVICES"),
    )
    if device.type == "cuda":
        torch.cuda.set_device(device)  # before the process group and before any CUDA work
    torch.set_num_threads(cpu_threads(threads, env))
    log.info(
        "host=%s rank=%d local_rank=%d world=%d device=%s CUDA_VISIBLE_DEVICES=%s launcher=%s",
        socket.gethostname(),
        env.rank,
        env.local_rank,
        env.world_size,
        device,
        os.environ.get("CUDA_VISIBLE_DEVICES", "<unset>"),
        env.launcher,
    )
    set_quiet_ranks(env.rank)
    finished = False
    try:
        if env.world_size > 1:
            log.info("init_process_group via tcp://%s:%d", env.master_addr, env.master_port)
            wait_for_master(env, timeout_s)
            try:
                dist.init_process_group(
                    backend="nccl" if device.type == "cuda" else "gloo",
                    init_method=f"tcp://{env.master_addr}:{env.master_port}",
                    rank=env.rank,
                    world_size=env.world_size,
                    timeout=timedelta(seconds=timeout_s),
                    # eager NCCL communicator on the right GPU; barrier() then knows the device
                    device_id=device if device.type == "cuda" else None,
                )
            except dist.DistStoreError as err:  # rank 0 waited for ranks that never came
                raise LaunchError(
                    f"not every rank joined within dist_timeout_s={timeout_s:g} s at "
                    f"{env.master_addr}:{env.master_port} ({first_line(err)}): the others did "
                    "not start, or started with another MASTER_ADDR/MASTER_PORT or WORLD_SIZE"
                ) from None
        yield env, device
        finished = True
    finally:
        if dist.is_initialized():
            if not finished:
                end_within(timeout_s)
            # DDP sits in a reference cycle and holds the process group: collect it now, so the
            # group is torn down here and not at interpreter exit, when peers may be gone.
            gc.collect()
            if finished:
                dist.barrier()  # no rank tears down while another still communicates
            dist.destroy_process_group()


def end_within(timeout_s: float) -> None:
    """A rank leaving on an error must end: its peers may be gone or stuck, and what follows
    (tearing down the group, the interpreter's exit: threads, exit handlers) must not hold the
    nodes until the job's time limit. Past `timeout_s` from here, every thread's stack goes to
    stderr (faulthandler's "Timeout" dump: where it hung) and the process exits with status 1.
    Armed until the process ends, which is what a failing rank does next."""
    faulthandler.dump_traceback_later(timeout_s, exit=True)


def wait_for_master(env: DistEnv, timeout_s: float) -> None:
    """Ranks other than 0 first wait until rank 0's rendezvous port accepts a connection, for at
    most `timeout_s`: an unreachable MASTER_ADDR is then one line naming it, instead of torch's
    store client retrying with a page of C++ frames for longer than the timeout."""
    if env.rank == 0:
        return  # rank 0 opens the port
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            socket.create_connection((env.master_addr, env.master_port), timeout=2).close()
            return
        except OSError as err:
            if time.monotonic() >= deadline:
                raise LaunchError(
                    f"rank {env.rank} could not reach the rendezvous at MASTER_ADDR="
                    f"{env.master_addr} MASTER_PORT={env.master_port} within {timeout_s:g} s "
                    f"({err.strerror or err}): is rank 0 running, and is that its address?"
                ) from None
            time.sleep(min(0.5, max(deadline - time.monotonic(), 0)))


# --------------------------------------------------------------------------- collectives
# These helpers are no-ops in a single process, so the training loop has one code path.


def is_peer_lost(err: BaseException) -> bool:
    """Another rank's process ended mid-collective (kill -9, out of memory, a crash): gloo reads
    "Connection reset by peer" or "Connection closed by peer"."""
    text = str(err)
    return "Connection reset by peer" in text or "Connection closed by peer" in text


def is_collective_timeout(err: BaseException) -> bool:
    """A peer that never answered within dist_timeout_s: gloo raises "Timed out waiting
    ...ms for recv/send"; NCCL's watchdog reports "Watchdog caught collective operation timeout"
    (the job script has it abort the process instead of raising here)."""
    text = str(err)
    return "Timed out waiting" in text or "collective operation timeout" in text


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def all_reduce(tensor: torch.Tensor, op: dist.ReduceOp = dist.ReduceOp.SUM) -> torch.Tensor:
    if dist.is_initialized():
        dist.all_reduce(tensor, op=op)
    return tensor


def all_gather_object(obj: object) -> list:
    if not dist.is_initialized():
        return [obj]
    out: list = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def broadcast_object(obj: object) -> object:
    """Rank 0's `obj` on every rank."""
    if not dist.is_initialized():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]
