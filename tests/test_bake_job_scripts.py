"""The generated Slurm job scripts: their #SBATCH lines and environment follow the answers, and run
as Slurm would start them (srun and scontrol replaced by recorders) they train, requeue, run
array tasks as runs of their own, refuse bad settings and profile with nsys."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from conftest import answers, run
from fake_slurm import FAKE_SCONTROL, FAKE_SRUN, fake_env


def sbatch_directives(script: Path) -> dict[str, str]:
    directives = {}
    for line in script.read_text().splitlines():
        m = re.match(r"#SBATCH --([a-z-]+)(?:=(\S+))?", line)
        if m:
            directives[m.group(1)] = m.group(2) or ""
    return directives


def test_job_scripts_follow_answers(baked):
    name, path = baked
    a = answers(name)
    jobs = sorted((path / "jobs").glob("*.sbatch"))
    assert jobs
    common = (path / "jobs" / "common.sh").read_text()  # what every job script sources
    for job in jobs:
        d = sbatch_directives(job)
        own = job.read_text()
        assert own.rstrip().endswith("\nsource jobs/common.sh")
        text = own + common
        assert d["job-name"] == path.name
        assert d["partition"] == a["partition"]
        assert d["time"] == a["time_limit"]
        assert d["nodes"] == a["nodes"]
        assert ("account" in d) == bool(a["account"])
        if a["account"]:
            assert d["account"] == a["account"]
        assert d["output"] == "logs/slurm-%x-%j.log"
        assert (path / "logs").is_dir()
        assert d["signal"] == "USR2@180" and "requeue" in d and d["open-mode"] == "append"
        assert "environment" not in d  # never #SBATCH --environment
        assert "ulimit -c 0" in text
        assert 'scontrol requeue "${job_ref}"' in text  # the job, or the array task
        # one place for both flavours: the job script, not the EDF (it holds for uenv jobs too)
        assert text.count("export TORCH_NCCL_ASYNC_ERROR_HANDLING=1") == 1
        assert "srun_args=(--label --kill-on-bad-exit=1)" in text
        if a["launcher"] == "srun":
            assert (d["ntasks-per-node"], d["cpus-per-task"]) == ("4", "72")
            assert ".run.torchrun" not in text
        else:
            assert (d["ntasks-per-node"], d["cpus-per-task"]) == ("1", "288")
            assert f"python -m {path.name.replace('-', '_')}.run.torchrun" in text  # one line
            assert 'PET_SIGNALS_TO_HANDLE="SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR2,SIGUSR1"' in text
        uenv = job.name == "train_uenv.sbatch"
        assert (d.get("uenv"), d.get("view")) == (
            (a["__uenv_image"], "default") if uenv else (None, None)
        )
        # the uenv NCCL/libfabric snippet belongs to uenv jobs only (the CE hook sets its own)
        assert ('export NCCL_NET="AWS Libfabric"' in text) == uenv
        assert ('TRITON_HOME="/dev/shm' in text) == uenv
        assert ("--environment=" in text) == (not uenv)
        extended = a["container_base"] == "alps-extended"
        assert ("--mpi=pmix" in text) == (not uenv and extended)
        # the pinned uenv's view sets hybrid, tested with its libfabric; the job keeps it
        assert ("export FI_CXI_RX_MATCH_MODE=hybrid  #" in text) == uenv
        assert "FI_CXI_RX_MATCH_MODE=software" not in text
        # the flavour's own part is in the job script, the shared part in common.sh only
        assert "NCCL_NET" not in common and "--environment" not in common
        code = [line for line in own.splitlines() if not line.lstrip().startswith("#")]
        assert not [line for line in code if re.match(r"\s*(srun|scontrol) ", line)]


@pytest.fixture
def fake_job(bake, tmp_path):
    """fake_job(*args, **env) runs the uenv job script of uenv-torchrun (daint: runs under
    ${SCRATCH}) as Slurm would start it, with srun and scontrol replaced by recorders, with
    `args` (default max_steps=7); returns the process and the recorded calls. The real-Slurm
    version of these cases is in test_slurm_e2e.py and test_slurm_programs.py."""
    baked = bake("uenv-torchrun")
    repo = tmp_path / "work" / baked.name  # the job name is the repository's name
    shutil.copytree(baked, repo)
    venv_python = repo / ".venv-uenv" / "bin" / "python"
    venv_python.parent.mkdir(parents=True)
    venv_python.write_text("#!/bin/sh\n")
    venv_python.chmod(0o755)
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    for name, text in (("srun", FAKE_SRUN), ("scontrol", FAKE_SCONTROL)):
        (fake_bin / name).write_text(text)
        (fake_bin / name).chmod(0o755)
    calls = tmp_path / "calls"

    def _run(
        *args: str, **extra: str | None
    ) -> tuple[subprocess.CompletedProcess, list[list[str]]]:
        shutil.rmtree(calls, ignore_errors=True)
        calls.mkdir()
        env = fake_env(tmp_path, fake_bin, calls) | {
            "SLURM_SUBMIT_DIR": str(repo),
            "SLURM_JOB_NAME": repo.name,
            "SLURM_JOB_ID": "42",
            "SLURM_JOB_NODELIST": "node1",
            "SLURM_NNODES": "1",
            "SLURM_CPUS_PER_TASK": "288",
            "DATASET": "synthetic",
            "DOCTOR": "0",
            **extra,
        }
        env = {key: value for key, value in env.items() if value is not None}  # None: unset
        script = ["bash", "jobs/train_uenv.sbatch", *(args or ["max_steps=7"])]
        proc = run(script, cwd=repo, env=env, check=False)
        recorded = sorted(calls.iterdir(), key=lambda p: int(p.name))
        return proc, [p.read_text().split("\0")[:-1] for p in recorded]

    return _run


def test_job_script_runs_array_tasks_as_runs_of_their_own(fake_job, tmp_path):
    """Array task 1 (whose job id is the array's, as Slurm gives the last task) trains
    <job name>-1 with its SWEEP line after the command line's overrides, and a stop for requeue
    requeues 40_1, not the array 40; a plain job requeues itself; failures (a diverged run's
    status 4 among them) are not requeued."""
    runs = tmp_path / "scratch" / "alps-torch-project" / "runs"
    sweep = tmp_path / "sweep.txt"
    sweep.write_text("lr=1e-3 seed=1\nlr=3e-4 seed=2\n")
    array_task = {"SLURM_ARRAY_JOB_ID": "40", "SLURM_ARRAY_TASK_ID": "1", "SLURM_JOB_ID": "40"}
    proc, calls = fake_job(**array_task, SWEEP=str(sweep), FAKE_SRUN_STATUS="3")
    assert proc.returncode == 0, proc.stderr
    train = calls[0]
    assert train[0] == "srun" and f"run_dir={runs}/alps-torch-project-1" in train
    assert train[-3:] == ["max_steps=7", "lr=3e-4", "seed=2"]  # the task's line wins
    assert calls[1:] == [["scontrol", "requeue", "40_1"]]
    assert "requeueing job 40_1" in proc.stdout

    proc, calls = fake_job(FAKE_SRUN_STATUS="3")  # not an array: the job itself
    assert proc.returncode == 0 and f"run_dir={runs}/alps-torch-project" in calls[0]
    assert calls[1:] == [["scontrol", "requeue", "42"]]

    proc, calls = fake_job(**array_task, FAKE_SRUN_STATUS="1")  # a failure: no requeue
    assert proc.returncode == 1 and len(calls) == 1
    assert f"run_dir={runs}/alps-torch-project-1" in calls[0]
    assert "error: training failed (exit status 1;" in proc.stderr

    proc, calls = fake_job(FAKE_SRUN_STATUS="4")  # diverged (a NaN): never requeued
    assert proc.returncode == 4 and len(calls) == 1
    assert "error: training diverged (exit status 4:" in proc.stderr


def test_job_script_passes_dataset_only_when_the_user_set_it(fake_job, tmp_path):
    """DATASET set: `dataset=` after the config (it overrides the file's). Unset: the default
    stdlib-bytes goes in as `--job-default`, below every config file, so a config's own dataset
    trains (the script used to pass dataset=<default> over it, silently)."""
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "index.json").write_text("{}")
    proc, calls = fake_job(DATASET=str(mine))
    assert proc.returncode == 0, proc.stderr
    (train,) = calls
    assert f"dataset={mine}" in train and "--job-default" not in train
    assert f"dataset={mine}: from DATASET in the job's environment" in proc.stdout

    proc, calls = fake_job(DATASET=None)
    assert proc.returncode == 0, proc.stderr
    default = tmp_path / "scratch" / "alps-torch-project" / "data" / "stdlib-bytes"
    make, train = calls  # the default dataset does not exist yet: made first
    assert make[-3:] == ["--stdlib", "--out", str(default)]
    at = train.index("--job-default")
    assert train[at + 1] == f"dataset={default}"
    assert [i for i, item in enumerate(train) if item.startswith("dataset=")] == [at + 1]


def test_job_script_requeues_on_its_own_requeue_marker_only(fake_job, tmp_path):
    """The step's status may be another task's (one that --kill-on-bad-exit ended, or plain
    torchrun's 1): the REQUEUE marker written during the step requeues the job; a marker that
    was there before (another job's, on a run directory whose LOCK refused this one) does not."""
    marker = tmp_path / "scratch" / "alps-torch-project" / "runs" / "alps-torch-project" / "REQUEUE"
    proc, calls = fake_job(FAKE_SRUN_STATUS="1", FAKE_MARKER=str(marker))
    assert proc.returncode == 0 and calls[1:] == [["scontrol", "requeue", "42"]], proc.stderr
    os.utime(marker, (time.time() - 60,) * 2)  # now it predates the next job's step
    proc, calls = fake_job(FAKE_SRUN_STATUS="1")
    assert proc.returncode == 1 and len(calls) == 1 and marker.exists()


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"SLURM_ARRAY_JOB_ID": "40", "SLURM_ARRAY_TASK_ID": "0", "RUN_DIR": "/x/run"},
            "error: RUN_DIR=/x/run would be shared by every task of the array; set RUN_NAME",
        ),
        (
            {"SLURM_ARRAY_JOB_ID": "40", "SLURM_ARRAY_TASK_ID": "2", "SWEEP": "{sweep}"},
            "error: SWEEP={sweep} has no line 3 for array task 2",
        ),
        (
            {"SLURM_ARRAY_JOB_ID": "40", "SLURM_ARRAY_TASK_ID": "0", "SWEEP": "{sweep}.missing"},
            "error: SWEEP={sweep}.missing does not exist",
        ),
        ({"SWEEP": "{sweep}"}, "error: SWEEP={sweep} needs a job array: sbatch --array=0-N"),
    ],
    ids=["shared-run-dir", "short-sweep", "missing-sweep", "sweep-without-array"],
)
def test_job_script_refuses_bad_array_settings(fake_job, tmp_path, env, message):
    """Each mistake ends the job at once with exit 2 and one line naming the variable."""
    sweep = tmp_path / "sweep.txt"
    sweep.write_text("lr=1e-3\n\n")  # task 1's line is empty: no line for it either
    env = {key: value.format(sweep=sweep) for key, value in env.items()}
    proc, calls = fake_job(**env)
    assert proc.returncode == 2 and calls == []
    assert message.format(sweep=sweep) in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def run_task(command: list[str], repo: Path, tmp_path: Path, **env: str) -> list[str]:
    """Run one recorded `srun ... bash -c CMD bash ARGS` task as Slurm would on a node (the venv
    and nsys are recorders); returns the program it ran, with its arguments."""
    bash = command.index("bash")
    fake = tmp_path / "task-bin"
    fake.mkdir(exist_ok=True)
    log = tmp_path / "task-argv"
    for name in ("python", "nsys"):
        (fake / name).write_text(f'#!/bin/bash\nprintf "%s\\n" {name} "$@" > "{log}"\n')
        (fake / name).chmod(0o755)
    venv = repo / ".venv-uenv" / "bin"
    (venv / "activate").write_text(f'export PATH="{fake}:$PATH"\n')
    task_env = {"PATH": f"{fake}:/usr/bin:/bin", "VENV": str(venv.parent), "SLURM_JOB_ID": "42"}
    subprocess.run(
        command[bash:], cwd=repo, env=task_env | env, check=True, capture_output=True, text=True
    )
    return log.read_text().splitlines()


