"""Your own program under the job scripts: `sbatch jobs/train_<flavour>.sbatch -- COMMAND ARGS`
(docs/your-program.md). jobs/common.sh starts this module on every task of the step, in the venv:

    python -m {{ cookiecutter.package_name }}.run.program [--check | --torchrun OPTION...] -- COMMAND [ARGS...]

It gives any command what the package does for itself:
- the env:// contract: RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE from Slurm's values, so
  `init_process_group()` needs no argument (with --torchrun, torchrun sets them for its workers);
  MASTER_ADDR and MASTER_PORT come from the job script, and SLURM_* stay (metatrain reads them);
- OMP_NUM_THREADS from the CPUs Slurm gives each process, unless it is set;
- task 0 holds <RUN_DIR>/LOCK while the program runs (run/lock.py, as training does); the other
  tasks start the program only once it does, so none runs on a run directory another job holds;
- task 0 leaves <RUN_DIR>/STARTED when the command first starts in the run directory: the job
  script appends RESUME_ARGS on every later start (a requeue, or the same line submitted again);
- the signals Slurm sends (USR2 before the time limit, TERM) are passed on to the program and
  noted. When it ends because of the warning, USR2 (killed by it, or exit status 3 after saving),
  or exits 3 of its own accord ("asks to be requeued"), task 0 leaves <RUN_DIR>/REQUEUE, one
  line naming the cause, and the job script requeues the job (at most MAX_REQUEUES times). TERM
  alone is no reason: srun sends it when another task failed (--kill-on-bad-exit);
- a task whose command fails on its own (no signal came) leaves <RUN_DIR>/FAILED-task<N> with
  its status and when it ended: the job exits with the first failing task's status, not srun's.
`--check` only checks that the command is there and the run directory is free, and exits: the
job script runs it on one task before the doctor, so that a typo costs no preflight.
A COMMAND ending in .py runs with the venv's python; under torchrun any other runs --no-python.
It runs in the repository root, or with IN_RUN_DIR=1 in RUN_DIR: then each word of the command
that names an existing file relative to the repository root (`train.py`, `options.yaml`) is
given as its absolute path, so that the command still finds its own files (`in_run_dir`).
No torch here: this process only waits, so it stays small and starts at once.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from .atomic import atomic_write_text
from .interrupts import die_with_parent
from .lock import RunDirLock, acquire, identity
from .rundir import RunDir, RunDirError, os_error_text

PACKAGE = __package__.split(".")[0]  # also when run as __main__
# preemption.REQUEUE_EXIT_CODE and preemption.SIGNALS, which import torch (this module does not;
# tests/test_program.py holds them equal)
REQUEUE_EXIT_CODE = 3
SIGNALS = (signal.SIGUSR2, signal.SIGUSR1, signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
# The time limit's warning (`#SBATCH --signal=USR2@180`; USR1 in other guides' scripts): a
# program it stopped is requeued
WARNINGS = (signal.SIGUSR2, signal.SIGUSR1)
NOT_FOUND_EXIT_CODE = 127  # what a shell returns for a command it cannot find
NOT_EXECUTABLE_EXIT_CODE = 126  # and for a file it cannot run
STARTED = "STARTED"  # jobs/common.sh tests "${RUN_DIR}/STARTED": keep the two equal
FAILED = "FAILED-task"  # jobs/common.sh reads "${RUN_DIR}"/FAILED-task*
HEARTBEAT_S = 60.0  # the lock's heartbeat (run/lock.py: a holder silent for 15 min is gone)
LOCK_WAIT_S = 300.0  # how long a task waits for task 0 to take the lock


class Refused(Exception):
    """The program cannot start (one line); `status` is the exit status."""

    def __init__(self, message: str, status: int = 2):
        super().__init__(message)
        self.status = status


def split_argv(argv: list[str]) -> tuple[list[str] | None, list[str]]:
    """`[--check | --torchrun OPTION...] -- COMMAND ARGS` -> (torchrun's options, or None, or
    ["--check"]; the command)."""
    if "--" not in argv:
        raise Refused(
            f"usage: python -m {PACKAGE}.run.program [--check | --torchrun OPTION...] -- COMMAND"
        )
    cut = argv.index("--")
    options, command = argv[:cut], argv[cut + 1 :]
    if not command:
        raise Refused("no command after --")
    if options == ["--check"]:
        return options, command
    if options and options[0] != "--torchrun":
        raise Refused(
            f"unknown option {options[0][:60]!r} (only --check or --torchrun comes before --)"
        )
    return (options[1:] if options else None), command


def tasks_on_node(tasks_per_node: str, node_id: int) -> int:
    """Tasks on node `node_id` from Slurm's spec, e.g. `4(x2),3` (distributed.tasks_on_node)."""
    counts: list[int] = []
    for item in tasks_per_node.split(","):
        match = re.fullmatch(r"([0-9]+)(?:\(x([0-9]+)\))?", item.strip())
        if match is None:
            raise Refused(f"cannot read Slurm's tasks per node {tasks_per_node[:60]!r}")
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts[min(node_id, len(counts) - 1)]


