"""End to end on a real single-node Slurm: generated job scripts submitted unchanged with sbatch.

The harness (tests/slurm/harness.py) runs slurmctld, slurmd and munged on localhost with one
node shaped like an Alps GH200 node, and a SPANK plugin (tests/slurm/alps_spank.c) that accepts
--uenv/--view/--environment and records what each job step asked for. Nothing is mounted and no
container starts: every step runs the repo's venv on this machine's python3 (CPU, gloo).

Coverage (one job per behaviour; tests/test_slurm_two_node.py adds what needs two hosts:
srun DDP preempted and resumed bit-exactly, torchrun FSDP after the doctor, a lost node):
uenv+srun runs to completion after the doctor and makes the dataset; a failing doctor stops the
job; the Alps Extended container+torchrun script (--mpi=pmix) is preempted (USR2 -> checkpoint
-> scontrol requeue -> resume -> COMPLETED); a 2-task uenv+srun job array is preempted and each
task resumes its own run; one rank raising an error ends the job FAILED (srun and torchrun), and
so does one SIGSTOPped rank, after dist_timeout_s.
Select with `-m slurm`, deselect with `-m "not slurm"`. Runs as root; skips (with the reason)
where Slurm cannot start, unless ALPS_SLURM_REQUIRED=1, where it fails instead.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import CONFIGS, TEMPLATE_DIR, clean_env, run
from slurm.harness import (
    TERMINAL_STATES,
    HarnessUnavailable,
    Job,
    SlurmHarness,
    unavailable_reason,
)

# one pytest-xdist worker runs this module and the two-node one (tests/conftest.py)
pytestmark = [pytest.mark.slurm, pytest.mark.timeout(900)]

# ---------------------------------------------------------------------------------------------
# The ONLY departures from "submit the generated script as generated", each because it cannot
# hold on this machine. Nothing in the scripts is edited.
#
# 1. sbatch options added on the command line, per configuration. (--account and --partition
#    need none: without accounting any account is accepted, and the harness has the partitions
#    "normal" and "debug" that the configurations use.)
SBATCH_OVERRIDES: dict[str, list[str]] = {
    # The harness has one node; the configuration asks for 2. torchrun then runs 1 x 4 workers.
    "uenv-torchrun": ["--nodes=1"],
}
# 2. Submission environment (sbatch exports it to the job): the scripts default RUN_DIR and
#    DATA_DIR to Alps paths (/capstor/scratch/..., ${SCRATCH}/...) that do not exist here, so
#    they (and SCRATCH, for anything else) point to these directories in the test's tmp dir.
SUBMISSION_ENV_DIRS = {"RUN_DIR": "run", "DATA_DIR": "data", "SCRATCH": "scratch"}
#    CONFIG: the CPU-sized GPT (configs/tiny.toml: 40 steps, checkpoints at 20 and 40).
#    DATASET: one stdlib-bytes dataset for the session, made by the first job that needs it.
#    DOCTOR=0 except where a test asserts the doctor's report (it adds a few seconds a job).
#    OMP_NUM_THREADS=1: the harness's node claims 72 cores per task (--cpus-per-task=72) but
#    this machine has 2; the doctor would rightly report 72 threads per rank as oversubscribed.
SUBMISSION_ENV = {"CONFIG": "configs/tiny.toml", "DOCTOR": "0", "OMP_NUM_THREADS": "1"}
# 3. key=value training overrides after the script name (documented usage). device=cpu: the
#    ranks share this machine's CPU and gloo even where a GPU is present.
QUICK = ["device=cpu"]
# ---------------------------------------------------------------------------------------------

RANKS = 4  # --ntasks-per-node=4 (srun) or 4 torchrun workers (--gpus-per-node=4), one node
# 4. Jobs that run the doctor use 2 ranks: this machine has 2 cores, and the doctor rightly fails
#    4 ranks on them as oversubscribed. So do the failure tests (one rank fails; 2 ranks start
#    twice as fast here). srun: 2 tasks; torchrun: 2 workers (--nproc-per-node follows the GPUs
#    on the node).
TWO_RANKS = {"srun": ["--ntasks-per-node=2"], "torchrun": ["--gpus-per-node=2"]}
JOB_TIMEOUT = 300  # seconds from submission to the end of a job (about 30 s here)
FAILURE_DEADLINE = 180  # a crashed or stopped rank must end the job this fast
HANG_TIMEOUT_S = 20  # dist_timeout_s of the stopped-rank test (configs/tiny.toml: 60)
SHIM_DIR = Path(__file__).resolve().parent / "slurm" / "failure_shim"


def answer(name: str, key: str) -> str:
    defaults = json.loads((TEMPLATE_DIR / "cookiecutter.json").read_text())
    value = CONFIGS[name].get(key, defaults[key])
    return value[0] if isinstance(value, list) else value


# --------------------------------------------------------------------------------- fixtures


def started_or_skip(harness: SlurmHarness, reason: str | None) -> Iterator[SlurmHarness]:
    """Start `harness` (unless `reason` says why it cannot run) for a fixture, stop it after.
    Skip with the reason where it cannot start, or fail under ALPS_SLURM_REQUIRED=1."""
    required = os.environ.get("ALPS_SLURM_REQUIRED") == "1"
    if reason is None:
        try:
            harness.start()
        except HarnessUnavailable as exc:
            reason = str(exc)
        except BaseException:
            harness.stop()  # a partly started one is torn down
            raise
    if reason is not None:
        harness.stop()
        if required:
            pytest.fail(f"ALPS_SLURM_REQUIRED=1 but {reason}")
        pytest.skip(reason)
    try:
        yield harness
    finally:
        harness.stop()


@pytest.fixture(scope="session")
def slurm() -> Iterator[SlurmHarness]:
    """The running single-node Slurm (started once, or reused); stopped at the end."""
    yield from started_or_skip(SlurmHarness(), unavailable_reason())


@dataclass(frozen=True)
class Repo:
    name: str  # key of CONFIGS
    flavour: str  # "container" or "uenv"
    path: Path  # a private copy of the baked repo (same directory name), with .venv-<flavour>

    @property
    def slug(self) -> str:
        """The project slug: the repo's directory name and the job's --job-name."""
        return self.path.name

    @property
    def package(self) -> str:
        return next(p.parent.name for p in (self.path / "src").glob("*/__main__.py"))

    @property
    def launcher(self) -> str:
        return answer(self.name, "launcher")

    @property
    def script(self) -> str:
        return f"jobs/train_{self.flavour}.sbatch"


# The fixtures below are shared with test_slurm_two_node.py, which imports them: each module
# then has a fixture of its own, so what they make is cached here, once per test session.
_REPOS: dict[tuple[str, str], Repo] = {}
_DATASETS: list[Path] = []


@pytest.fixture(scope="session", name="repo")
def repo_fixture(bake, tmp_path_factory):
    """repo(name, flavour): a copy of the baked repo with its venv, made as the README says."""
    cache = _REPOS

    def _repo(name: str, flavour: str) -> Repo:
        if (name, flavour) not in cache:
            # a copy: the session's baked repos are compared file by file by other tests
            baked = bake(name)
            path = tmp_path_factory.mktemp(f"slurm-{name}") / baked.name
            shutil.copytree(baked, path, symlinks=True)
            run(["bash", "scripts/setup_venv.sh", flavour, "--here"], cwd=path, timeout=600)
            cache[name, flavour] = Repo(name, flavour, path)
        return cache[name, flavour]

    return _repo


@pytest.fixture(scope="session", name="dataset")
def dataset_fixture(tmp_path_factory) -> Path:
    """Where the session's jobs find (the first one makes) the default stdlib-bytes dataset."""
    if not _DATASETS:
        _DATASETS.append(tmp_path_factory.mktemp("datasets") / "stdlib-bytes")
    return _DATASETS[0]