def test_nsys_profiles_the_training_step_of_the_chosen_ranks(fake_job, tmp_path):
    """NSYS=1: rank 0 (with torchrun: node 0's torchrun) trains under `nsys profile`, its report
    in <RUN_DIR>/nsys/; NSYS=all: every one; unset: none; the doctor never; a typo: exit 2."""
    repo = tmp_path / "work" / "alps-torch-project"
    run_dir = tmp_path / "scratch" / "alps-torch-project" / "runs" / "alps-torch-project"
    for nsys, node, profiled in (("1", "0", True), ("1", "1", False), ("all", "1", True)):
        proc, calls = fake_job(NSYS=nsys, DOCTOR="1")
        assert proc.returncode == 0, proc.stderr
        doctor, train = calls
        env = {"NSYS": nsys, "NSYS_DIR": str(run_dir / "nsys"), "SLURM_NODEID": node}
        argv = run_task(train, repo, tmp_path, **env)
        if profiled:
            output = f"--output={run_dir}/nsys/42-node{node}"
            assert argv[:4] == ["nsys", "profile", "--trace=cuda,nvtx,osrt", output]
            assert argv[4:7] == ["python", "-m", "alps_torch_project.run.torchrun"]
        else:
            assert argv[:3] == ["python", "-m", "alps_torch_project.run.torchrun"]
        assert (run_dir / "nsys").is_dir()
        assert run_task(doctor, repo, tmp_path, **env)[0] == "python"
    proc, calls = fake_job()
    assert run_task(calls[0], repo, tmp_path, NSYS="0", SLURM_NODEID="0")[0] == "python"
    proc, calls = fake_job(NSYS="yes")
    assert proc.returncode == 2 and calls == []
    assert proc.stderr.startswith("error: NSYS=yes: use NSYS=1 (node 0) or NSYS=all")


