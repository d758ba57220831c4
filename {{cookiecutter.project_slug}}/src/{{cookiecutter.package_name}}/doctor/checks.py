"""The doctor's checks as plain functions of their inputs (environment, paths, counts), so the
tests plant faults without a cluster; doctor.py's `local_checks()` feeds them this process's real
values, and its report gathers the results of every rank.

Each check gives OK, WARN (works, but slower than it should) or FAIL (will not work, or silently
takes the wrong hardware path) in one line that says how to fix it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

OK, WARN, FAIL = "OK", "WARN", "FAIL"
MIB = 2**20
MIN_TORCH = (2, 4)  # pyproject.toml: torch>=2.4
MIN_FREE_GIB = 20.0  # room for a few checkpoints
MIN_CORES_PER_GPU_RANK = 16  # srun without -c gives a rank 8 of its Grace's 72 cores (https://docs.cscs.ch/running/slurm/)
MAX_CLOCK_SKEW_S = 1.0  # log timestamps of different nodes stop lining up
WARN_FRACTION = 0.5  # warn below half the expected bus bandwidth
AWS_LIBFABRIC = "AWS Libfabric"

# Expected all-reduce bus bandwidth on Alps GH200 nodes, GB/s (busbw as nccl-tests defines it).
# The figures are the floors CSCS's own node-vetting tool passes at, for an 8 GB all-reduce
# (eth-cscs/vetnode, examples/alps-ml-vetting/config.yaml: intranode 250 GB/s, internode 15 GB/s
# with one rank per node, full topology 50 GB/s). The hardware peaks they sit under:
# - inside a node the 4 GPUs talk over NVLink 4, at most 450 GB/s per direction per GPU
#   (NVIDIA's H100 figure of 900 GB/s bidirectional);
# - between nodes each node has 4 Slingshot-11 NICs of 200 Gb/s
#   (https://docs.cscs.ch/alps/hardware/), so 100 GB/s per node and direction with 4 ranks per
#   node, 25 GB/s for a rank alone on its node.
# Our messages are smaller (1 GiB, or 64 MiB with --quick), hence the warning only below half.
EXPECTED_BUSBW = {
    "nvlink": (250.0, "one node, NVLink"),
    "slingshot-4": (50.0, "several nodes, 4 ranks per node, Slingshot"),
    "slingshot-1": (15.0, "several nodes, Slingshot, fewer than 4 ranks per node"),
}

# Libfabric/NCCL settings CSCS documents for NCCL on Slingshot: the docs' snippet for uenv jobs
# (https://docs.cscs.ch/software/communication/nccl/), also set by the pytorch uenv views, the
# CE aws_ofi_nccl hook (https://docs.cscs.ch/software/container-engine/resource-hook/), and
# required by CSCS's vetnode environment check. Values differ between those sources, so only
# their presence is checked, plus NCCL_PROTO, which must keep LL128 off.
FABRIC_VARIABLES = (
    "NCCL_NET_GDR_LEVEL",
    "NCCL_PROTO",
    "FI_CXI_DEFAULT_CQ_SIZE",
    "FI_CXI_DEFAULT_TX_SIZE",
    "FI_CXI_DISABLE_HOST_REGISTER",
    "FI_MR_CACHE_MONITOR",
)


@dataclass(frozen=True)
class Result:
    status: str  # OK, WARN or FAIL
    check: str  # short name: "torch", "run_dir", ...
    message: str  # one line: what was found and, unless OK, the fix


# --------------------------------------------------------------------------- pure checks


def check_torch_build(version: str, cuda: str | None, nccl: str | None, want_gpu: bool) -> Result:
    found = f"torch {version}, CUDA {cuda or '-'}, NCCL {nccl or '-'}"
    numbers = re.match(r"(\d+)\.(\d+)", version)
    if numbers is None or tuple(map(int, numbers.groups())) < MIN_TORCH:
        need = ".".join(map(str, MIN_TORCH))
        return Result(FAIL, "torch", f"{found}: this project needs torch>={need}")
    if want_gpu and cuda is None:
        return Result(
            FAIL,
            "torch",
            f"{found}: a CPU-only build on a GPU node; use the torch of the image/uenv "
            "(pip uninstall torch in the venv), or run with --device cpu",
        )
    return Result(OK, "torch", found)


def venv_has_system_site_packages(prefix: str) -> bool:
    """`include-system-site-packages = true` in the venv's pyvenv.cfg."""
    try:
        text = (Path(prefix) / "pyvenv.cfg").read_text()
    except OSError:
        return False
    pattern = r"^include-system-site-packages\s*=\s*true\s*$"
    return re.search(pattern, text, re.MULTILINE | re.IGNORECASE) is not None