# --------------------------------------------------------------------------------- helpers


JOB_HEADER = re.compile(r"^== job (\d+) start (\d+) on ", re.MULTILINE)  # jobs/common.sh


@dataclass
class Submission:
    slurm: SlurmHarness
    repo: Repo
    job_id: int
    work: Path
    ranks: int = RANKS

    @property
    def run_dir(self) -> Path:
        return self.work / "run"

    @property
    def log(self) -> Path:
        """Where `#SBATCH --output=logs/slurm-%x-%j.log` puts it (%x: the job name)."""
        return self.repo.path / "logs" / f"slurm-{self.repo.slug}-{self.job_id}.log"

    def text(self) -> str:
        """The job's log. Every start of a job writes a header (jobs/common.sh) naming the job;
        a header of another job means the file holds another job's lines: reported as such,
        never counted as this job's."""
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        others = sorted({int(m.group(1)) for m in JOB_HEADER.finditer(text)} - {self.job_id})
        if others:
            raise AssertionError(
                f"{self.log} holds lines of job(s) {others}, not only of job {self.job_id}: "
                "two jobs wrote one log (job ids handed out twice?)"
            )
        return text

    def wait(self, timeout: float = JOB_TIMEOUT) -> Job:
        return self.slurm.wait(self.job_id, timeout=timeout)

    def wait_for_log(self, pattern: str, timeout: float = JOB_TIMEOUT) -> re.Match:
        deadline = time.monotonic() + timeout
        while True:
            match = re.search(pattern, self.text(), re.MULTILINE)
            if match:
                return match
            job = self.slurm.job(self.job_id)
            if job.state in TERMINAL_STATES:
                raise AssertionError(f"job ended ({job.state}) before the log matched {pattern!r}")
            if time.monotonic() > deadline:
                raise AssertionError(f"no {pattern!r} in the log after {timeout:.0f}s")
            time.sleep(0.3)


