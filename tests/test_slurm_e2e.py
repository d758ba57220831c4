"""End to end on a real single-node Slurm: generated job scripts submitted unchanged with sbatch.

The harness (tests/slurm/harness.py) runs slurmctld, slurmd and munged on localhost with one
node shaped like an Alps GH200 node, and a SPANK plugin (tests/slurm/alps_spank.c) that accepts
--uenv/--view/--environment and records what each job step asked for. Nothing is mounted and no
container starts: every step runs the repo's venv on this machine's python3 (CPU, gloo).

Coverage (one job per behaviour; tests/test_slurm_two_node.py adds what needs two hosts:
srun DDP preempted and resumed bit-exactly, torchrun HSDP after the doctor, resumed, a lost node):
uenv+srun runs to completion after the doctor and makes the dataset (a failing doctor stops the
job: tests/test_slurm_programs.py, whose jobs run beside one another); the Alps Extended
container+torchrun script (--mpi=pmix) is preempted (USR2 -> checkpoint
-> scontrol requeue -> resume -> COMPLETED); a 2-task uenv+srun job array is preempted and each
task resumes its own run; one rank raising an error ends the job FAILED (torchrun; srun: a failing
command of one's own in tests/test_slurm_programs.py), and so does one SIGSTOPped rank, after
dist_timeout_s.
Select with `-m slurm`, deselect with `-m "not slurm"`. Runs as root; skips (with the reason)
where Slurm cannot start, unless ALPS_SLURM_REQUIRED=1, where it fails instead.
"""

from __future__ import annotations

import json
import re
import time
import tomllib

import pytest
from slurm.jobs import (
    FAILURE_DEADLINE,
    HANG_TIMEOUT_S,
    JOB_TIMEOUT,
    PREEMPT,
    PREEMPT_STEPS,
    QUICK,
    SHIM_DIR,
    SLOWED,
    TWO_RANKS,
    check_checkpoint,
    check_environment_requests,
    check_log_path,
    check_ranks_trained,
    explained,
    slow_first_start,
    submit,
)

# one pytest-xdist worker runs this module and the two-node one (tests/conftest.py); the
# fixtures slurm, repo and dataset are tests/slurm/fixtures.py's, and what departs from
# "submit the generated script as generated" is listed in tests/slurm/jobs.py
pytestmark = [pytest.mark.slurm, pytest.mark.timeout(900)]

# ----------------------------------------------------------------------- the harness itself


def test_node_looks_like_an_alps_gh200_node(slurm):
    node = slurm.run("scontrol", "show", "node", "-o", slurm.node).stdout
    expected = (
        "CPUTot=288 Sockets=4 CoresPerSocket=72 ThreadsPerCore=1 Gres=gpu:4 Partitions=normal,debug"
    )
    for field in expected.split():
        assert field in node, node


SPANK_SCRIPT = """\
#!/bin/bash
#SBATCH --job-name=spank-check
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=4
#SBATCH --cpus-per-task=72
#SBATCH --gpus-per-node=4
#SBATCH --time=00:05:00
#SBATCH --output=%x-%j.log
#SBATCH --uenv=pytorch/v2.9.1:v1
#SBATCH --view=default
set -euo pipefail
show='echo "$0 task=${SLURM_PROCID} uenv=${ALPS_SPANK_UENV-} view=${ALPS_SPANK_VIEW-} \
edf=${ALPS_SPANK_ENVIRONMENT-}"'
bash -c "$show" batch
srun bash -c "$show" step0
srun --ntasks=1 --environment=/edf/a.toml bash -c "$show" step1
srun --ntasks=1 --uenv=other/v1:v2 --view=tools bash -c "$show" step2
"""


def test_spank_options_reach_the_steps(slurm, tmp_path):
    """#SBATCH --uenv/--view apply to the batch script and every srun; srun options override."""
    (tmp_path / "job.sbatch").write_text(SPANK_SCRIPT)
    job_id = slurm.sbatch("job.sbatch", cwd=tmp_path)
    job = slurm.wait(job_id, timeout=60)
    log = (tmp_path / f"spank-check-{job_id}.log").read_text()
    assert job.state == "COMPLETED", slurm.diagnostics(job_id)
    assert "batch task=0 uenv=pytorch/v2.9.1:v1 view=default edf=\n" in log
    for task in range(4):
        assert f"step0 task={task} uenv=pytorch/v2.9.1:v1 view=default edf=\n" in log
    assert "step1 task=0 uenv=pytorch/v2.9.1:v1 view=default edf=/edf/a.toml\n" in log
    assert "step2 task=0 uenv=other/v1:v2 view=tools edf=\n" in log
    steps = [
        (r["step"], r["uenv"], r["view"], r["environment"]) for r in slurm.spank_records(job_id)
    ]
    assert steps == [
        ("batch", "pytorch/v2.9.1:v1", "default", "-"),
        ("0", "pytorch/v2.9.1:v1", "default", "-"),
        ("1", "pytorch/v2.9.1:v1", "default", "/edf/a.toml"),
        ("2", "other/v1:v2", "tools", "-"),
    ]
    # the uenv plugin's rule: --view needs --uenv
    bad = slurm.run("sbatch", "--view=default", "--wrap=true", cwd=tmp_path, check=False)
    assert bad.returncode != 0 and "--view=default given without --uenv" in bad.stderr