def check_torch_origin(
    torch_file: str, prefix: str, base_prefix: str, system_site: bool, on_alps: bool
) -> Result:
    """torch must come from the image/uenv: a venv made with --system-site-packages is meant to
    reuse that build (with the NCCL that CSCS tested), not install its own (https://docs.cscs.ch/software/ml/pytorch/)."""
    # abspath, not resolve(): a venv may link to files elsewhere, what counts is where Python
    # found torch
    where = os.path.dirname(os.path.abspath(torch_file))
    in_venv = os.path.abspath(prefix) != os.path.abspath(base_prefix)
    if in_venv and Path(where).is_relative_to(os.path.abspath(prefix)):
        if system_site:
            return Result(
                FAIL,
                "torch_origin",
                f"venv shadows the image's torch ({where}): pip uninstall torch in the venv, "
                "so that --system-site-packages provides the image's/uenv's build",
            )
        if on_alps:
            return Result(
                WARN,
                "torch_origin",
                f"torch from a venv without --system-site-packages ({where}): not the "
                "image's/uenv's build; recreate the venv with --system-site-packages",
            )
        return Result(OK, "torch_origin", f"torch from the venv ({where})")
    return Result(OK, "torch_origin", f"torch from the image/system ({where})")


def check_gpus(
    want_gpu: bool, visible: int, tasks_on_node: int, cuda_visible_devices: str | None
) -> Result:
    if not want_gpu:
        return Result(OK, "gpus", "CPU run: no GPU used")
    shown = "unset" if cuda_visible_devices is None else repr(cuda_visible_devices)
    if visible == 0:
        return Result(
            FAIL,
            "gpus",
            f"no GPU visible (CUDA_VISIBLE_DEVICES {shown}): request GPUs "
            "(#SBATCH --gpus-per-node=4) and keep NVIDIA_VISIBLE_DEVICES set in a container, "
            "or run with --device cpu",
        )
    if visible == tasks_on_node:
        return Result(OK, "gpus", f"{visible} GPU(s) for {tasks_on_node} task(s) on this node")
    if visible == 1:
        return Result(
            WARN,
            "gpus",
            f"each of the {tasks_on_node} tasks on this node sees 1 GPU (--gpus-per-task=1?): "
            "NCCL cannot see its peers and may lose NVLink (NVIDIA/nccl#1066); prefer "
            "--gpus-per-node=4 with all GPUs visible",
        )
    if visible < tasks_on_node:
        return Result(
            FAIL,
            "gpus",
            f"{tasks_on_node} tasks on this node share {visible} GPUs: run one task per GPU "
            f"(--ntasks-per-node={visible})",
        )
    return Result(
        WARN,
        "gpus",
        f"{visible} GPUs visible but {tasks_on_node} task(s) on this node: "
        f"{visible - tasks_on_node} GPU(s) idle; use --ntasks-per-node={visible}",
    )


