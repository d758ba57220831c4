"""Preflight checks for a job: `python -m <package> doctor [--quick]`, run on every rank.

Each check gives OK, WARN (works, but slower than it should) or FAIL (will not work, or silently
takes the wrong hardware path) in one line that says how to fix it. An all-reduce across all
ranks then measures the bus bandwidth and compares it with what Alps should deliver
(bandwidth.py), and between nodes (nodes.py).

Only rank 0 prints: every rank's results are gathered first, and a problem seen on several ranks
is one line naming them. Exit status 0 when nothing FAILed, 1 otherwise, the same on every rank;
2 for an option it does not take (a job's DOCTOR_ARGS), in one line, before any check.

The checks are plain functions of their inputs (environment, paths, counts), so the tests plant
faults without a cluster; `local_checks()` feeds them this process's real values.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from .. import distributed
from ..config_keys import first_line, number_option
from ..distributed import DistEnv, LaunchError, wait_for_master
from . import nodes as doctor_nodes
from .bandwidth import FULL_SIZES, QUICK_SIZES, bandwidth_test, expected_busbw, parse_sizes
from .checks import (
    FAIL,
    OK,
    WARN,
    Result,
    check_clock_skew,
    check_cpu,
    check_fabric_env,
    check_gpu_sharing,
    check_gpus,
    check_nccl_network,
    check_torch_build,
    check_torch_origin,
    find_net_plugins,
    format_ranks,
    is_alps_node,
    venv_has_system_site_packages,
)
from .storage import check_directory
from .vision import torchvision_here

PROG = f"python -m {__name__.split('.')[0]} doctor"


# --------------------------------------------------------------------------- formatting


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
        torchvision_here,
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
    wait_for_master(env, timeout_s)
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


# --------------------------------------------------------------------------- command line


USAGE_EXIT_CODE = 2  # told apart from a FAIL's 1 by the job scripts (DOCTOR_ARGS)


class OneLineParser(argparse.ArgumentParser):
    """A usage error in one line (each rank of a job writes it), not argparse's usage block."""

    def error(self, message: str):
        self.exit(USAGE_EXIT_CODE, f"{self.prog}: error: {message} (see --help)\n")


def make_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
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
    # Written run_dir=DIR data_dir=DIR on the command line, like every command (commands.py).
    parser.add_argument("--run-dir", type=Path, help="run_dir=DIR: run directory to check")
    parser.add_argument("--data-dir", type=Path, help="data_dir=DIR: data directory to check")
    parser.add_argument(
        "--device",
        choices=("auto", "cpu", "cuda"),
        default="auto",
        help="auto: the GPUs when the node has any (default)",
    )
    parser.add_argument(
        "--expect-busbw",
        type=number_option,
        metavar="GBPS",
        help="expected all-reduce bus bandwidth in GB/s (default: Alps figures on GPUs)",
    )
    parser.add_argument(
        "--timeout-s", type=number_option, default=120.0, help="give up on a peer after this long"
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
        lines = [f"{PROG}: rank {env.rank} on {host}: {err}"]
        lines += [format_line(result) for result in results if result.status != OK]
        # one write: ranks that share a log (torchrun's workers) do not cut into each other's
        sys.stderr.write("".join(f"{line}\n" for line in lines))
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
        rows, verdict = [], Result(FAIL, "allreduce", f"all-reduce failed: {first_line(err)}")
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