def test_a_bad_doctor_args_is_not_blamed_on_fail_lines(fake_job):
    """The doctor's usage error (exit 2: an option it does not take) ends the job naming
    DOCTOR_ARGS; any other failing status is a FAIL."""
    proc, calls = fake_job(DOCTOR="1", DOCTOR_ARGS="--bogus", FAKE_SRUN_STATUS="2")
    assert proc.returncode == 2 and len(calls) == 1 and "--bogus" in calls[0]
    assert proc.stderr.startswith('error: DOCTOR_ARGS="--bogus" refused by the doctor'), proc.stderr
    proc, calls = fake_job(DOCTOR="1", FAKE_SRUN_STATUS="1")
    assert proc.returncode == 1 and "error: the doctor found a problem" in proc.stderr


# ------------------------------------------------------------------ your own command after --

PROGRAM = ["mtt", "train", "my options.yaml", "$HOME", "a'b"]  # passed through as they are


def test_your_command_runs_after_the_doctor_with_its_arguments_unchanged(fake_job, tmp_path):
    """`-- COMMAND ARGS`: the cheap check on one task, the doctor, then every task runs the
    command through run/program.py (under torchrun: on each node, torchrun with the same
    rendezvous and --no-python for a CLI); no config file or dataset needed; a SWEEP line's
    words and, once the run started before (its STARTED marker: a requeue or the same line
    submitted again), RESUME_ARGS follow the command's arguments."""
    repo = tmp_path / "work" / "alps-torch-project"
    no_config = {"CONFIG": "missing.toml", "DATASET": None, "DOCTOR": "1"}
    proc, calls = fake_job("--", *PROGRAM, RESUME_ARGS="--restart auto", **no_config)
    assert proc.returncode == 0, proc.stderr
    check, doctor, step = calls  # no make-dataset
    assert "--ntasks=1" in check and check[-len(PROGRAM) - 1 :] == ["bash", *PROGRAM]
    assert "alps_torch_project.run.program --check --" in check[check.index("-c") + 1]
    assert "doctor" in doctor and "--quick" in doctor
    assert step[step.index("-c") + 3 :] == PROGRAM  # srun ... bash -c CMD bash ARGS
    assert "--restart" not in step  # the first start
    env = {"SLURM_NNODES": "2", "SLURM_NODEID": "1", "MASTER_ADDR": "n1", "MASTER_PORT": "15042"}
    argv = run_task(step, repo, tmp_path, WORKERS_PER_NODE="2", **env)
    wrapper = ["python", "-m", "alps_torch_project.run.program", "--torchrun", "--nnodes=2"]
    assert argv[:5] == wrapper
    assert argv[5:] == [
        "--nproc-per-node=2",
        "--node-rank=1",
        "--master-addr=n1",
        "--master-port=15042",
        "--",
        *PROGRAM,
    ]
    sweep = tmp_path / "sweep.txt"
    sweep.write_text("--lr 1e-3\n--lr 3e-4 --seed 2\n")
    array_task = {"SLURM_ARRAY_JOB_ID": "40", "SLURM_ARRAY_TASK_ID": "1", "SWEEP": str(sweep)}
    run_dir = tmp_path / "scratch" / "alps-torch-project" / "runs" / "alps-torch-project-1"
    run_dir.mkdir(parents=True)
    (run_dir / "STARTED").write_text("job 40 start 1\n")  # run/program.py's, on its first start
    resubmitted = {"SLURM_RESTART_COUNT": None, "RESUME_ARGS": "--restart auto"}
    proc, calls = fake_job("--", *PROGRAM, **no_config, **array_task, **resubmitted)
    assert proc.returncode == 0, proc.stderr
    tail = [*PROGRAM, "--lr", "3e-4", "--seed", "2", "--restart", "auto"]
    assert calls[-1][-len(tail) :] == tail
    assert f"this run started before ({run_dir}/STARTED): RESUME_ARGS appended" in proc.stdout