def submit(
    slurm: SlurmHarness,
    repo: Repo,
    work: Path,
    args: list[str],
    dataset: Path,
    extra_env: dict[str, str | None] | None = None,
    sbatch_args: tuple[str, ...] = (),
    ranks: int = RANKS,
    single_node: bool = True,
) -> Submission:
    """sbatch the generated script from the repository root, as the README says.
    `single_node`: add the configuration's SBATCH_OVERRIDES (the harness has one node)."""
    dirs = {key: str(work / sub) for key, sub in SUBMISSION_ENV_DIRS.items()}
    env = clean_env() | dirs | SUBMISSION_ENV | {"DATASET": str(dataset)} | (extra_env or {})
    env = {key: value for key, value in env.items() if value is not None}  # None: unset it
    options = [*(SBATCH_OVERRIDES.get(repo.name, []) if single_node else []), *sbatch_args]
    job_id = slurm.sbatch(*options, repo.script, *args, cwd=repo.path, env=env)
    first, last = slurm.JOB_IDS
    assert first <= job_id <= last, f"job {job_id} is outside its cluster's ids {first}-{last}"
    return Submission(slurm, repo, job_id, work, ranks)


@contextmanager
def explained(sub: Submission) -> Iterator[None]:
    """On a failed assertion or a timeout, append the job record, its log and the daemon logs;
    always kill processes that outlived the job (see SlurmHarness.kill_strays)."""
    try:
        yield
    except (AssertionError, TimeoutError) as exc:
        raise AssertionError(f"{exc}\n\n{sub.slurm.diagnostics(sub.job_id)}") from None
    finally:
        job = sub.slurm.job(sub.job_id)
        if job.state in {"PENDING", "RUNNING", "REQUEUED", "COMPLETING", "SUSPENDED"}:
            sub.slurm.run("scancel", str(sub.job_id), check=False)
            try:
                sub.slurm.wait(sub.job_id, timeout=60)
            except TimeoutError:
                pass
        for stray in sub.slurm.kill_strays(sub.job_id):
            print(f"killed a process that outlived job {sub.job_id}: {stray}")