def check_cpu(
    bound_cores: int, threads: int, tasks_on_node: int, node_cores: int, want_gpu: bool
) -> Result:
    """Threads per rank against the cores the rank may run on (os.sched_getaffinity)."""
    found = f"{bound_cores} core(s) bound, {threads} thread(s) per rank"
    if threads > bound_cores:
        return Result(
            FAIL,
            "cpu",
            f"{found}: oversubscribed; set OMP_NUM_THREADS<={bound_cores} or give each task "
            "more cores (srun --cpus-per-task)",
        )
    if bound_cores >= node_cores and threads * tasks_on_node > node_cores:
        per_task = node_cores // tasks_on_node
        if per_task == 0:  # fewer threads cannot help: more processes than cores
            advice = f"run at most {node_cores} processes per node (tasks or torchrun workers)"
        else:
            advice = f"set OMP_NUM_THREADS<={per_task} or bind tasks (srun --cpus-per-task)"
        return Result(
            FAIL,
            "cpu",
            f"{found}, {tasks_on_node} unbound tasks on {node_cores} cores: oversubscribed; "
            + advice,
        )
    if want_gpu and bound_cores < MIN_CORES_PER_GPU_RANK:
        return Result(
            WARN,
            "cpu",
            f"{found}: data loading and the host side of the step compete for few cores; on "
            "GH200 give each of the 4 tasks its Grace CPU: --cpus-per-task=72",
        )
    return Result(OK, "cpu", found)


def is_alps_node(hostname: str, xthostname_exists: bool, cxi_exists: bool) -> bool:
    """HPE Cray EX node: /etc/xthostname, Slingshot CXI devices, or a `nid001234` host name."""
    return xthostname_exists or cxi_exists or re.fullmatch(r"nid\d+", hostname) is not None


def find_net_plugins(ld_library_path: str, ldconfig_output: str) -> list[str]:
    """NCCL network plugins (`libnccl-net*.so`) on LD_LIBRARY_PATH or in the ldconfig cache."""
    found = []
    for directory in filter(None, ld_library_path.split(os.pathsep)):
        found += sorted(str(p) for p in Path(directory).glob("libnccl-net*.so*"))
    for line in ldconfig_output.splitlines():
        if "libnccl-net" in line and "=>" in line:
            found.append(line.split("=>")[-1].strip())
    return list(dict.fromkeys(found))


def check_nccl_network(
    environ: Mapping[str, str], alps_gpu_run: bool, plugins: list[str]
) -> Result:
    """On Alps NCCL must reach the Slingshot NICs through the aws-ofi-nccl plugin (libfabric).
    Without it NCCL falls back to TCP sockets silently, unless NCCL_NET="AWS Libfabric" forces
    the plugin and makes a missing one an error at start
    (https://docs.cscs.ch/software/communication/nccl/). A wrong NCCL_NET is reported on every
    run; the plugin is required on Alps GPU runs (`alps_gpu_run`)."""
    net = environ.get("NCCL_NET")
    if net is not None and net != AWS_LIBFABRIC and net.strip("'\"") == AWS_LIBFABRIC:
        return Result(
            FAIL,
            "nccl_net",
            f"NCCL_NET={net!r} carries extra quotes (the CE SSH hook does this): "
            f'export NCCL_NET="{AWS_LIBFABRIC}"',
        )
    if net is not None and net != AWS_LIBFABRIC and (alps_gpu_run or net.lower() == "socket"):
        path = "TCP sockets" if net.lower() == "socket" else "a transport other than Slingshot"
        return Result(
            FAIL,
            "nccl_net",
            f"NCCL_NET={net!r}: NCCL would use {path} between nodes; "
            f'export NCCL_NET="{AWS_LIBFABRIC}" (or unset it off Alps)',
        )
    named = environ.get("NCCL_NET_PLUGIN")
    if named:
        wanted = {f"libnccl-net-{named}.so", Path(named).name}
        if not any(Path(p).name.split(".so")[0] + ".so" in wanted for p in plugins):
            return Result(
                FAIL,
                "nccl_net",
                f"NCCL_NET_PLUGIN={named!r} names no library on LD_LIBRARY_PATH or in ldconfig "
                f"(looked for libnccl-net-{named}.so); unset NCCL_NET_PLUGIN and keep "
                f'NCCL_NET="{AWS_LIBFABRIC}" (https://docs.cscs.ch/software/communication/nccl/)',
            )
    if not alps_gpu_run:
        return Result(OK, "nccl_net", f"not an Alps GPU run: NCCL_NET={net or 'unset'}")
    how = (
        "uenv: --view=default (prgenv-gnu: module load aws-ofi-nccl); container: EDF "
        'annotation com.hooks.aws_ofi_nccl.enabled = "true"'
    )
    if not plugins and net is None:
        return Result(
            FAIL,
            "nccl_net",
            "aws-ofi-nccl plugin (libnccl-net*.so) not on LD_LIBRARY_PATH or in ldconfig and "
            f"NCCL_NET unset: NCCL would use TCP sockets; {how}",
        )
    if not plugins:
        return Result(
            WARN,
            "nccl_net",
            "aws-ofi-nccl plugin (libnccl-net*.so) not on LD_LIBRARY_PATH or in ldconfig; "
            f'NCCL_NET="{AWS_LIBFABRIC}" makes NCCL fail at start if it is really missing '
            f"(see the all-reduce below); {how}",
        )
    if net is None:
        return Result(
            WARN,
            "nccl_net",
            f"plugin {plugins[0]} found but NCCL_NET unset: if it fails to load NCCL silently "
            f'uses sockets; export NCCL_NET="{AWS_LIBFABRIC}" so that the job fails instead',
        )
    return Result(OK, "nccl_net", f'NCCL_NET="{AWS_LIBFABRIC}", plugin {plugins[0]}')