def rank_variables(env: Mapping[str, str]) -> dict[str, str]:
    """RANK, LOCAL_RANK, WORLD_SIZE and LOCAL_WORLD_SIZE of this srun task (Slurm's names as
    torch.distributed's env:// reads them); one process, outside srun."""
    world = env.get("SLURM_STEP_NUM_TASKS") or env.get("SLURM_NTASKS") or "1"
    per_node = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE")
    node = int(env.get("SLURM_NODEID", "0") or 0)
    local_world = tasks_on_node(per_node, node) if per_node else int(world)
    return {
        "RANK": env.get("SLURM_PROCID", "0"),
        "LOCAL_RANK": env.get("SLURM_LOCALID", "0"),
        "WORLD_SIZE": world,
        "LOCAL_WORLD_SIZE": str(local_world),
    }


def processes_per_task(torchrun: list[str] | None) -> int:
    """1 under srun; torchrun's --nproc-per-node workers under torchrun."""
    for option in torchrun or ():
        match = re.fullmatch(r"--nproc[-_]per[-_]node=([0-9]+)", option)
        if match:
            return max(int(match.group(1)), 1)
    return 1


def child_environment(env: Mapping[str, str], torchrun: list[str] | None) -> dict[str, str]:
    child = dict(env)
    if torchrun is None:
        child.update(rank_variables(env))
    cpus = env.get("SLURM_CPUS_PER_TASK", "")
    if "OMP_NUM_THREADS" not in env and cpus.isascii() and cpus.isdigit():
        child["OMP_NUM_THREADS"] = str(max(int(cpus) // processes_per_task(torchrun), 1))
    return child


def in_run_dir(command: list[str], root: Path) -> list[str]:
    """IN_RUN_DIR=1: words naming an existing file relative to `root` made absolute (a word that
    starts with - is an option, never a path: write `--config options.yaml`, not `--config=`).
    os.path.isfile, not Path.is_file: a word too long for a file name is a word, not an error."""
    return [
        str(root / word)
        if word
        and not word.startswith("-")
        and not os.path.isabs(word)
        and os.path.isfile(root / word)
        else word
        for word in command
    ]


def program_argv(command: list[str], torchrun: list[str] | None) -> list[str]:
    """What runs: COMMAND, a .py file with this python, torchrun in front of either; or Refused."""
    name = command[0]
    if name.endswith(".py"):
        if not os.path.isfile(name):  # False, not OSError, for a name too long for a file
            raise Refused(
                f"{name}: no such file (a path from the repository root, where the job runs)",
                NOT_FOUND_EXIT_CODE,
            )
    elif os.sep in name and os.path.isfile(name) and not os.access(name, os.X_OK):
        raise Refused(
            f"{name}: not executable: chmod +x {name}, or name its interpreter first "
            f"(python {name}, bash {name})",
            NOT_EXECUTABLE_EXIT_CODE,
        )
    elif shutil.which(name) is None:
        venv = os.environ.get("VIRTUAL_ENV", "the venv")
        raise Refused(
            f"{name}: command not found in {venv} or on PATH: install it into the venv "
            "(scripts/setup_venv.sh FLAVOUR -- PACKAGE, docs/your-program.md)",
            NOT_FOUND_EXIT_CODE,
        )
    if torchrun is not None:
        python = [] if name.endswith(".py") else ["--no-python"]
        return [sys.executable, "-m", f"{PACKAGE}.run.torchrun", *torchrun, *python, *command]
    return [sys.executable, *command] if name.endswith(".py") else list(command)


class Forwarder:
    """Passes each stop signal on to the program and notes it. The program runs in a process
    group of its own: Slurm signals the task's group (proctrack/pgid) or the task alone
    (proctrack/cgroup), so either way it gets each signal once, from here."""

    def __init__(self) -> None:
        self.received: list[int] = []
        self.child: subprocess.Popen | None = None

    def __enter__(self) -> Forwarder:
        for sig in SIGNALS:
            signal.signal(sig, self._handler)
        return self

    def __exit__(self, *exc) -> None:
        for sig in SIGNALS:
            signal.signal(sig, signal.SIG_DFL)

    def _handler(self, signum: int, frame) -> None:
        self.received.append(signum)
        child = self.child
        if child is not None and child.returncode is None:
            try:
                os.kill(child.pid, signum)
            except ProcessLookupError:
                pass


def _own_group_dying_with(wrapper: int) -> None:
    """In the child before exec: its own process group, and SIGKILL when the wrapper dies."""
    os.setpgid(0, 0)
    die_with_parent(wrapper)


def take_lock(run_dir: RunDir, main: bool) -> RunDirLock | None:
    """Task 0 takes the lock (RunDirBusy: another job holds it); the others wait until it has."""
    if main:
        run_dir.create()  # it exists and can be written, as training checks
        lock = acquire(run_dir)
        run_dir.requeue.unlink(missing_ok=True)  # ours now: a stale marker must go
        return lock
    me = identity()
    wanted = (me["job"], me["restart"], me["step"])
    deadline = time.monotonic() + LOCK_WAIT_S
    while time.monotonic() < deadline:
        try:
            holder = json.loads(run_dir.lock.read_text())
            if (holder.get("job"), holder.get("restart"), holder.get("step")) == wanted:
                return None
        except (OSError, ValueError, AttributeError):
            pass  # not there yet, or being replaced
        time.sleep(0.2)
    raise RunDirError(f"task 0 did not take {run_dir.lock} within {LOCK_WAIT_S:.0f} s")


def run_program(
    argv: list[str],
    env: dict[str, str],
    lock: RunDirLock | None,
    forwarder: Forwarder,
    cwd: str | None = None,
) -> int:
    """Start the program, pass signals on, beat the lock's heart; its exit status."""
    if forwarder.received:  # a signal came before it started: it is as if it had ended by it
        return -forwarder.received[0]
    try:
        in_child = functools.partial(_own_group_dying_with, os.getpid())
        forwarder.child = subprocess.Popen(argv, env=env, preexec_fn=in_child, cwd=cwd)
    except OSError as err:  # not executable, a bad interpreter line
        raise Refused(f"cannot run {argv[0]}: {err.strerror}", NOT_FOUND_EXIT_CODE) from None
    if forwarder.received:  # one that came while it started
        os.kill(forwarder.child.pid, forwarder.received[-1])
    while True:
        try:
            return forwarder.child.wait(timeout=HEARTBEAT_S)
        except subprocess.TimeoutExpired:
            if lock is not None:
                lock.refresh()


def note_start(run_dir: RunDir) -> None:
    """Task 0, the lock held: <RUN_DIR>/STARTED, once per run (the job script's resume test)."""
    marker = run_dir.path / STARTED
    if not marker.exists():
        me = identity()
        atomic_write_text(marker, f"job {me['job']} start {int(me['restart'] or 0) + 1}\n")


def note_failure(run_dir: RunDir, status: int) -> None:
    """A task's own failure: its status and when (the job script reports the first)."""
    task = os.environ.get("SLURM_PROCID", "0")
    try:
        atomic_write_text(run_dir.path / f"{FAILED}{task}", f"{time.time_ns()} {status}\n")
    except OSError:  # the job then reports srun's status, as before
        pass


def stopped_by_warning(status: int, received: list[int]) -> bool:
    """Exit status 3, or killed by a signal it got (a shell says 128 + the signal) once the
    time limit's warning had come."""
    killed_by = -status if status < 0 else status - 128
    warned = any(sig in received for sig in WARNINGS)
    return status == REQUEUE_EXIT_CODE or (status != 0 and killed_by in received and warned)


def main(argv: list[str] | None = None) -> int:
    env = dict(os.environ)
    main_task = env.get("SLURM_PROCID", "0") == "0"
    run_dir = RunDir(env["RUN_DIR"]) if env.get("RUN_DIR") else None
    lock = None
    try:
        torchrun, command = split_argv(list(sys.argv[1:] if argv is None else argv))
        cwd, name = None, command[0]  # the name as typed, for the lines below
        if env.get("IN_RUN_DIR") == "1" and run_dir is not None:
            command, cwd = in_run_dir(command, Path.cwd()), str(run_dir)
        if torchrun == ["--check"]:
            program_argv(command, None)
            if run_dir is not None:  # a clash with a running job ends here, before the doctor
                acquire(run_dir).release()
            return 0
        argv_, child_env = program_argv(command, torchrun), child_environment(env, torchrun)
        with Forwarder() as forwarder:  # from here on a signal is noted, also while waiting
            lock = take_lock(run_dir, main_task) if run_dir is not None else None
            if lock is not None:
                note_start(run_dir)
            if cwd is not None:
                run_dir.create()  # the other tasks start in it before task 0 may have made it
            status = run_program(argv_, child_env, lock, forwarder, cwd)
        received = forwarder.received
        if not stopped_by_warning(status, received):
            if status != 0 and not received and run_dir is not None:
                note_failure(run_dir, 128 - status if status < 0 else status)
            return 128 - status if status < 0 else status  # as a shell says it: 128 + signal
        if main_task:
            report_stop(name, status, received, run_dir)
        # The REQUEUE marker tells the job script; a task's status 3 would make srun's
        # --kill-on-bad-exit end the other tasks, which may still be saving.
        return 0 if run_dir is not None else REQUEUE_EXIT_CODE
    except Refused as err:
        status = err.status
        if main_task:
            print(f"error: {err}", file=sys.stderr, flush=True)
        else:  # task 0 says why, before srun ends the step; ended by srun, the same status
            signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(status))
            time.sleep(2)
        return status
    except RunDirError as err:  # another job holds it, read-only, a file where a folder belongs
        print(f"error: {err}", file=sys.stderr, flush=True)
        return 1
    finally:
        if lock is not None:
            lock.release()


def report_stop(name: str, status: int, received: list[int], run_dir: RunDir | None) -> None:
    """Task 0: the REQUEUE marker, and one line."""
    if status == REQUEUE_EXIT_CODE:
        how = "exited 3 (asks to be requeued)"
    else:
        how = f"ended by {signal.Signals(-status if status < 0 else status - 128).name}"
    came = ", ".join(dict.fromkeys(signal.Signals(s).name for s in received)) or "none"
    line = f"{name} {how}; signals received: {came}"
    print(line, file=sys.stderr, flush=True)
    if run_dir is not None:
        try:
            atomic_write_text(run_dir.requeue, line + "\n")
        except OSError as err:  # a full disk, say: the job script cannot requeue, and says so
            print(f"error: cannot write {run_dir.requeue}: {os_error_text(err)}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