def test_a_missing_command_ends_the_job_before_the_doctor(fake_job):
    """The check step fails (run/program.py --check: command not found, exit 127): the
    doctor never starts."""
    proc, calls = fake_job("--", "no-such-tool", DOCTOR="1", FAKE_SRUN_STATUS="127")
    assert proc.returncode == 127 and len(calls) == 1 and "--check" in calls[0][-3], calls


def test_your_command_requeues_on_the_marker_only_and_failures_say_so(fake_job, tmp_path):
    """run/program.py leaves <run_dir>/REQUEUE when the command stopped because of the warning
    signal (its tasks exit 0): the job requeues; a failing command is not requeued, also when
    another task left the marker."""
    marker = tmp_path / "scratch" / "alps-torch-project" / "runs" / "alps-torch-project" / "REQUEUE"
    proc, calls = fake_job("--", "train.py", FAKE_MARKER=str(marker))
    assert proc.returncode == 0 and calls[1:] == [["scontrol", "requeue", "42"]], proc.stderr
    # the marker's line (run/program.py: the signal, or "exited 3 (asks to be requeued)")
    assert "your command stop: requeueing job 42 (requeue 1 of at most MAX_REQUEUES=50" in (
        proc.stdout
    )
    # a task failed (srun's status 1) while another one wrote the marker: not requeued
    proc, calls = fake_job("--", "train.py", FAKE_SRUN_STATUS="1", FAKE_MARKER=str(marker))
    assert proc.returncode == 1 and len(calls) == 1
    assert "error: your command failed (exit status 1; its lines above say why)." in proc.stderr
    assert "Not requeued." in proc.stderr


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["--"], {}, "error: no command after --: sbatch jobs/train_uenv.sbatch -- COMMAND"),
        (["max_steps=7"], {"RESUME_ARGS": "--restart auto"}, "error: RESUME_ARGS is for your own"),
        (["--", "mtt"], {"RESUME_ARGS": "--restart 'auto'"}, "error: RESUME_ARGS="),
        (["--", "mtt"], {"RESUME_ARGS": "--restart $(id)"}, "error: RESUME_ARGS="),
        (["--", "mtt"], {"RESUME_ARGS": "--out $HOME/x"}, "error: RESUME_ARGS="),
        (["--", "mtt"], {"RESUME_ARGS": "--restart `id`"}, "error: RESUME_ARGS="),
        (["--", "mtt"], {"RESUME_ARGS": "--restart auto; id"}, "error: RESUME_ARGS="),
        (["--", "mtt"], {"RESUME_ARGS": "--restart auto\nid"}, "error: RESUME_ARGS="),
        (["--", "mtt"], {"RESUME_ARGS": "--epochs \u0663"}, "error: RESUME_ARGS="),
        (["--", "mtt"], {"RESUME_ARGS": "x" * 1001}, "error: RESUME_ARGS="),
        (["--", "mtt"], {"MAX_REQUEUES": "-1"}, "error: MAX_REQUEUES='-1': a number"),
        (["--", "mtt"], {"MAX_REQUEUES": "\u0663"}, "error: MAX_REQUEUES="),
        (["--", "mtt"], {"MAX_REQUEUES": "$(id)"}, "error: MAX_REQUEUES='$(id)': a number"),
        (["--", "mtt"], {"IN_RUN_DIR": "yes"}, "error: IN_RUN_DIR='yes': use IN_RUN_DIR=1"),
        (["max_steps=7"], {"IN_RUN_DIR": "1"}, "error: IN_RUN_DIR is for your own command"),
    ],
    ids=[
        "nothing-after",
        "package",
        "quotes",
        "substitution",
        "variable",
        "backticks",
        "semicolon",
        "newline",
        "unicode-digit",
        "too-long",
        "max-requeues",
        "max-requeues-unicode-digit",
        "max-requeues-substitution",
        "in-run-dir",
        "in-run-dir-package",
    ],
)
def test_bad_command_lines_end_the_job_in_one_line(fake_job, args, env, message):
    """Checked on every start (not only when RESUME_ARGS is used): exit 2, nothing run."""
    proc, calls = fake_job(*args, **env)
    assert proc.returncode == 2 and calls == [], proc.stderr
    assert proc.stderr.startswith(message) and proc.stderr.count("\n") == 1, proc.stderr


