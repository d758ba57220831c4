"""Helpers for the package's tests: launch ranks as subprocesses (gloo on CPU), read results."""

from __future__ import annotations

import io
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parent.parent
PACKAGE = "{{ cookiecutter.package_name }}"

# A tiny run on CPU (explicitly: the same tests run on GPU nodes) of the minimal classifier
# (models/mlp.py), the model every training workload keeps: 8 features, 4 classes, 16 wide, on
# synthetic arrays; dropout makes the result depend on the restored RNG states and
# grad_accum_steps=2 exercises gradient sync on the last micro-batch only. The language
# workload's tiny GPT is tests/_language.py's TINY_GPT.
TINY = [
    "device=cpu",
    "model=mlp",
    "dataset=synthetic",
    "synthetic_samples=1200",
    "eval_samples=200",
    "num_features=8",
    "num_classes=4",
    "hidden_dim=16",
    "batch_size=4",
    "dropout=0.1",
    "lr=0.01",
    "warmup_steps=5",
    "max_steps=80",
    "log_every=1",
    "eval_every=25",
    "eval_batches=2",
    "preempt_check_every=1",
    "checkpoint_every=10",
    "keep_checkpoints=3",
    "async_checkpoint=false",
    "num_workers=0",
    "cpu_threads=1",
    "dist_timeout_s=60",
    "grad_accum_steps=2",
]
TIMEOUT_S = 300  # generous: a loaded 2-core machine starts two torch ranks in ~30 s
# TINY on 4 ranks with HSDP: two shard groups of 2 ranks (hsdp_shard=2), each a replica; 30
# steps, so 3 checkpoints (test_resume.py compares it with FSDP and DDP, kills and resumes it)
HSDP_4 = ["parallelism=hsdp", "hsdp_shard=2", "max_steps=30"]


def free_port() -> int:
    """A free port for rank 0's store, below the ephemeral range (32768 and up): a port the
    kernel hands out (bind to 0) may be taken by any outgoing connection before rank 0 listens
    on it (EADDRINUSE, seen under load), and the job scripts' ports are 15000 to 29999."""
    pick = random.SystemRandom()
    for _ in range(200):
        port = pick.randrange(30000, 32768)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError("no free port between 30000 and 32767")