def check_fabric_env(environ: Mapping[str, str], alps_gpu_run: bool) -> Result:
    if not alps_gpu_run:
        return Result(OK, "fabric_env", "not an Alps GPU run: libfabric variables not checked")
    problems = [name for name in FABRIC_VARIABLES if name not in environ]
    proto = environ.get("NCCL_PROTO")
    if proto is not None and not re.search(r"\^.*LL128", proto):
        problems.append(f"NCCL_PROTO={proto!r} (LL128 is slower on Slingshot: ^LL128)")
    if environ.get("MPICH_GPU_SUPPORT_ENABLED") == "1":
        problems.append("MPICH_GPU_SUPPORT_ENABLED=1 (GPU-aware MPI with NCCL can deadlock: 0)")
    if problems:
        return Result(
            WARN,
            "fabric_env",
            f"unset or off: {', '.join(problems)}; uenv: export the CSCS NCCL settings in the "
            "job script; container: enable the aws_ofi_nccl hook (https://docs.cscs.ch/software/container-engine/resource-hook/)",
        )
    return Result(OK, "fabric_env", "CSCS's NCCL/libfabric settings are present")


def check_clock_skew(times: Mapping[str, float]) -> Result:
    """`times`: host -> time.time() read right after a barrier."""
    early = min(times, key=times.get)
    late = max(times, key=times.get)
    skew = times[late] - times[early]
    if skew > MAX_CLOCK_SKEW_S:
        return Result(
            WARN,
            "clock",
            f"clocks differ by {skew:.1f} s between {early} and {late}: timestamps of different "
            "nodes do not line up; report the node to CSCS",
        )
    return Result(OK, "clock", f"clock skew {skew * 1e3:.0f} ms across {len(times)} host(s)")


def check_gpu_sharing(gpus: Mapping[int, tuple[str, str | None]]) -> Result | None:
    """`gpus`: rank -> (host, UUID of the GPU it uses). FAIL when ranks share a GPU."""
    owners: dict[tuple[str, str], list[int]] = {}
    for rank, (host, uuid) in gpus.items():
        if uuid is not None:
            owners.setdefault((host, uuid), []).append(rank)
    shared = {key: ranks for key, ranks in owners.items() if len(ranks) > 1}
    if not owners:
        return None
    if shared:
        (host, _), ranks = next(iter(shared.items()))
        return Result(
            FAIL,
            "gpu_sharing",
            f"ranks {format_ranks(ranks)} on {host} use the same GPU: give each task its own GPU "
            "(--ntasks-per-node=4 with all 4 GPUs visible, or --gpus-per-task=1)",
        )
    return Result(OK, "gpu_sharing", "every rank has its own GPU")


def format_ranks(ranks: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2,5'."""
    runs: list[list[int]] = []
    for rank in sorted(set(ranks)):
        if runs and rank == runs[-1][1] + 1:
            runs[-1][1] = rank
        else:
            runs.append([rank, rank])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)
