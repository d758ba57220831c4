"""Your own command under the job scripts (run/program.py): the env:// variables from Slurm's, the
rank 0 LOCK, the stop signal passed on once and turned into the REQUEUE marker, one line for a
command that is not there. Each case starts the wrapper as a task of the job script would, with
a small Python program of the user's (no torch in either: these take a second)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import PACKAGE, REPO

from {{ cookiecutter.package_name }}.distributed import tasks_on_node as package_tasks_on_node
from {{ cookiecutter.package_name }}.run import preemption, program
from {{ cookiecutter.package_name }}.run.rundir import LOCK, REQUEUE

# The user's program: writes what it was given to seen-<RANK>.json, then waits SLEEP seconds;
# on USR2, by MODE: "default" killed by it, "save" writes saved.txt (how many USR2 it got) and
# exits 3, "fail" exits 1
PROGRAM = textwrap.dedent(
    """
    import json, os, signal, sys, time
    out = os.environ["OUT"]
    keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "OMP_NUM_THREADS",
            "SLURM_PROCID")
    seen = {key: os.environ.get(key) for key in keys}
    seen["argv"], seen["cwd"] = sys.argv[1:], os.getcwd()
    seen["pid"], seen["own_group"] = os.getpid(), os.getpgrp() == os.getpid()
    seen["lock"] = os.path.exists(os.path.join(os.environ.get("RUN_DIR", "/nonexistent"), "LOCK"))
    got = []
    mode = os.environ.get("MODE", "default")
    if mode == "save":
        signal.signal(signal.SIGUSR2, lambda signum, frame: got.append(signum))
    elif mode == "fail":
        signal.signal(signal.SIGUSR2, lambda signum, frame: sys.exit(1))
    json.dump(seen, open(os.path.join(out, f"seen-{os.environ.get('RANK', 'x')}.json"), "w"))
    open(os.path.join(out, "started"), "w").close()
    deadline = time.monotonic() + float(os.environ.get("SLEEP", "0"))
    while time.monotonic() < deadline and not got:
        time.sleep(0.05)
    if got:
        time.sleep(0.5)  # a second delivery of the signal would arrive now
        open(os.path.join(out, "saved.txt"), "w").write(str(len(got)))
        sys.exit(3)
    sys.exit(int(os.environ.get("EXIT", "0")))
    """
)


@pytest.fixture
def user(tmp_path):
    """The user's program in a repository-like directory; run(args, **env) starts the wrapper
    there as a task of the job script would, returns the process (running) and the out dir."""
    (tmp_path / "own.py").write_text(PROGRAM)
    out = tmp_path / "out"
    out.mkdir()

    def start(*args: str, **extra: str | None) -> subprocess.Popen:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "OMP_"))}
        env |= {"PYTHONPATH": str(REPO / "src"), "OUT": str(out)} | extra
        env = {key: value for key, value in env.items() if value is not None}
        cmd = [sys.executable, "-m", f"{PACKAGE}.run.program", *args]
        return subprocess.Popen(  # a process group of its own, as a Slurm task has
            cmd,
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )

    return start, out


def finish(proc: subprocess.Popen, timeout: float = 60) -> tuple[int, str]:
    _, err = proc.communicate(timeout=timeout)
    return proc.returncode, err


def wait_for(path: Path, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} did not appear"
        time.sleep(0.05)


SRUN_TASK = {  # task 1 of 4, two per node, on the second node, 36 CPUs each
    "SLURM_JOB_ID": "77",
    "SLURM_STEP_ID": "0",
    "SLURM_PROCID": "3",
    "SLURM_LOCALID": "1",
    "SLURM_NODEID": "1",
    "SLURM_NTASKS": "4",
    "SLURM_STEP_NUM_TASKS": "4",
    "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
    "SLURM_CPUS_PER_TASK": "36",
}


def test_the_facts_it_repeats_are_the_packages():
    """program.py does not import torch; what it repeats of preemption.py and distributed.py is
    the same."""
    assert program.REQUEUE_EXIT_CODE == preemption.REQUEUE_EXIT_CODE
    assert program.SIGNALS == preemption.SIGNALS
    for spec, node in (("4", 0), ("2(x2)", 1), ("4(x2),3", 2), ("3,1", 1), ("8", 5)):
        assert program.tasks_on_node(spec, node) == package_tasks_on_node(spec, node)
    assert REQUEUE == "REQUEUE" and LOCK == "LOCK"  # what jobs/common.sh names
    imported = subprocess.run(
        [sys.executable, "-c", f"import sys, {PACKAGE}.run.program; print('torch' in sys.modules)"],
        env=os.environ | {"PYTHONPATH": str(REPO / "src")},
        capture_output=True,
        text=True,
        check=True,
    )
    assert imported.stdout.strip() == "False"


def test_each_task_gets_the_env_contract_and_its_arguments_unchanged(user):
    start, out = user
    args = ["a b", "$HOME", "--flag=x;y", "'quoted'"]
    code, err = finish(start("--", "own.py", *args, **SRUN_TASK))
    assert code == 0, err
    seen = json.loads((out / "seen-3.json").read_text())
    assert seen["argv"] == args  # passed through as they were, no shell in between
    assert (seen["RANK"], seen["LOCAL_RANK"]) == ("3", "1")
    assert (seen["WORLD_SIZE"], seen["LOCAL_WORLD_SIZE"]) == ("4", "2")
    assert seen["SLURM_PROCID"] == "3"  # Slurm's own stay, for programs that read them
    assert seen["OMP_NUM_THREADS"] == "36"  # the CPUs Slurm gives the task
    # a process group of its own: Slurm's signal to the task's group reaches the wrapper only,
    # which passes it on (two deliveries close together would be one; far apart, two)
    assert seen["own_group"] is True
    code, err = finish(start("--", "own.py", **SRUN_TASK, OMP_NUM_THREADS="5"))
    assert json.loads((out / "seen-3.json").read_text())["OMP_NUM_THREADS"] == "5"  # yours


def test_under_torchrun_the_workers_share_the_cpus_and_a_cli_runs_without_python(
    tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "own.py").write_text("")
    options = ["--nnodes=2", "--nproc-per-node=4", "--node-rank=1"]
    argv = program.program_argv(["own.py", "x"], options)
    assert argv[1:] == ["-m", f"{PACKAGE}.run.torchrun", *options, "own.py", "x"]
    cli = program.program_argv(["python", "-m", "mine"], options)
    assert cli[-5:] == ["--node-rank=1", "--no-python", "python", "-m", "mine"]
    env = program.child_environment({"SLURM_CPUS_PER_TASK": "288", "SLURM_PROCID": "1"}, options)
    assert env["OMP_NUM_THREADS"] == "72" and "RANK" not in env  # torchrun sets RANK


def test_rank_0_holds_the_lock_while_the_program_runs(user, tmp_path):
    start, out = user
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / REQUEUE).write_text("an earlier start's\n")
    job = {**SRUN_TASK, "SLURM_PROCID": "0", "RUN_DIR": str(run_dir), "SLEEP": "1"}
    code, err = finish(start("--", "own.py", **job))
    assert code == 0, err
    assert json.loads((out / "seen-0.json").read_text())["lock"] is True
    assert not (run_dir / LOCK).exists() and not (run_dir / REQUEUE).exists()


def test_a_second_job_on_a_held_run_dir_does_not_start_the_program(user, tmp_path, monkeypatch):
    start, out = user
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    holder = {"job": "12", "host": socket.gethostname(), "pid": os.getppid(), "step": "0"}
    (run_dir / LOCK).write_text(json.dumps(holder))
    rank0 = {**SRUN_TASK, "SLURM_PROCID": "0", "RUN_DIR": str(run_dir)}
    code, err = finish(start("--", "own.py", **rank0))
    assert code == 1 and err.count("\n") == 1, err
    assert err.startswith("error: ") and "in use by job 12" in err
    assert not (out / "started").exists()
    # another task waits for rank 0's lock and never starts the program while another job's is there
    monkeypatch.setattr(program, "LOCK_WAIT_S", 0.5)
    with pytest.raises(program.RunDirError, match="task 0 did not take"):
        program.take_lock(program.RunDir(run_dir), main=False)


@pytest.mark.parametrize(
    ("mode", "sig", "status"),
    [
        ("default", signal.SIGUSR2, 0),
        ("save", signal.SIGUSR2, 0),
        ("fail", signal.SIGUSR2, 1),
        ("default", signal.SIGTERM, 128 + signal.SIGTERM),
    ],
    ids=["killed-by-it", "saves-and-exits-3", "fails-on-it", "terminated-by-srun"],
)
def test_the_warning_reaches_the_program_once_and_requeues_when_it_stopped(
    user, tmp_path, mode, sig, status
):
    """USR2 (the time limit's warning): killed by it or exit 3 after saving, requeued; a
    failure on it is one; TERM alone (srun ends a step whose other task failed) is no reason."""
    start, out = user
    run_dir = tmp_path / "run"
    job = {**SRUN_TASK, "SLURM_PROCID": "0", "RUN_DIR": str(run_dir), "MODE": mode, "SLEEP": "60"}
    proc = start("--", "own.py", **job)
    wait_for(out / "started")
    os.killpg(proc.pid, sig)  # as Slurm does, to the task's process group (proctrack/pgid)
    code, err = finish(proc)
    marker = run_dir / REQUEUE
    assert code == status, err
    if status == 0:  # the marker says it; status 3 would end the other tasks early
        how = "exited 3 (asks to be requeued)" if mode == "save" else "ended by SIGUSR2"
        line = f"own.py {how}; signals received: SIGUSR2"
        assert marker.read_text() == line + "\n" and err == line + "\n"
    else:
        assert not marker.exists(), err
    # a task stopped by a signal did not fail on its own: the job script does not blame it
    assert not list(run_dir.glob("FAILED-task*"))
    if mode == "save":
        assert (out / "saved.txt").read_text() == "1", "the program got the signal twice"


def test_without_a_signal_exit_status_3_still_requeues_and_others_do_not(user, tmp_path):
    """Exit 3 of its own accord (the program watches the time itself) asks for a requeue."""
    start, _ = user
    run_dir = tmp_path / "run"
    rank0 = {**SRUN_TASK, "SLURM_PROCID": "0", "RUN_DIR": str(run_dir)}
    code, err = finish(start("--", "own.py", **rank0, EXIT="3"))
    line = "own.py exited 3 (asks to be requeued); signals received: none\n"
    assert code == 0 and err == line and (run_dir / REQUEUE).read_text() == line
    (run_dir / REQUEUE).unlink()
    assert finish(start("--", "own.py", **rank0, EXIT="140"))[0] == 140  # no USR2 came
    assert not (run_dir / REQUEUE).exists()
    assert finish(start("--", "own.py", **{**rank0, "EXIT": "3", "RUN_DIR": None}))[0] == 3


@pytest.mark.parametrize(
    ("command", "message"),
    [
        (["no-such-tool", "x"], "error: no-such-tool: command not found in "),
        (["missing.py"], "error: missing.py: no such file (a path from the repository root"),
        ([], "error: no command after --"),
    ],
    ids=["not-installed", "no-such-file", "nothing"],
)
def test_a_command_that_is_not_there_is_one_line(user, command, message):
    start, out = user
    code, err = finish(start("--", *command, **{**SRUN_TASK, "SLURM_PROCID": "0"}))
    assert code == (2 if not command else 127)
    assert err.startswith(message) and err.count("\n") == 1, err
    assert not (out / "started").exists()


def test_a_script_without_the_execute_bit_is_not_called_missing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("train.sh").write_text("#!/bin/bash\n")
    with pytest.raises(program.Refused) as refused:
        program.program_argv(["./train.sh"], None)
    assert refused.value.status == 126
    assert str(refused.value) == (
        "./train.sh: not executable: chmod +x ./train.sh, or name its interpreter first "
        "(python ./train.sh, bash ./train.sh)"
    )
    for name in ("x" * 5000 + ".py", "./" + "x" * 5000):  # too long for a file name
        with pytest.raises(program.Refused) as refused:
            program.program_argv([name], None)
        assert refused.value.status == 127, refused.value


def test_the_program_ends_with_the_wrapper(user, tmp_path):
    """SIGKILL to the wrapper (Slurm at the end of a step, after the grace time) ends the
    program too, though it runs in a process group of its own."""
    start, out = user
    proc = start("--", "own.py", SLEEP="60")
    wait_for(out / "started")
    pid = json.loads((out / "seen-0.json").read_text())["pid"]
    proc.kill()
    proc.wait(timeout=30)
    deadline = time.monotonic() + 10
    try:
        while b"zombie" not in _state(pid):
            assert time.monotonic() < deadline, "the program outlived its wrapper"
            time.sleep(0.05)
    finally:
        if b"zombie" not in _state(pid):
            os.kill(pid, signal.SIGKILL)
        proc.communicate(timeout=30)


def _state(pid: int) -> bytes:
    """Its /proc status; "zombie" when it has ended (reaped or not)."""
    try:
        return Path(f"/proc/{pid}/status").read_bytes().lower()
    except OSError:
        return b"zombie"


def test_task_0_notes_the_runs_first_start_once(user, tmp_path):
    """<RUN_DIR>/STARTED: written when the command first starts, kept by later starts (the job
    script then appends RESUME_ARGS); not written when the command is not there."""
    start, _ = user
    run_dir = tmp_path / "run"
    rank0 = {**SRUN_TASK, "SLURM_PROCID": "0", "RUN_DIR": str(run_dir)}
    assert finish(start("--", "missing.py", **rank0))[0] == 127
    assert not (run_dir / program.STARTED).exists()
    assert finish(start("--", "own.py", **rank0))[0] == 0
    assert (run_dir / program.STARTED).read_text() == "job 77 start 1\n"
    assert finish(start("--", "own.py", **rank0, SLURM_RESTART_COUNT="2"))[0] == 0
    assert (run_dir / program.STARTED).read_text() == "job 77 start 1\n"


def test_a_task_that_fails_on_its_own_notes_its_status(user, tmp_path):
    """FAILED-task<N>: when the task's command failed and with which status (the job script
    reports the first, not srun's highest)."""
    start, _ = user
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    before = time.time_ns()
    rank0 = {**SRUN_TASK, "SLURM_PROCID": "0", "RUN_DIR": str(run_dir)}
    code, _ = finish(start("--", "own.py", **rank0, EXIT="5"))
    when, status = (run_dir / "FAILED-task0").read_text().split()
    assert code == 5 and status == "5" and before < int(when) < time.time_ns()


def test_check_refuses_a_missing_command_and_a_held_run_dir_without_starting(user, tmp_path):
    """--check (the job script's cheap step before the doctor): the command is there and no
    other job holds RUN_DIR; it starts nothing and leaves no lock."""
    start, out = user
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    rank0 = {**SRUN_TASK, "SLURM_PROCID": "0", "RUN_DIR": str(run_dir)}
    code, err = finish(start("--check", "--", "no-such-tool", **rank0))
    assert code == 127 and err.startswith("error: no-such-tool: command not found in "), err
    assert finish(start("--check", "--", "own.py", **rank0)) == (0, "")
    assert not (out / "started").exists() and not (run_dir / LOCK).exists()
    holder = {"job": "12", "host": socket.gethostname(), "pid": os.getppid(), "step": "0"}
    (run_dir / LOCK).write_text(json.dumps(holder))
    code, err = finish(start("--check", "--", "own.py", **rank0))
    assert code == 1 and "in use by job 12" in err and err.count("\n") == 1, err


def test_in_run_dir_the_command_runs_there_and_finds_its_own_files(user, tmp_path):
    """IN_RUN_DIR=1: the command runs in RUN_DIR (a relative output lands there, per run), and
    each word naming a file of the repository root is given as its absolute path; other words
    (options, `--opt=FILE`, names that are no file there) stay as they were."""
    start, out = user
    (tmp_path / "options.yaml").write_text("")
    (tmp_path / "sub").mkdir()
    run_dir = tmp_path / "runs" / "exp"
    rank0 = {**SRUN_TASK, "SLURM_PROCID": "0", "RUN_DIR": str(run_dir), "IN_RUN_DIR": "1"}
    # a word too long for a file name is a word (Path.is_file raised ENAMETOOLONG)
    args = ["options.yaml", "--config=options.yaml", "sub", "missing.yaml", "-", "x" * 5000]
    code, err = finish(start("--", "own.py", *args, **rank0))
    assert code == 0, err
    seen = json.loads((out / "seen-0.json").read_text())
    assert seen["argv"] == [str(tmp_path / "options.yaml"), *args[1:]]
    assert seen["cwd"] == str(run_dir)
    assert finish(start("--", "own.py", **rank0, EXIT="3"))[0] == 0
    assert (run_dir / REQUEUE).read_text().startswith("own.py exited 3")  # as typed
    code, err = finish(start("--", "own.py", "options.yaml", **{**rank0, "IN_RUN_DIR": None}))
    seen = json.loads((out / "seen-0.json").read_text())
    assert code == 0 and (seen["argv"], seen["cwd"]) == (["options.yaml"], str(tmp_path))