def clean_env() -> dict[str, str]:
    """No launcher or Slurm variables from the outside (e.g. when pytest itself runs in a job)."""
    drop = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("SLURM_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "src"), env.get("PYTHONPATH")]))
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONFAULTHANDLER"] = "1"  # a rank that hangs shows where (Ranks.wait)
    return env


def rank_env(rank: int, world: int, port: int) -> dict[str, str]:
    """The environment torchrun gives rank `rank` of `world` on this machine."""
    return clean_env() | {
        "RANK": str(rank),
        "WORLD_SIZE": str(world),
        "LOCAL_RANK": str(rank),
        "LOCAL_WORLD_SIZE": str(world),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
    }


class Ranks:
    """`world` processes of `python -m <package> ...`, output in `<log_dir>/rank<i>.log`."""

    def __init__(self, args: list[str], log_dir: Path, world: int = 2):
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        port = free_port()
        self.procs = []
        for rank in range(world):
            env = rank_env(rank, world, port)
            with open(self.log_dir / f"rank{rank}.log", "w") as out:
                self.procs.append(
                    subprocess.Popen(
                        [sys.executable, "-m", PACKAGE, *args],
                        cwd=REPO,
                        env=env,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                    )
                )

    def log(self, rank: int) -> str:
        return (self.log_dir / f"rank{rank}.log").read_text()

    def tails(self, chars: int = 3000) -> str:
        """Every rank's last `chars` of output: what a failed assertion on all ranks shows."""
        return "".join(f"\nrank {i}:\n{self.log(i)[-chars:]}" for i in range(len(self.procs)))

    def running(self) -> bool:
        return all(p.poll() is None for p in self.procs)

    def send(self, sig: int, ranks: list[int] | None = None) -> None:
        for i, proc in enumerate(self.procs):
            if ranks is None or i in ranks:
                proc.send_signal(sig)

    def wait(self, timeout: float = TIMEOUT_S) -> list[int]:
        deadline = time.monotonic() + timeout
        try:
            return [p.wait(max(0.1, deadline - time.monotonic())) for p in self.procs]
        except subprocess.TimeoutExpired:
            hung = [i for i, p in enumerate(self.procs) if p.poll() is None]
            self.send(signal.SIGABRT, hung)  # PYTHONFAULTHANDLER: each thread's stack, to its log
            time.sleep(2)
            self.send(signal.SIGKILL)
            stacks = "".join(f"\nrank {i}, still running:\n{self.log(i)[-4000:]}" for i in hung)
            pytest.fail(f"ranks did not finish in {timeout} s:\n{self.log(0)[-3000:]}{stacks}")

    def wait_for_step(self, run_dir: Path, step: int, timeout: float = TIMEOUT_S) -> int:
        """Poll metrics.jsonl until a training record reaches `step`; return the step seen."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            seen = last_logged_step(run_dir)
            if seen >= step:
                return seen
            if not self.running():
                pytest.fail(f"ranks exited before step {step}:\n{self.log(0)[-3000:]}")
            time.sleep(0.005)
        self.send(signal.SIGKILL)
        pytest.fail(f"step {step} not reached in {timeout} s")


def two_ranks(
    args_of_rank: list[list[str]], program: tuple[str, ...] = ("-m", PACKAGE)
) -> list[tuple[subprocess.Popen, str, str]]:
    """Run the package (or `python -c CODE`: program=("-c", CODE)) as ranks 0 and 1 (gloo),
    each with its own arguments, to the end: (process, stdout, stderr) of each."""
    port = free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, *program, *args],
            cwd=REPO,
            env=rank_env(rank, 2, port),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank, args in enumerate(args_of_rank)
    ]
    return [(p, *p.communicate(timeout=TIMEOUT_S)) for p in procs]


def train_ranks(run_dir: Path, log_dir: Path, extra: list[str] = (), world: int = 2) -> Ranks:
    return Ranks([*TINY, f"run_dir={run_dir}", *extra], log_dir, world)


def one_line(capsys) -> str:
    """The one line a command wrote to stderr, with no traceback."""
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


def last_logged_step(run_dir: Path) -> int:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return -1
    steps = [-1]
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if record.get("kind") == "train":
            steps.append(record["step"])
    return max(steps)


def checkpoint_steps(run_dir: Path) -> list[int]:
    """Steps of the complete checkpoints (a directory counts once its marker exists)."""
    found = (Path(run_dir) / "checkpoints").glob("step-*/COMPLETE.json")
    return sorted(int(p.parent.name.split("-")[1]) for p in found)


def load_checkpoint(run_dir: Path, step: int) -> dict:
    """A sharded (DCP) checkpoint as one plain dict, read in this process without ranks."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    source = Path(run_dir) / "checkpoints" / f"step-{step:08d}"
    target = Path(run_dir).parent / f".{Path(run_dir).name}-{step}.pt"
    dcp_to_torch_save(source, target)
    try:
        return torch.load(target, map_location="cpu", weights_only=False)
    finally:
        target.unlink()


def assert_identical(a, b, where: str = "state") -> None:
    """Bit-for-bit equality of nested dicts/lists of tensors and plain values."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape, where
        assert torch.equal(a, b), f"{where} differs"
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), f"{where}: keys differ"
        for key in a:
            assert_identical(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, list | tuple):
        assert isinstance(b, list | tuple) and len(a) == len(b), f"{where}: lengths differ"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_identical(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def assert_same_training_state(run_a: Path, run_b: Path, step: int) -> None:
    """Model, optimizer, schedule and every rank's RNG bit-identical (the train part differs
    harmlessly: run_dir, times)."""
    a, b = load_checkpoint(run_a, step), load_checkpoint(run_b, step)
    for part in ("model", "scheduler", "rng"):
        assert_identical(a[part], b[part], part)


def kill_9_then_resume(
    argv: list[str], run_dir: Path, log_dir: Path, kill_at: int, final: int, world: int = 2
):
    """`world` ranks of `argv` (which trains into `run_dir` up to step `final`) killed with
    SIGKILL once step `kill_at` is logged, then the same command again: it resumes from a
    checkpoint written before the kill and finishes. The caller compares the result with its
    reference."""
    ranks = Ranks(argv, log_dir / "killed", world)
    ranks.wait_for_step(run_dir, kill_at)  # some step between checkpoints
    assert ranks.running(), "the run finished before it could be killed"
    ranks.send(signal.SIGKILL)
    ranks.wait()
    killed_at = checkpoint_steps(run_dir)
    assert killed_at and max(killed_at) < final, killed_at
    again = Ranks(argv, log_dir / "again", world)
    assert again.wait() == [0] * world, again.log(0)[-3000:]
    assert "RESUMING" in again.log(0)


def finished_reference(tmp_path_factory, name: str, extra: list[str], world: int = 2) -> Path:
    run_dir = tmp_path_factory.mktemp(name) / "run"
    ranks = train_ranks(run_dir, run_dir.parent / "logs", extra, world)
    assert ranks.wait() == [0] * world, ranks.log(0)[-3000:]
    return run_dir


@pytest.fixture(scope="session")
def reference_run(tmp_path_factory) -> Path:
    """An uninterrupted 2-rank DDP run of TINY, shared by the resume tests."""
    return finished_reference(tmp_path_factory, "reference", [])


@pytest.fixture(scope="session")
def hsdp_reference_run(tmp_path_factory) -> Path:
    """An uninterrupted 4-rank HSDP run of TINY (HSDP_4: FSDP2 on a 2 x 2 mesh); its rank 0's
    log is `<run_dir>/../logs/rank0.log`."""
    return finished_reference(tmp_path_factory, "reference-hsdp", HSDP_4, world=4)


@pytest.fixture
def single_process(monkeypatch):
    """Run the package in this process as a single rank (no launcher/Slurm variables)."""
    for key in list(os.environ):
        if key.startswith("SLURM_") or key in (
            "RANK",
            "WORLD_SIZE",
            "LOCAL_RANK",
            "MASTER_ADDR",
            "MASTER_PORT",
        ):
            monkeypatch.delenv(key)
    yield
    torch.set_num_threads(max(1, os.cpu_count() or 1))


@pytest.fixture
def cli(single_process, capfd, monkeypatch):
    """`python -m <package> ARGS` as a call in this process, from the repo's root: -> a
    subprocess.CompletedProcess (returncode, stdout, stderr). A command that one process runs
    and whose exit status and lines are what a test reads needs no interpreter of its own, and
    saves the 3 to 6 s of starting one with torch (and transformers) on a busy machine."""
    from {{ cookiecutter.package_name }}.cli import main

    monkeypatch.chdir(REPO)

    def call(*argv) -> subprocess.CompletedProcess:
        capfd.readouterr()
        try:
            status = main([str(arg) for arg in argv])
        except SystemExit as exit_:  # argparse's usage errors
            status = exit_.code if isinstance(exit_.code, int) else 1
        out, err = capfd.readouterr()
        return subprocess.CompletedProcess(list(argv), status, out, err)

    return call


@pytest.fixture
def no_terminal(monkeypatch) -> list[str]:
    """stdin closed, and every question put to the user (`input`) recorded and answered by an
    end of file: a test asserts the list stays empty (transformers asks whether to run a
    directory's code when trust_remote_code is not given)."""
    asked = []

    def ask(prompt=""):
        asked.append(prompt)
        raise EOFError

    monkeypatch.setattr("builtins.input", ask)
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    return asked


@pytest.fixture
def small_disk(tmp_path):
    """small_disk(kib): a tmpfs of that size, which what is written to it fills (root only)."""
    mounts = []

    def mount(kib: int):
        path = tmp_path / f"small{len(mounts)}"
        path.mkdir()
        command = ["mount", "-t", "tmpfs", "-o", f"size={kib}k", "tmpfs", str(path)]
        if not shutil.which("mount") or subprocess.run(command, capture_output=True).returncode:
            pytest.skip("mounting a small tmpfs needs root and mount(8) (CI runs as root)")
        mounts.append(path)
        return path

    yield mount
    for path in mounts:
        subprocess.run(["umount", "-l", str(path)], check=False)