def test_requeues_stop_at_max_requeues(fake_job, tmp_path):
    """A command that asks for a requeue on every start (exit 3) is requeued MAX_REQUEUES times,
    then the job ends failed with one line naming the limit; the package's runs alike."""
    marker = tmp_path / "scratch" / "alps-torch-project" / "runs" / "alps-torch-project" / "REQUEUE"
    limit = {"MAX_REQUEUES": "2", "FAKE_MARKER": str(marker)}
    proc, calls = fake_job("--", "train.py", SLURM_RESTART_COUNT="1", **limit)
    assert proc.returncode == 0 and calls[1:] == [["scontrol", "requeue", "42"]], proc.stderr
    for args in (["--", "train.py"], ["max_steps=7"]):
        proc, calls = fake_job(*args, SLURM_RESTART_COUNT="2", **limit)
        assert proc.returncode == 1 and len(calls) == 1, proc.stderr
        assert proc.stderr.count("\n") == 1 and "MAX_REQUEUES=2" in proc.stderr, proc.stderr
        assert "not requeued: job 42 was requeued 2 times" in proc.stderr


@pytest.mark.parametrize("own", [True, False], ids=["your-command", "package"])
def test_the_stop_signal_to_the_batch_shell_reaches_the_step(fake_job, tmp_path, own):
    """`--signal=B:USR2@T` or `scancel --batch --signal=USR2`: the batch shell passes the signal
    on to srun (which passes it to every task); the step saves (here: writes the marker) and
    the job requeues, instead of the batch shell dying of the signal."""
    marker = tmp_path / "scratch" / "alps-torch-project" / "runs" / "alps-torch-project" / "REQUEUE"
    step = (
        f'trap "echo saved > {marker}; exit 0" USR2; kill -USR2 "$PPID"; '
        "for _ in $(seq 100); do sleep 0.1; done; exit 9"
    )
    args = ["--", "train.py"] if own else ["max_steps=7"]
    proc, calls = fake_job(*args, FAKE_STEP=step)
    assert proc.returncode == 0 and calls[1:] == [["scontrol", "requeue", "42"]], proc.stderr
    assert "SIGUSR2 reached the batch shell: passed on to the step" in proc.stdout