# ------------------------------------------------------------ generated repos, end to end


def test_job_trains_and_completes(slurm, repo, tmp_path, dataset):
    """uenv + srun, a config file extending configs/tiny.toml to the end, on the dataset that
    file names; the default dataset is made by the first job that needs it and the doctor checks
    all ranks first. (torchrun after the doctor: the two-node module;
    the Alps Extended torchrun script to its end: the preemption test below.)"""
    target = repo("both-extended-srun", "uenv")
    # The config file names the dataset (through a link to the session's, so that its path
    # differs from the job's default) and DATASET is unset: the file's value trains, and the job
    # script's default, DATA_DIR/stdlib-bytes, is only made (once: it is the session's dataset).
    alias = tmp_path / "linked-dataset"
    alias.symlink_to(dataset, target_is_directory=True)
    config = tmp_path / "own.toml"
    config.write_text(f'extends = "{target.path}/configs/tiny.toml"\ndataset = "{alias}"\n')
    env = {"DOCTOR": "1", "DOCTOR_ARGS": "--device cpu", "CONFIG": str(config), "DATASET": None}
    env["DATA_DIR"] = str(dataset.parent)
    shape = TWO_RANKS[target.launcher]
    sub = submit(slurm, target, tmp_path, QUICK, dataset, env, shape, ranks=2)
    with explained(sub):
        job = sub.wait()
        assert job.state == "COMPLETED" and job.exit_code == (0, 0)
        text = sub.text()
        assert (dataset / "index.json").is_file()
        made = re.findall(r"^\S*\s*wrote \d+ training and \d+ validation tokens", text, re.M)
        assert len(made) <= 1 and ("making the dataset" in text) == bool(made), made
        # the doctor's report (rank 0) precedes training, and it passed
        doctor_line = f"doctor: {sub.ranks} rank(s) on 1 node(s)"
        assert doctor_line in text and "doctor: 0 FAIL" in text, text[-3000:]
        assert text.index(doctor_line) < text.index("training finished")
        assert "old spelling" not in text, "the job script calls a command the old way"
        resolved = tomllib.loads((sub.run_dir / "config.toml").read_text())
        assert resolved["dataset"] == str(alias) and resolved["gpt"]["preset"] == "tiny"
        # one origins line, each file with the keys it set (tiny.toml's, then own.toml's)
        own = rf"INFO settings from [^\n]*; {re.escape(str(config))}: [^;]*\bdataset\b"
        assert re.search(own, text)
        check_log_path(sub, job)
        check_ranks_trained(sub, max_steps=40)
        check_checkpoint(sub, 40)
        check_checkpoint(sub, 20)
        check_environment_requests(sub, steps_per_start=3 if made else 2)


