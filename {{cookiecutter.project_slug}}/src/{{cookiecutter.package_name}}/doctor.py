"""Preflight checks for a job: `python -m <package> doctor [--quick]`, run on every rank.

Each check gives OK, WARN (works, but slower than it should) or FAIL (will not work, or silently
takes the wrong hardware path) in one line that says how to fix it. An all-reduce across all
ranks then measures the bus bandwidth and compares it with what Alps should deliver.

Only rank 0 prints: every rank's results are gathered first, and a problem seen on several ranks
is one line naming them. Exit status 0 when nothing FAILed, 1 otherwise, the same on every rank.

The checks are plain functions of their inputs (environment, paths, counts), so the tests plant
faults without a cluster; `local_checks()` feeds them this process's real values.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from . import distributed, doctor_nodes
from .distributed import DistEnv, LaunchError

PROG = f"python -m {__package__} doctor"
OK, WARN, FAIL = "OK", "WARN", "FAIL"
MIB = 2**20
FULL_SIZES = tuple(s * MIB for s in (1, 4, 16, 64, 256, 1024))
QUICK_SIZES = tuple(s * MIB for s in (1, 8, 64))
MIN_TORCH = (2, 4)  # pyproject.toml: torch>=2.4
MIN_FREE_GIB = 20.0  # room for a few checkpoints
MIN_CORES_PER_GPU_RANK = (
    16  # srun without -c gives a rank 8 of its Grace's 72 cores (alps-facts 7b)
)
MAX_CLOCK_SKEW_S = 1.0
WARN_FRACTION = 0.5  # warn below half the expected bus bandwidth
AWS_LIBFABRIC = "AWS Libfabric"

# Expected all-reduce bus bandwidth on Alps GH200 nodes, GB/s (busbw as nccl-tests defines it).
# The figures are the floors CSCS's own node-vetting tool passes at, for an 8 GB all-reduce
# (eth-cscs/vetnode, examples/alps-ml-vetting/config.yaml: intranode 250 GB/s, internode 15 GB/s
# with one rank per node, full topology 50 GB/s). The hardware peaks they sit under:
# - inside a node the 4 GPUs talk over NVLink 4, at most 450 GB/s per direction per GPU
#   (NVIDIA's H100 figure of 900 GB/s bidirectional);
# - between nodes each node has 4 Slingshot-11 NICs of 200 Gb/s (alps-facts 7a), so 100 GB/s
#   per node and direction with 4 ranks per node, 25 GB/s for a rank alone on its node.
# Our messages are smaller (1 GiB, or 64 MiB with --quick), hence the warning only below half.
EXPECTED_BUSBW = {
    "nvlink": (250.0, "one node, NVLink"),
    "slingshot-4": (50.0, "several nodes, 4 ranks per node, Slingshot"),
    "slingshot-1": (15.0, "several nodes, Slingshot, fewer than 4 ranks per node"),
}

# Libfabric/NCCL settings CSCS documents for NCCL on Slingshot: the docs' snippet for uenv jobs
# (alps-facts 1a), also set by the pytorch uenv views (1b), the CE aws_ofi_nccl hook (1c), and
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
    reuse that build (with the NCCL that CSCS tested), not install its own (alps-facts 6)."""
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
        return Result(
            FAIL,
            "cpu",
            f"{found}, {tasks_on_node} unbound tasks on {node_cores} cores: oversubscribed; set "
            f"OMP_NUM_THREADS<={max(1, node_cores // tasks_on_node)} or bind tasks "
            "(srun --cpus-per-task)",
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
    the plugin and makes a missing one an error at start (alps-facts 1a). A wrong NCCL_NET is
    reported on every run; the plugin is required on Alps GPU runs (`alps_gpu_run`)."""
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
                f'NCCL_NET="{AWS_LIBFABRIC}" (alps-facts 1a)',
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
            "job script; container: enable the aws_ofi_nccl hook (alps-facts 1)",
        )
    return Result(OK, "fabric_env", "CSCS's NCCL/libfabric settings are present")


def nearest_existing(path: Path) -> Path:
    path = Path(os.path.abspath(path))
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def write_probe(directory: Path) -> None:
    """Create, write, fsync and remove a small file: what a checkpoint write needs."""
    probe = directory / f".doctor-probe-{socket.gethostname()}-{os.getpid()}"
    fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, b"doctor\n")
        os.fsync(fd)
    finally:
        os.close(fd)
        probe.unlink()


def lustre_stripe_count(path: Path) -> int | None:
    """Largest stripe count of the directory's default layout (-1: all OSTs); None off Lustre or
    without `lfs`. A progressive layout prints one count per component."""
    if shutil.which("lfs") is None:
        return None
    try:
        out = subprocess.run(
            ["lfs", "getstripe", "-d", "-c", str(path)],
            capture_output=True,
            text=True,
            timeout=20,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    counts = [int(n) for n in re.findall(r"-?\d+", out.stdout)]
    if out.returncode != 0 or not counts:
        return None
    return -1 if -1 in counts else max(counts)


def check_directory(
    role: str,
    path: Path,
    min_free_gib: float = MIN_FREE_GIB,
    stripe_count: Callable[[Path], int | None] = lustre_stripe_count,
) -> Result:
    """`path` exists and is writable, or its nearest existing parent is (it will be created
    there); enough free space; on Lustre, striped as CSCS recommends (alps-facts 5a)."""
    existing = nearest_existing(path)
    if not existing.is_dir():
        return Result(
            FAIL, role, f"{role} {path}: {existing} is not a directory; choose another {role}"
        )
    try:
        write_probe(existing)
    except OSError as err:
        return Result(
            FAIL,
            role,
            f"{role} {path} is not writable ({err.strerror or err}): choose another {role} "
            "(e.g. under $SCRATCH) or fix its permissions",
        )
    where = str(path) if existing == Path(os.path.abspath(path)) else f"{path} (in {existing})"
    free_gib = shutil.disk_usage(existing).free / 2**30
    if free_gib < min_free_gib:
        return Result(
            WARN, role, f"{role} {where}: only {free_gib:.1f} GiB free; free space or move it"
        )
    stripes = stripe_count(existing)
    if stripes is not None and 0 <= stripes <= 1:
        return Result(
            WARN,
            role,
            f"{role} {where} is on Lustre but not striped (stripe count {stripes}): before "
            f"writing, lfs setstripe -E 4M -c 1 -E 64M -c 4 -E -1 -c 32 -S 4M {existing} "
            "(alps-facts 5a)",
        )
    striped = "" if stripes is None else f", Lustre stripe count {stripes}"
    return Result(OK, role, f"{role} {where}: writable, {free_gib:.0f} GiB free{striped}")


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


# --------------------------------------------------------------------------- formatting


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
        match = re.fullmatch(r"\s*(\d+)\s*([KMG]?)i?B?\s*", item, re.I)
        if match is None or int(match.group(1)) == 0:
            raise argparse.ArgumentTypeError(
                f"bad size {item.strip()!r} in --sizes: use e.g. 1M,64M,1G"
            )
        sizes.append(int(match.group(1)) * 1024 ** " KMG".index(match.group(2).upper() or " "))
    return tuple(sizes)


def format_ranks(ranks: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2,5'."""
    runs: list[list[int]] = []
    for rank in sorted(set(ranks)):
        if runs and rank == runs[-1][1] + 1:
            runs[-1][1] = rank
        else:
            runs.append([rank, rank])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def format_line(result: Result, where: str = "") -> str:
    return f"{result.status:<5} {result.check:<13}{result.message}{where}"


def report_lines(per_rank: Mapping[int, tuple[str, list[Result]]], max_variants: int = 3) -> list:
    """One line per distinct (status, check, message), naming the ranks/hosts where it is not
    all of them; at most `max_variants` lines per check, worst first."""
    world = len(per_rank)
    seen: dict[Result, list[int]] = {}
    for rank, (_, results) in sorted(per_rank.items()):
        for result in results:
            seen.setdefault(result, []).append(rank)
    severity = {FAIL: 0, WARN: 1, OK: 2}
    checks = list(dict.fromkeys(r.check for r in seen))
    lines = []
    for check in checks:
        variants = sorted((r for r in seen if r.check == check), key=lambda r: severity[r.status])
        for result in variants[:max_variants]:
            ranks = seen[result]
            where = ""
            if world > 1 and (len(ranks) < world or result.status != OK):
                hosts = list(dict.fromkeys(per_rank[r][0] for r in ranks))
                shown = ",".join(hosts[:3]) + (f",+{len(hosts) - 3}" if len(hosts) > 3 else "")
                if len(ranks) == world:
                    who = f"all {world} ranks"
                else:
                    who = f"rank{'s' if len(ranks) > 1 else ''} {format_ranks(ranks)}"
                where = f" [{who} on {shown}]"
            lines.append(format_line(result, where))
        if len(variants) > max_variants:
            lines.append(f"{'...':<5} {check:<13}{len(variants) - max_variants} more variant(s)")
    return lines


# --------------------------------------------------------------------------- this process


def torch_versions() -> tuple[str, str | None, str | None]:
    nccl = None
    if torch.cuda.is_available():
        try:
            version = torch.cuda.nccl.version()
            nccl = ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
        except (AttributeError, RuntimeError):
            nccl = None
    return torch.__version__, torch.version.cuda, nccl


def wants_gpu(device: str) -> bool:
    """--device cuda, or auto on a machine with NVIDIA device files (even if torch sees none)."""
    if device == "cpu":
        return False
    return (
        device == "cuda"
        or torch.cuda.is_available()
        or bool(list(Path("/dev").glob("nvidia[0-9]*")))
    )


def ldconfig_cache() -> str:
    for ldconfig in ("ldconfig", "/sbin/ldconfig", "/usr/sbin/ldconfig"):
        try:
            return subprocess.run(
                [ldconfig, "-p"], capture_output=True, text=True, timeout=20
            ).stdout
        except (OSError, subprocess.TimeoutExpired):
            continue
    return ""


def local_checks(
    env: DistEnv, want_gpu: bool, run_dir: Path | None, data_dir: Path | None
) -> list[Result]:
    host = socket.gethostname()
    on_alps = is_alps_node(host, Path("/etc/xthostname").exists(), Path("/sys/class/cxi").exists())
    bound = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    checks: list[Callable[[], Result]] = [
        lambda: check_torch_build(*torch_versions(), want_gpu),
        lambda: check_torch_origin(
            torch.__file__,
            sys.prefix,
            sys.base_prefix,
            venv_has_system_site_packages(sys.prefix),
            on_alps,
        ),
        lambda: check_gpus(
            want_gpu,
            torch.cuda.device_count(),
            env.local_world_size,
            os.environ.get("CUDA_VISIBLE_DEVICES"),
        ),
        lambda: check_cpu(
            bound,
            distributed.cpu_threads(0, env),
            env.local_world_size,
            os.cpu_count() or bound,
            want_gpu,
        ),
        lambda: check_nccl_network(
            os.environ,
            on_alps and want_gpu,
            find_net_plugins(os.environ.get("LD_LIBRARY_PATH", ""), ldconfig_cache()),
        ),
        lambda: check_fabric_env(os.environ, on_alps and want_gpu),
    ]
    for role, path in (("run_dir", run_dir), ("data_dir", data_dir)):
        if path is not None:
            checks.append(lambda role=role, path=path: check_directory(role, path))
    results = []
    for check in checks:
        try:
            results.append(check())
        except Exception as err:  # a broken check is reported, never a traceback
            results.append(Result(FAIL, "doctor", f"a check crashed: {type(err).__name__}: {err}"))
    return results


@contextmanager
def cpu_process_group(env: DistEnv, timeout_s: float) -> Iterator[None]:
    """A gloo group for gathering the results, on GPUs too: it works when NCCL does not, so the
    report still reaches rank 0. The all-reduce test on GPUs adds an NCCL group on top."""
    if env.world_size == 1:
        yield
        return
    dist.init_process_group(
        backend="gloo",
        init_method=f"tcp://{env.master_addr}:{env.master_port}",
        rank=env.rank,
        world_size=env.world_size,
        timeout=timedelta(seconds=timeout_s),
    )
    try:
        yield
    finally:
        dist.destroy_process_group()


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


# --------------------------------------------------------------------------- command line


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Check the job's environment on every rank, then measure all-reduce "
        "bandwidth. Run it like training: srun (one task per GPU), torchrun or one process.",
    )
    parser.add_argument(
        "--quick", action="store_true", help="small bandwidth test (1-64 MiB), for job start"
    )
    parser.add_argument(
        "--sizes", type=parse_sizes, help="all-reduce sizes, e.g. 1M,64M,1G (default 1M..1G)"
    )
    parser.add_argument("--run-dir", type=Path, help="run directory to check (writable, striped)")
    parser.add_argument("--data-dir", type=Path, help="data directory to check")
    parser.add_argument(
        "--device",
        choices=("auto", "cpu", "cuda"),
        default="auto",
        help="auto: the GPUs when the node has any (default)",
    )
    parser.add_argument(
        "--expect-busbw",
        type=float,
        metavar="GBPS",
        help="expected all-reduce bus bandwidth in GB/s (default: Alps figures on GPUs)",
    )
    parser.add_argument(
        "--timeout-s", type=float, default=120.0, help="give up on a peer after this long"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = make_parser().parse_args(sys.argv[1:] if argv is None else argv)
    try:
        env = distributed.resolve_env()
    except (LaunchError, ValueError) as err:
        print(f"{PROG}: launch error: {err}", file=sys.stderr)
        return 1
    want_gpu = wants_gpu(args.device)
    use_cuda = want_gpu and torch.cuda.is_available()
    device = torch.device("cpu")
    if use_cuda:
        count = torch.cuda.device_count()
        try:
            device = distributed.choose_device(
                "cuda",
                env.local_rank,
                env.local_world_size,
                count,
                env.rank,
                os.environ.get("CUDA_VISIBLE_DEVICES"),
            )
        except LaunchError:  # ranks would share a GPU: check_gpu_sharing reports it below
            device = torch.device("cuda", env.local_rank % count)
        torch.cuda.set_device(device)
    torch.set_num_threads(distributed.cpu_threads(0, env))
    host = socket.gethostname()
    results = local_checks(env, want_gpu, args.run_dir, args.data_dir)
    uuid = None  # identifies the GPU, to find ranks that share one
    if use_cuda:
        props = torch.cuda.get_device_properties(device)
        uuid = str(props.uuid) if hasattr(props, "uuid") else None
    try:
        with cpu_process_group(env, args.timeout_s):
            return report(args, env, device, host, results, uuid)
    except (RuntimeError, OSError) as err:  # a peer never came, or a collective failed
        print(f"{PROG}: rank {env.rank} on {host}: {err}", file=sys.stderr)
        for result in results:
            if result.status != OK:
                print(format_line(result), file=sys.stderr)
        return 1


def report(args, env: DistEnv, device, host: str, results: list[Result], uuid) -> int:
    """Gather every rank's results, print them on rank 0, run the all-reduce test."""
    distributed.barrier()
    gathered = distributed.all_gather_object((host, results, time.time(), uuid))
    per_rank = {rank: (g[0], g[1]) for rank, g in enumerate(gathered)}
    hosts = [g[0] for g in gathered]
    cross = [check_clock_skew({g[0]: g[2] for g in gathered})]
    cross += filter(None, [check_gpu_sharing({r: (g[0], g[3]) for r, g in enumerate(gathered)})])
    between = expected_busbw(device.type, len(set(hosts)), 1)  # one rank per node: the network
    node_checks = doctor_nodes.between_nodes(env.rank, hosts, device, args.quick, between)
    cross += [Result(*check) for check in node_checks]
    if env.is_main:
        names = sorted(set(hosts))
        shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
        print(
            f"doctor: {env.world_size} rank(s) on {len(names)} node(s) ({shown}), "
            f"device {device.type}, launcher {env.launcher}",
            flush=True,
        )
        for line in [*report_lines(per_rank), *map(format_line, cross)]:
            print(line, flush=True)
    sizes = args.sizes or (QUICK_SIZES if args.quick else FULL_SIZES)
    try:
        rows, verdict = bandwidth_test(env, device, sizes, args.quick, hosts, args.expect_busbw)
    except RuntimeError as err:  # NCCL errors, out of memory
        rows, verdict = [], Result(FAIL, "allreduce", f"all-reduce failed: {err}".splitlines()[0])
    distinct = {r for _, rs in per_rank.values() for r in rs} | {*cross, verdict}
    statuses = [r.status for r in distinct]
    failed = bool(distributed.broadcast_object(FAIL in statuses))
    if env.is_main:
        if rows:
            print(
                f"all-reduce of float32 across {env.world_size} ranks "
                "(busbw = algbw * 2(n-1)/n, as nccl-tests):",
                flush=True,
            )
            for row in rows:
                print("  " + row, flush=True)
        print(format_line(verdict), flush=True)
        tail = "fix the FAIL lines above" if failed else "ready"
        print(
            f"doctor: {statuses.count(FAIL)} FAIL, {statuses.count(WARN)} WARN: {tail} "
            f"(exit {int(failed)})",
            flush=True,
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