def test_the_job_exits_with_the_first_failing_tasks_status(fake_job, tmp_path):
    """srun reports the highest status (137 for the task --kill-on-bad-exit killed); the job
    exits with the status of the task that failed first, and names it."""
    run_dir = tmp_path / "scratch" / "alps-torch-project" / "runs" / "alps-torch-project"
    step = (
        f'sleep 0.1; echo "$(date +%s%N) 5" > {run_dir}/FAILED-task1; '
        f'sleep 0.1; echo "$(date +%s%N) 7" > {run_dir}/FAILED-task0'
    )
    proc, _ = fake_job("--", "train.py", FAKE_STEP=step, FAKE_SRUN_STATUS="137")
    assert proc.returncode == 5, proc.stderr
    assert "error: your command failed on task 1 (exit status 5;" in proc.stderr


@pytest.mark.parametrize(
    ("env", "workers", "cpus"),
    [
        ({"SLURM_GPUS_ON_NODE": "4", "SLURM_TASKS_PER_NODE": "1(x2)"}, "4", "288"),
        ({"SLURM_GPUS_ON_NODE": None, "SLURM_TASKS_PER_NODE": "2"}, "2", "576"),
        ({"SLURM_GPUS_ON_NODE": "0", "SLURM_TASKS_PER_NODE": "3(x2),1"}, "3", "864"),
    ],
    ids=["gpus", "no-gpus", "no-gpus-uneven"],
)
def test_torchrun_starts_a_worker_per_gpu_else_per_task_asked_for(
    fake_job, tmp_path, env, workers, cpus
):
    """Without GPUs torchrun does not start 4 workers whatever was asked: one per task asked
    for, one torchrun per node with those tasks' CPUs; the job's first lines say how many."""
    seen = tmp_path / "step-env"
    step_env = f'echo "$SRUN_CPUS_PER_TASK $WORKERS_PER_NODE" > {seen}'
    proc, calls = fake_job("--", "train.py", SLURM_NNODES="2", FAKE_STEP=step_env, **env)
    assert proc.returncode == 0, proc.stderr
    assert f"torchrun: {workers} worker(s) per node, one per " in proc.stdout
    assert "--ntasks=2" in calls[-1] and "--ntasks-per-node=1" in calls[-1], calls[-1]
    assert seen.read_text().split() == [cpus, workers]


def test_sigterm_to_the_batch_shell_is_passed_on_but_does_not_requeue(fake_job, tmp_path):
    """scancel (or a preemption, which Slurm requeues itself) sends SIGTERM: the step gets it
    and saves, but the job script does not bring a cancelled job back."""
    marker = tmp_path / "scratch" / "alps-torch-project" / "runs" / "alps-torch-project" / "REQUEUE"
    step = (
        f'trap "echo saved > {marker}; exit 3" TERM; kill -TERM "$PPID"; '
        "for _ in $(seq 100); do sleep 0.1; done; exit 9"
    )
    proc, calls = fake_job(FAKE_STEP=step)
    assert proc.returncode == 0 and len(calls) == 1, (proc.stderr, calls)
    assert "SIGTERM reached the batch shell: passed on to the step" in proc.stdout
    assert "not requeued by this script" in proc.stdout