START_LINE = re.compile(
    r"\[rank(\d+)\] \S+ INFO host=\S+ rank=(\d+) local_rank=(\d+) world=(\d+) .*launcher=(\w+)"
)


def check_ranks_trained(sub: Submission, max_steps: int, starts: int = 1) -> None:
    """sub.ranks processes joined one process group `starts` times and training reached the end."""
    text, ranks = sub.text(), sub.ranks
    found = START_LINE.findall(text)
    expected_launcher = "env" if sub.repo.launcher == "torchrun" else "srun"
    assert len(found) == ranks * starts, f"start-up lines: {found}"
    assert sorted(int(r[1]) for r in found) == sorted(list(range(ranks)) * starts)
    assert {(r[3], r[4]) for r in found} == {(str(ranks), expected_launcher)}
    assert f"training finished at step {max_steps}" in text
    # metrics are all-reduced over the process group: throughput / throughput per rank = world
    records = [
        json.loads(line)
        for line in (sub.run_dir / "metrics.jsonl").read_text().split("\n")
        if line.strip()
    ]
    train = [r for r in records if r["kind"] == "train"]
    assert train and train[-1]["step"] == max_steps
    assert {round(r["tokens_per_s"] / r["tokens_per_s_per_rank"]) for r in train} == {ranks}


def check_checkpoint(sub: Submission, step: int) -> None:
    """A complete DCP checkpoint of `step` written by all ranks (one shard file each)."""
    path = sub.run_dir / "checkpoints" / f"step-{step:08d}"
    marker = path / "COMPLETE.json"
    assert marker.is_file(), sorted(str(p.relative_to(sub.run_dir)) for p in sub.run_dir.rglob("*"))
    record = json.loads(marker.read_text())
    assert record["step"] == step and record["world_size"] == sub.ranks
    assert len(list(path.glob("*.distcp"))) == sub.ranks


def check_log_path(sub: Submission, job: Job) -> None:
    assert sub.log.is_file(), f"no log at {sub.log}; logs/: {os.listdir(sub.repo.path / 'logs')}"
    assert job.stdout == sub.log


def check_environment_requests(
    sub: Submission, restarts: int = 0, steps_per_start: int | None = None
) -> None:
    """The uenv/EDF each step asked for (SPANK records) is the one the repo configured.

    Each start runs the batch step, then its srun steps 0, 1, ... (make-dataset when the dataset
    is missing, the doctor unless DOCTOR=0, training); `steps_per_start` checks the first start.
    """
    records = sub.slurm.spank_records(sub.job_id)
    # a step on several nodes has a record from each node: keep the first
    seen: set[tuple[str, str]] = set()
    for record in list(records):
        key = (record["step"], record["restart"])
        if record["step"] != "batch" and key in seen:
            records.remove(record)
        seen.add(key)
    starts: list[list[dict[str, str]]] = []
    for record in records:
        if record["step"] == "batch":
            starts.append([])
        else:
            assert starts, records
            starts[-1].append(record)
    assert len(starts) == restarts + 1, records
    for restart, steps in enumerate(starts):
        assert [r["step"] for r in steps] == [str(n) for n in range(len(steps))], records
        assert {r["restart"] for r in steps} == {str(restart)}, records
    assert steps_per_start is None or len(starts[0]) == steps_per_start, records
    for record in records:
        if sub.repo.flavour == "uenv":
            # #SBATCH --uenv/--view apply to the batch step and to every srun step
            expected = (answer(sub.repo.name, "__uenv_image"), "default", "-")
        elif record["step"] == "batch":
            # --environment on srun only: the batch script itself runs on the host
            expected = ("-", "-", "-")
        else:
            expected = ("-", "-", str(sub.repo.path / "container" / "edf.toml"))
        assert (record["uenv"], record["view"], record["environment"]) == expected, record


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
        assert re.search(rf"INFO settings from {re.escape(str(config))}: [^;]*\bdataset\b", text)
        check_log_path(sub, job)
        check_ranks_trained(sub, max_steps=40)
        check_checkpoint(sub, 40)
        check_checkpoint(sub, 20)
        check_environment_requests(sub, steps_per_start=3 if made else 2)