# One preemption round trip each way is enough (they are the slow tests): the container
# flavour with torchrun here, the uenv flavour with srun in the job-array test below.
@pytest.mark.parametrize(
    ("name", "flavour"),
    [pytest.param("container-extended-torchrun", "container", id="container-torchrun")],
)
def test_preempted_job_checkpoints_requeues_and_resumes(
    slurm, repo, tmp_path, dataset, name, flavour
):
    """USR2 to the steps (what --signal=USR2@180 sends) -> checkpoint, exit 3, requeue, resume.
    2 ranks (4 workers of one torchrun: the two-node module's HSDP job)."""
    target = repo(name, flavour)
    shape = TWO_RANKS[target.launcher]
    sub = submit(
        slurm, target, tmp_path, PREEMPT, dataset, slow_first_start(target), shape, ranks=2
    )
    with explained(sub):
        sub.wait_for_log(r"INFO step [1-9]\d*/")  # training runs: the handlers are installed
        # without --batch/--full: only the job steps, not the batch shell, as --signal does
        slurm.run("scancel", "--signal=USR2", str(sub.job_id))
        job = sub.wait(timeout=JOB_TIMEOUT + 60)
        text = sub.text()
        assert job.state == "COMPLETED" and job.restarts == 1
        assert text.count(SLOWED) == 1, "the first start was not slowed, or the second was"

        stopped = re.findall(r"\[rank0\] \S+ WARNING stopping at step (\d+) \(([^)]*)\)", text)
        assert len(stopped) == 1, f"rank 0 must stop once: {stopped}"
        stop_step, reason = int(stopped[0][0]), stopped[0][1]
        assert re.search(r"USR2|\b12\b", reason), f"stopped for {reason!r}, not SIGUSR2"
        assert 0 < stop_step < PREEMPT_STEPS
        assert re.search(rf"\[rank0\] \S+ INFO checkpoint step {stop_step} complete", text)
        assert f"requeueing job {sub.job_id}" in text
        # torchrun ends in one line after forwarding the signal (run/torchrun.py), no traceback
        assert "torchrun: stopped by SIGUSR2, which it forwarded to the workers" in text
        assert "SignalException" not in text and "Traceback" not in text
        resumed = re.findall(r"\[rank0\] \S+ WARNING RESUMING .* from checkpoint step (\d+)", text)
        assert resumed == [str(stop_step)], "the restart resumes from the preemption checkpoint"

        check_log_path(sub, job)
        check_ranks_trained(sub, max_steps=PREEMPT_STEPS, starts=2)
        check_checkpoint(sub, PREEMPT_STEPS)
        check_environment_requests(sub, restarts=1)
        # no step lost or repeated beyond the save: training records continue after stop_step
        records = [
            json.loads(line)
            for line in (sub.run_dir / "metrics.jsonl").read_text().splitlines()
            if line.strip()
        ]
        saves = [r["step"] for r in records if r["kind"] == "checkpoint"]
        assert saves == [stop_step, PREEMPT_STEPS]
        steps = [r["step"] for r in records if r["kind"] == "train"]
        assert steps == sorted(set(steps)), f"a step was logged twice: {steps}"
        assert not (sub.run_dir / "REQUEUE").exists()


# srun: tests/test_slurm_programs.py (a failing command of one's own: srun's --kill-on-bad-exit
# ends the other rank, whole lines, not requeued); torchrun: the agent stops the others
@pytest.mark.parametrize(
    ("name", "flavour"),
    [pytest.param("container-extended-torchrun", "container", id="torchrun")],
)
def test_a_crashing_rank_fails_the_job_without_hanging(
    slurm, repo, tmp_path, dataset, name, flavour
):
    """Rank 1 raises after 5 steps (test-only sitecustomize shim): FAILED, fast, not requeued."""
    target = repo(name, flavour)
    shim = {
        "PYTHONPATH": str(SHIM_DIR),
        "ALPS_E2E_FAIL_TARGET": f"{target.package}.training.step:train_step",
        "ALPS_E2E_FAIL_RANK": "1",
        "ALPS_E2E_FAIL_AFTER": "5",
    }
    shape = TWO_RANKS[target.launcher]
    sub = submit(
        slurm, target, tmp_path, QUICK, dataset, extra_env=shim, sbatch_args=shape, ranks=2
    )
    with explained(sub):
        job = sub.wait(timeout=FAILURE_DEADLINE)
        text = sub.text()
        assert "ALPS_E2E failure shim armed: rank 1" in text, "the shim did not load"
        assert job.state == "FAILED" and job.exit_code[0] != 0
        assert job.restarts == 0, "a crash must not be requeued"
        # whole lines, labelled once (srun: task 1; torchrun: the agent's task 0); srun --unbuffered
        # cut this one into "1: R" + "1: untimeError..."
        whole = r"^ *[0-9]+: RuntimeError: ALPS_E2E injected failure: rank 1, call 6 of \S+$"
        assert re.search(whole, text, re.MULTILINE), text[-4000:]
        assert "error: training failed (exit status" in text and "Not requeued." in text
        assert "training finished" not in text
        assert not (sub.run_dir / "REQUEUE").exists()


def test_a_stopped_rank_fails_the_job_within_the_collective_timeout(slurm, repo, tmp_path, dataset):
    """Rank 1 is SIGSTOPped after 5 steps (alive but silent, as a rank hung in a driver call or a
    dead file system): the others give up after dist_timeout_s, and the job ends FAILED, not
    requeued, in about that time instead of holding the allocation until its time limit."""
    target = repo("default", "container")
    hang = {
        "PYTHONPATH": str(SHIM_DIR),
        "ALPS_E2E_FAIL_TARGET": f"{target.package}.training.step:train_step",
        "ALPS_E2E_FAIL_RANK": "1",
        "ALPS_E2E_FAIL_AFTER": "5",
        "ALPS_E2E_FAIL_ACTION": "stop",
    }
    args = [*QUICK, f"dist_timeout_s={HANG_TIMEOUT_S}", "max_steps=100000", "checkpoint_every=0"]
    shape = TWO_RANKS[target.launcher]
    sub = submit(slurm, target, tmp_path, args, dataset, extra_env=hang, sbatch_args=shape, ranks=2)
    with explained(sub):
        sub.wait_for_log(r"ALPS_E2E stopping rank 1")
        stopped_at = time.monotonic()
        job = sub.wait(timeout=FAILURE_DEADLINE)
        waited = time.monotonic() - stopped_at
        text = sub.text()
        assert job.state == "FAILED" and job.exit_code[0] != 0
        assert job.restarts == 0, "a hung rank must not be requeued"
        # the live rank names the timeout in one line (gloo: "Timed out waiting ... for recv")
        assert re.search(
            r"\[rank0\] .*ERROR a collective did not complete within dist_timeout_s", text
        ), text[-4000:]
        assert "error: training failed (exit status" in text and "Not requeued." in text
        assert "training finished" not in text and not (sub.run_dir / "REQUEUE").exists()
        print(f"stopped rank: job ended {waited:.0f} s after the SIGSTOP")


