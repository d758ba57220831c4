"""What the real-Slurm tests share: how a generated job script is submitted (with the only
departures from "as generated" this machine needs), the submitted job, and the checks of its log,
checkpoints and job steps. The fixtures that start the clusters and copy the repos are in
fixtures.py (beside this file); the tests are tests/test_slurm_e2e.py (one node) and
tests/test_slurm_two_node.py (two nodes)."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from conftest import answers, clean_env
from slurm.harness import TERMINAL_STATES, Job, SlurmHarness

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
SHIM_DIR = Path(__file__).resolve().parent / "failure_shim"
# 5. A job that a test preempts: 20-70 ms a step here, and the signal, sent once step 10 is
#    logged, reaches the ranks in about a second (60 steps at full speed, 1.6 s, once ended
#    first). So its first start sleeps FIRST_START_STEP_DELAY_S before each step (the failure
#    shim's slow action: nothing computed changes), and the restart, with nothing to race, trains
#    at full speed. 300 full-speed steps instead cost these jobs most of their CPU.
PREEMPT_STEPS = 60
PREEMPT = [*QUICK, f"max_steps={PREEMPT_STEPS}", "checkpoint_every=0"]
FIRST_START_STEP_DELAY_S = 0.25


SLOWED = "ALPS_E2E slow first start: rank 0 sleeps"  # the shim's line: it was armed


def slow_first_start(repo: Repo) -> dict[str, str]:
    """The submission environment (5.) of a job that a test preempts (its log then holds SLOWED
    once, from its first start)."""
    return {
        "PYTHONPATH": str(SHIM_DIR),
        "ALPS_E2E_SLOW_TARGET": f"{repo.package}.training.step:train_step",
        "ALPS_E2E_SLOW_S": str(FIRST_START_STEP_DELAY_S),
    }


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
        return answers(self.name)["launcher"]

    @property
    def script(self) -> str:
        return f"jobs/train_{self.flavour}.sbatch"


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


# ------------------------------------------------ docs/your-program.md: its files and commands

PROGRAM_PAGE = "docs/your-program.md"
# Each command line of the page, by a word only it holds, and the test that runs it (the docs
# test holds the page to these: every line is one of them)
PAGE_COMMANDS = {
    "hello_ddp.py": "tests/test_slurm_programs.py (1 node), tests/test_slurm_two_node.py",
    "train_images.py": "tests/test_slurm_programs.py",
    "cu_emt.py": "tests/test_slurm_programs.py",
    "mtt train": "tests/test_slurm_programs.py",
    "scripts/setup_venv.sh": "tests/test_bake_scripts.py",
}


def page_files(root: Path) -> dict[str, str]:
    """The files the page asks to save (`<!-- file: NAME -->` before a code block): name -> text."""
    text = (root / PROGRAM_PAGE).read_text()
    found = re.findall(r"<!-- file: (\S+) -->\n```\w*\n(.*?)```", text, re.DOTALL)
    return dict(found)


def page_commands(root: Path) -> list[str]:
    """Every line of the page's ```bash blocks (a line ending in \\ joined with the next)."""
    text = (root / PROGRAM_PAGE).read_text()
    blocks = re.findall(r"```bash\n(.*?)```", text, re.DOTALL)
    return [line for block in blocks for line in block.replace("\\\n", " ").splitlines()]


def page_command(repo: Repo, word: str) -> str:
    """The page's one command line holding `word` (a key of PAGE_COMMANDS)."""
    assert word in PAGE_COMMANDS, word
    (line,) = [line for line in page_commands(repo.path) if word in line]
    return line


def save_page_files(repo: Repo) -> None:
    """Save the page's files in the repository root, as the page says (the repo copies are the
    session's: a file already there is the same)."""
    for name, text in page_files(repo.path).items():
        (repo.path / name).write_text(text)


def submit_line(
    slurm: SlurmHarness,
    repo: Repo,
    work: Path,
    line: str,
    extra_env: dict[str, str | None] | None = None,
    sbatch_args: tuple[str, ...] = (),
    ranks: int = RANKS,
) -> Submission:
    """Run a command line of the page with bash in the repository root, as a user types it; its
    `sbatch` is the cluster's, with `sbatch_args` put just before the job script so that they
    win over the line's own options (the shape this machine can run), and the submission
    environment of `submit` (no DATASET: the package's dataset plays no part). The page of a
    repository with both flavours names the container's job script: `repo.script` runs."""
    line = re.sub(r"jobs/train_\w+\.sbatch", repo.script, line)
    dirs = {key: str(work / sub) for key, sub in SUBMISSION_ENV_DIRS.items()}
    env = clean_env() | dirs | SUBMISSION_ENV | (extra_env or {})
    env = {key: value for key, value in env.items() if value is not None}
    wrapper = work / "bin" / "sbatch"
    wrapper.parent.mkdir(parents=True, exist_ok=True)
    options = " ".join(shlex.quote(option) for option in sbatch_args)
    wrapper.write_text(
        '#!/bin/bash\nargs=()\nplaced=0\nfor arg in "$@"; do\n'
        f'    [[ $placed == 0 && "$arg" == jobs/*.sbatch ]] && args+=({options}) && placed=1\n'
        '    args+=("$arg")\ndone\n'
        f'exec {shutil.which("sbatch")} --parsable "${{args[@]}}"\n'
    )
    wrapper.chmod(0o755)
    env["PATH"] = f"{wrapper.parent}:{env['PATH']}"
    proc = slurm.run("bash", "-c", line, cwd=repo.path, env=env)
    job_id = int(proc.stdout.strip().split(";")[0])
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
            expected = (answers(sub.repo.name)["__uenv_image"], "default", "-")
        elif record["step"] == "batch":
            # --environment on srun only: the batch script itself runs on the host
            expected = ("-", "-", "-")
        else:
            expected = ("-", "-", str(sub.repo.path / "container" / "edf.toml"))
        assert (record["uenv"], record["view"], record["environment"]) == expected, record