def test_a_failing_doctor_stops_the_job(slurm, repo, tmp_path, dataset):
    """A FAIL from the doctor (here: a data directory that is a file; DOCTOR_ARGS come last and
    win) ends the job before training, FAILED, with the reason and the way out in the log."""
    target = repo("both-extended-srun", "uenv")
    not_a_dir = tmp_path / "not-a-directory"
    not_a_dir.write_text("")
    doctor = {"DOCTOR": "1", "DOCTOR_ARGS": f"--device cpu data_dir={not_a_dir}"}
    shape = TWO_RANKS[target.launcher]
    sub = submit(slurm, target, tmp_path, QUICK, dataset, doctor, shape, ranks=2)
    with explained(sub):
        job = sub.wait()
        text = sub.text()
        assert job.state == "FAILED" and job.exit_code[0] == 1
        assert "FAIL  cpu" not in text, "only the data directory may fail"
        assert re.search(r"FAIL +data_dir .*not-a-directory", text), text[-3000:]
        assert "error: the doctor found a problem" in text and "DOCTOR=0" in text
        assert "starting a new run" not in text and "training finished" not in text
        assert "old spelling" not in text


# 20-70 ms a step here: the signal, sent once step 10 is logged, must land before the end even
# on an idle machine (scancel reaches the ranks in about a second)
PREEMPT_STEPS = 300
PREEMPT = [*QUICK, f"max_steps={PREEMPT_STEPS}", "checkpoint_every=0"]


# One preemption round trip each way is enough (they are the slow tests): the container
# flavour with torchrun here, the uenv flavour with srun in the job-array test below.
@pytest.mark.parametrize(
    ("name", "flavour"),
    [pytest.param("container-extended-torchrun", "container", id="container-torchrun")],
)
def test_preempted_job_checkpoints_requeues_and_resumes(
    slurm, repo, tmp_path, dataset, name, flavour
):
    """USR2 to the steps (what --signal=USR2@180 sends) -> checkpoint, exit 3, requeue, resume."""
    sub = submit(slurm, repo(name, flavour), tmp_path, PREEMPT, dataset)
    with explained(sub):
        sub.wait_for_log(r"INFO step [1-9]\d*/")  # training runs: the handlers are installed
        # without --batch/--full: only the job steps, not the batch shell, as --signal does
        slurm.run("scancel", "--signal=USR2", str(sub.job_id))
        job = sub.wait(timeout=JOB_TIMEOUT + 60)
        text = sub.text()
        assert job.state == "COMPLETED" and job.restarts == 1

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


@pytest.mark.parametrize(
    ("name", "flavour"),
    [
        # srun: the other ranks see the closed connection; torchrun: the agent stops the others
        pytest.param("default", "container", id="srun"),
        pytest.param("container-extended-torchrun", "container", id="torchrun"),
    ],
)
def test_a_crashing_rank_fails_the_job_without_hanging(
    slurm, repo, tmp_path, dataset, name, flavour
):
    """Rank 1 raises after 5 steps (test-only sitecustomize shim): FAILED, fast, not requeued."""
    target = repo(name, flavour)
    shim = {
        "PYTHONPATH": str(SHIM_DIR),
        "ALPS_E2E_FAIL_TARGET": f"{target.package}.train:train_step",
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
        "ALPS_E2E_FAIL_TARGET": f"{target.package}.train:train_step",
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