def test_array_tasks_are_runs_of_their_own_preempted_and_resumed(slurm, repo, tmp_path, dataset):
    """sbatch --array=0-1 with SWEEP=FILE: each task trains its own run (<job name>-<task>, its
    line of overrides), is preempted (USR2), requeues itself, not the array (the last task has
    the array's job id: requeueing that id would restart every task), and resumes its own run."""
    target = repo("both-extended-srun", "uenv")  # santis: runs under ${SCRATCH}, which we set
    sweep = tmp_path / "sweep.txt"
    sweep.write_text("seed=11 lr=3e-3\nseed=22 lr=1e-3\n")
    extra = {"RUN_DIR": None, "SWEEP": str(sweep)}  # the default run directory, per task
    # 2 ranks and 2 of the node's 4 GPUs a task: both tasks run at once (training uses the CPU)
    shape = ("--array=0-1", "--ntasks-per-node=2", "--gpus-per-node=2")
    extra |= slow_first_start(target)
    sub = submit(slurm, target, tmp_path, PREEMPT, dataset, extra, shape, ranks=2)
    array = sub.job_id
    tasks = {task: f"{array}_{task}" for task in (0, 1)}
    runs = tmp_path / "scratch" / target.slug / "runs"
    try:
        signalled: set[int] = set()
        deadline = time.monotonic() + 2 * JOB_TIMEOUT
        while len(signalled) < len(tasks):  # each task's first start gets USR2 once it trains
            assert time.monotonic() < deadline, "the array tasks did not start training"
            for task, ref in tasks.items():
                job = slurm.job(ref)
                log = job.stdout
                if task in signalled or job.state != "RUNNING" or not (log and log.exists()):
                    continue
                if re.search(r"INFO step [1-9]\d*/", log.read_text(errors="replace")):
                    slurm.run("scancel", "--signal=USR2", ref)
                    signalled.add(task)
            time.sleep(0.5)
        ended = {task: slurm.wait(ref, timeout=JOB_TIMEOUT + 60) for task, ref in tasks.items()}
        seeds = {}
        for task, job in ended.items():
            text = job.stdout.read_text(errors="replace")
            run_dir = runs / f"{target.slug}-{task}"
            assert job.state == "COMPLETED" and job.restarts == 1, (task, job.fields)
            assert f"requeueing job {array}_{task}" in text
            assert text.count(SLOWED) == 1, "the first start was not slowed, or the second was"
            stopped = re.findall(r"\[rank0\] \S+ WARNING stopping at step (\d+)", text)
            resuming = rf"WARNING RESUMING {re.escape(str(run_dir))} from checkpoint step (\d+)"
            resumed = re.findall(r"\[rank0\] \S+ " + resuming, text)
            assert len(stopped) == 1 and resumed == stopped, (task, stopped, resumed)
            lines = (run_dir / "metrics.jsonl").read_text().splitlines()
            records = [json.loads(line) for line in lines if line.strip()]
            saves = [r["step"] for r in records if r["kind"] == "checkpoint"]
            assert saves == [int(stopped[0]), PREEMPT_STEPS], (task, saves)
            assert (
                run_dir / "checkpoints" / f"step-{PREEMPT_STEPS:08d}" / "COMPLETE.json"
            ).is_file()
            seeds[task] = tomllib.loads((run_dir / "config.toml").read_text())["seed"]
        assert seeds == {0: 11, 1: 22}, "each task runs its own line of the sweep"
        assert sorted(p.name for p in runs.iterdir()) == [f"{target.slug}-0", f"{target.slug}-1"]
    except (AssertionError, TimeoutError) as exc:
        details = "\n".join(slurm.diagnostics(ref) for ref in tasks.values())
        raise AssertionError(f"{exc}\n\n{details}") from None
    finally:
        slurm.run("scancel", str(array), check=False)
        for ref in tasks.values():
            job_id = slurm.job(ref).fields.get("JobId", "")
            for stray in slurm.kill_strays(int(job_id)) if job_id.isdigit() else []:
                print(f"killed a process that outlived array task {ref}: {stray}")
