"""Your own program under the generated job scripts on the real single-node Slurm: the command
lines of docs/your-program.md, run as a user types them (`sbatch jobs/train_<flavour>.sbatch --
COMMAND ...`), with the page's own files (tests/slurm/jobs.py: page_files, submit_line).

The jobs run at the same time (one module fixture submits them all, sends each its USR2 when its
log says it is training, and waits for every one), and each test reads what one of them shows:
- hello_ddp.py, the page's DDP check (env:// init, an all-reduce, one file per rank), in its run
  directory (IN_RUN_DIR=1, as the page writes it), with the srun launcher (uenv flavour of the
  `program` bake, which has no training package: the doctor first) and torchrun (uenv flavour, a
  CPU allocation of 2 tasks: 2 workers), 1 node x 2;
- train_images.py, the page's DDP trainer that handles the signal (saves, exit 3): stopped,
  requeued and resumed, with srun (the `program` bake's uenv flavour, USR2 to the job step) and
  with torchrun
  (container flavour, USR2 to the batch shell: `scancel --batch`, as `--signal=B:USR2@T` sends it);
- metatrain's `mtt train` on one task, which knows nothing of the signal (killed by it; USR2 to
  the batch shell), with the page's ASE dataset: requeued, `--restart auto` appended from
  RESUME_ARGS, finished;
- a failing command (not requeued; rank 1's own status), a command that is not there (one line,
  exit 127, before the doctor) and a failing doctor (the command never starts);
- a command that exits 3 on every start (requeued MAX_REQUEUES=1 times, then failed) and a run
  cancelled and submitted again with the same line (RESUME_ARGS appended: it started before).
The two-node versions of hello_ddp.py are in tests/test_slurm_two_node.py.
"""

from __future__ import annotations

import os
import re
import signal
import string
import sys
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import clean_env, run
from PIL import Image
from slurm import jobs
from slurm.harness import TERMINAL_STATES

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(900)]

# The shapes this machine runs all jobs at once in (the node: 288 CPUs, 4 GPUs): few CPUs each,
# no GPU where none is needed (torchrun starts one worker per GPU of the node: 2 GPUs).
SRUN_TWO = ("--nodes=1", "--ntasks-per-node=2", "--cpus-per-task=8", "--gpus-per-node=0")
TORCHRUN_TWO = ("--nodes=1", "--cpus-per-task=16", "--gpus-per-node=2")
ONE_TASK = ("--nodes=1", "--ntasks-per-node=1", "--cpus-per-task=8", "--gpus-per-node=0")
EPOCHS = 10  # what the page's train_images.py line asks for
FAILURE = " ".join(["rank 1 fails on purpose, with a line long enough to be cut by srun -u"] * 2)
IMAGES_PER_CLASS = 64  # 2 steps of 32 per rank and epoch


@dataclass
class Job:
    sub: jobs.Submission
    signal_when: str | None = None  # a line of the log after which it gets USR2 (once) ...
    delay_s: float = 0.0  # ... this long after the line was seen
    ready: Callable[[], bool] | None = None  # ... and once this holds
    release: Callable[[], None] | None = None  # called once the signal is sent
    batch: bool = False  # USR2 to the batch shell (scancel --batch), not to the job step
    cancel: bool = False  # scancel the job instead of the signal
    again: Callable[[], Job] | None = None  # once it has ended: the job submitted after it
    seen_at: float | None = None
    signalled: bool = False


def expand(text: str, work: Path) -> str:
    """A path of the page as the submission shell expands it (SCRATCH: the test's)."""
    return string.Template(text).substitute(SCRATCH=str(work / "scratch"), USER="u")


def write_images(folder: Path) -> None:
    """A tiny ImageFolder: dark and bright noise, two classes."""
    rng = np.random.default_rng(0)
    for label, (low, high) in enumerate([(0, 100), (150, 256)]):
        (folder / f"class{label}").mkdir(parents=True, exist_ok=True)
        for i in range(IMAGES_PER_CLASS):
            pixels = rng.integers(low, high, (16, 16, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(folder / f"class{label}" / f"{i}.png")


def metatrain_pids() -> list[int]:
    """The processes running `mtt train` (the job's command: `python .../bin/mtt train ...`; not
    run/program.py, `python -m ... -- mtt train ...`, which starts it)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:  # not a process, or gone
            continue
        if any(a.endswith(b"mtt") for a in argv[:2]) and b"train" in argv:
            found.append(int(entry.name))
    return [pid for pid in found if parent(pid) not in found]  # not its loader workers


def parent(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


class Frozen:
    """metatrain stopped (SIGSTOP) between two checkpoint writes: `ready()` freezes it and holds
    it frozen once its newest checkpoint, of epoch >= `epoch`, is whole (torch.save's zip
    archive ends with its directory); `release()`, after the job's USR2 is pending in it,
    lets it go on to die of that signal. Frozen, it cannot begin the next write while the signal
    travels (a fixed delay after an epoch line cut a checkpoint on a loaded machine, and on an
    idle one the next epoch's write had begun before the check)."""

    def __init__(self, outputs: Path, epoch: int):
        self.outputs, self.epoch, self.pid = outputs, epoch, None

    def ready(self) -> bool:
        pids = metatrain_pids()
        if len(pids) != 1:
            return False
        os.kill(pids[0], signal.SIGSTOP)
        written = sorted(
            self.outputs.glob("*/*/model_*.ckpt"), key=lambda p: int(p.stem.split("_")[1])
        )
        if written and int(written[-1].stem.split("_")[1]) >= self.epoch and whole(written[-1]):
            self.pid = pids[0]
            return True
        os.kill(pids[0], signal.SIGCONT)
        return False

    def release(self) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not usr2_pending(self.pid):
            time.sleep(0.05)
        os.kill(self.pid, signal.SIGCONT)


def whole(checkpoint: Path) -> bool:
    try:
        with zipfile.ZipFile(checkpoint) as archive:
            return archive.testzip() is None
    except (OSError, zipfile.BadZipFile):  # still being written
        return False


def usr2_pending(pid: int) -> bool:
    """Whether SIGUSR2 waits in the process (/proc's ShdPnd mask: bit n - 1 for signal n)."""
    status = Path(f"/proc/{pid}/status").read_text()
    pending = int(re.search(r"^ShdPnd:\s+([0-9a-f]+)", status, re.M).group(1), 16)
    return bool(pending >> (signal.SIGUSR2 - 1) & 1)


def drive(slurm, started: dict[str, Job], timeout: float) -> None:
    """Send each job its USR2 when its log shows the line, until all have ended."""
    deadline = time.monotonic() + timeout
    while True:
        running = False
        for name, job in list(started.items()):
            state = slurm.job(job.sub.job_id).state
            running |= state not in TERMINAL_STATES
            if job.again is not None and state in TERMINAL_STATES:
                started[f"{name}-again"], job.again = job.again(), None
                running = True
            due = job.signal_when and not job.signalled and state == "RUNNING"
            if due and job.seen_at is None:
                if re.search(job.signal_when, job.sub.text(), re.MULTILINE):
                    job.seen_at = time.monotonic()
            waited = job.seen_at is not None and time.monotonic() >= job.seen_at + job.delay_s
            if due and waited and (job.ready is None or job.ready()):
                how = ["--batch", "--signal=USR2"] if job.batch else ["--signal=USR2"]
                slurm.run("scancel", *([] if job.cancel else how), str(job.sub.job_id))
                job.signalled = True
                if job.release is not None:
                    job.release()
        if not running:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"jobs still running after {timeout:.0f} s")
        time.sleep(0.5)


@pytest.fixture(scope="module")
def ran(slurm, repo, tmp_path_factory) -> dict[str, Job]:
    """Every job of this module, submitted at once and run to its end."""
    # the uenv jobs run in the `program` bake: the environment, job scripts, doctor and run/ alone
    container, uenv = repo("default", "container"), repo("program", "uenv")
    torchrun_uenv = repo("uenv-torchrun", "uenv")
    torchrun_container = repo("container-extended-torchrun", "container")
    for target in (container, uenv, torchrun_uenv, torchrun_container):
        jobs.save_page_files(target)
    work = tmp_path_factory.mktemp("programs")

    def submit(name, target, line, shape, ranks=2, signal_when=None, delay_s=0.0, **env):
        sub = jobs.submit_line(slurm, target, work / name, line, env, shape, ranks)
        return Job(sub, signal_when, delay_s)

    hello = jobs.page_command(uenv, "hello_ddp.py")
    images = jobs.page_command(container, "train_images.py")
    folder = re.search(r'"([^"]*my-images)"', images).group(1)
    for name in ("images-srun", "images-torchrun"):
        write_images(Path(expand(folder, work / name)))
    saved = r"^\S+ epoch \d+ step \d+: loss .*, saved$"
    started = {
        "hello-srun": submit(
            "hello-srun", uenv, hello, SRUN_TWO, DOCTOR="1", DOCTOR_ARGS="--device cpu"
        ),
        "hello-torchrun": submit(  # no GPUs: torchrun starts one worker per task asked for
            "hello-torchrun", torchrun_uenv, hello, SRUN_TWO, OMP_NUM_THREADS=None
        ),
        "images-srun": submit("images-srun", uenv, images, SRUN_TWO, signal_when=saved),
        "images-torchrun": submit(
            "images-torchrun", torchrun_container, images, TORCHRUN_TWO, signal_when=saved
        ),
    }
    started["images-torchrun"].batch = True
    # metatrain: the page's dataset job, and its training job on the same file, written here
    # (the same script, run by this process: the training need not wait for the dataset job)
    data = submit("cu-data", container, jobs.page_command(container, "cu_emt.py"), ONE_TASK, 1)
    made_here = work / "metatrain" / "data"
    made_here.mkdir(parents=True)
    env = clean_env() | {"DATA_DIR": str(made_here)}
    run([sys.executable, "cu_emt.py"], cwd=container.path, env=env)
    mtt = jobs.page_command(container, "mtt train")
    # metatrain writes each epoch's checkpoint in place: the signal reaches it frozen between two
    # writes, after epoch 2's (one cut in the middle of a write would be what --restart auto
    # takes and fails on: docs/your-program.md says so)
    epoch = r"^\S+ \[[^]]+\]\[INFO\] - Epoch:\s+2 "
    mtt_job = submit("metatrain", container, mtt, ONE_TASK, 1, epoch)
    frozen = Frozen(mtt_job.sub.run_dir / "outputs", 2)
    mtt_job.ready, mtt_job.release, mtt_job.batch = frozen.ready, frozen.release, True
    started |= {"cu-data": data, "mtt": mtt_job}
    failing = "sbatch jobs/train_container.sbatch -- python -c " + repr(
        "import os, sys, time; time.sleep(60) if os.environ['RANK'] == '0' else "
        f"(print('RuntimeError: {FAILURE}', file=sys.stderr), sys.exit(5))"
    )
    not_a_dir = work / "not-a-directory"
    not_a_dir.write_text("")
    bad_doctor = {"DOCTOR": "1", "DOCTOR_ARGS": f"--device cpu data_dir={not_a_dir}"}
    started |= {
        "failing": submit("failing", container, failing, SRUN_TWO),
        "not-found": submit(
            "not-found",
            container,
            "sbatch jobs/train_container.sbatch -- no-such-tool x",
            SRUN_TWO,
            DOCTOR="1",
            DOCTOR_ARGS="--device cpu",
        ),
        "asks-again": submit(
            "asks-again",
            uenv,
            "sbatch jobs/train_uenv.sbatch -- python -c 'import sys; sys.exit(3)'",
            ONE_TASK,
            1,
            MAX_REQUEUES="1",
        ),
        "failing-doctor": submit("failing-doctor", container, hello, ONE_TASK, 1, **bad_doctor),
    }
    # a run cancelled while its command runs, then the same line submitted again: it resumes
    again_line = "sbatch jobs/train_uenv.sbatch -- python -c " + repr(
        "import sys, time; print('arguments:', *sys.argv[1:], flush=True); "
        "'--resumed' in sys.argv or time.sleep(300)"
    )
    resubmitted = {"RESUME_ARGS": "--resumed"}

    def cancelled() -> Job:
        job = submit("cancelled", uenv, again_line, ONE_TASK, 1, "^0: arguments:", **resubmitted)
        job.cancel = True
        job.again = lambda: submit("cancelled", uenv, again_line, ONE_TASK, 1, **resubmitted)
        return job

    started["cancelled"] = cancelled()
    try:
        drive(slurm, started, timeout=jobs.JOB_TIMEOUT * 2)
    except (AssertionError, TimeoutError) as exc:
        details = "\n".join(slurm.diagnostics(job.sub.job_id) for job in started.values())
        raise AssertionError(f"{exc}\n\n{details}") from None
    finally:
        for job in started.values():
            slurm.run("scancel", str(job.sub.job_id), check=False)
            for stray in slurm.kill_strays(job.sub.job_id):
                print(f"killed a process that outlived job {job.sub.job_id}: {stray}")
    return started


def ended(job: Job) -> tuple[object, str]:
    """The job's record and its log (each start's lines)."""
    return job.sub.slurm.job(job.sub.job_id), job.sub.text()


def check_hello(job: Job, threads: str) -> None:
    """Two ranks on the node joined one process group; each wrote what it was given."""
    record, text = ended(job)
    port = str(15000 + job.sub.job_id % 15000)
    assert record.state == "COMPLETED" and record.restarts == 0, text[-3000:]
    files = sorted((job.sub.run_dir / "hello").glob("rank-*.txt"))
    assert [f.name for f in files] == ["rank-0.txt", "rank-1.txt"], text[-3000:]
    for rank, path in enumerate(files):
        seen = dict(item.split("=", 1) for item in path.read_text().split())
        assert (seen["RANK"], seen["LOCAL_RANK"], seen["sum"]) == (str(rank), str(rank), "1")
        assert (seen["WORLD_SIZE"], seen["LOCAL_WORLD_SIZE"]) == ("2", "2")
        assert (seen["MASTER_ADDR"], seen["MASTER_PORT"]) == (job.sub.slurm.node, port)
        assert seen["OMP_NUM_THREADS"] == threads
    assert len(re.findall(r"rank \d of 2 on \S+: sum of the ranks 1$", text, re.M)) == 2
    assert not (job.sub.run_dir / "LOCK").exists() and not (job.sub.run_dir / "REQUEUE").exists()
    assert "Traceback" not in text


def test_hello_ddp_with_srun_after_the_doctor(ran):
    job = ran["hello-srun"]
    check_hello(job, threads="1")  # the submission's OMP_NUM_THREADS
    text = job.sub.text()
    assert "doctor: 2 rank(s) on 1 node(s)" in text and "doctor: 0 FAIL" in text, text[-3000:]
    assert text.index("doctor: 0 FAIL") < text.index("your command: hello_ddp.py")
    # the check that the command is there, the doctor, the command
    jobs.check_environment_requests(job.sub, steps_per_start=3)


def test_hello_ddp_with_torchrun_on_cpus(ran):
    """2 tasks of 8 CPUs, no GPU: one torchrun on the node starts 2 workers (not 4), 8 threads
    each (OMP_NUM_THREADS unset: the 2 tasks' 16 CPUs for 2 workers)."""
    check_hello(ran["hello-torchrun"], threads="8")
    text = ran["hello-torchrun"].sub.text()
    assert "torchrun: 2 worker(s) per node, one per task asked for (no GPUs)" in text


@pytest.mark.parametrize("name", ["images-srun", "images-torchrun"])
def test_a_trainer_that_handles_the_signal_saves_is_requeued_and_resumes(ran, name):
    """USR2 on the first start (srun: to the job step; torchrun: to the batch shell, which
    passes it on): the ranks stop at one step, rank 0 saves, exit 3 (under torchrun,
    torchrun's own stop after passing the signal on); the job requeues itself, the second
    start resumes from that step and trains to the last epoch."""
    job = ran[name]
    record, text = ended(job)
    assert record.state == "COMPLETED" and record.restarts == 1, text[-4000:]
    first, second = text.split("== job", 2)[1:]
    how = "exited 3 (asks to be requeued)" if name.endswith("srun") else "ended by SIGUSR2"
    line = f"train_images.py {how}; signals received: SIGUSR2"
    assert line in first, first[-3000:]
    assert f"your command {line}: requeueing job {job.sub.job_id} (requeue 1 of at most" in first
    batch = "SIGUSR2 reached the batch shell: passed on to the step"
    assert (batch in first) == name.endswith("torchrun"), first[-3000:]
    stop = re.findall(r"epoch (\d+) step (\d+): loss [\d.]+, saved$", first, re.M)[-1]
    resumed = re.findall(r"rank (\d): resuming at epoch (\d+) step (\d+)$", second, re.M)
    at = (int(stop[0]), int(stop[1]))
    at = (at[0] + 1, 0) if at[1] == 2 * IMAGES_PER_CLASS // 2 // 32 else at  # an epoch's end
    assert sorted(resumed) == [("0", *map(str, at)), ("1", *map(str, at))], second[-3000:]
    state = torch.load(job.sub.run_dir / "checkpoint.pt", weights_only=True)
    assert state["at"] == {"epoch": EPOCHS, "step": 0}
    assert not (job.sub.run_dir / "REQUEUE").exists()


def test_metatrain_killed_by_the_signal_restarts_with_resume_args(ran):
    """`mtt train` (pinned in requirements-dev.txt) on the page's ASE dataset: killed by USR2
    after its checkpoint of epoch 2, the job requeues itself, and the second start appends
    RESUME_ARGS, `--restart auto`: metatrain goes on from its newest checkpoint to the end."""
    data, job = ran["cu-data"], ran["mtt"]
    record, text = ended(data)
    assert record.state == "COMPLETED", text[-3000:]
    assert "wrote 20 cells to" in text
    written = data.sub.work / "data" / "cu-emt.xyz"  # the job's DATA_DIR
    assert written.read_bytes() == (job.sub.work / "data" / "cu-emt.xyz").read_bytes()
    record, text = ended(job)
    assert record.state == "COMPLETED" and record.restarts == 1, text[-5000:]
    first, second = text.split("== job", 2)[1:]
    assert "SIGUSR2 reached the batch shell: passed on to the step" in first, first[-3000:]
    assert "mtt ended by SIGUSR2; signals received: SIGUSR2" in first, first[-3000:]
    assert f"it runs in {job.sub.run_dir} (IN_RUN_DIR=1)" in first  # the page's line
    assert not (job.sub.repo.path / "outputs").exists(), "metatrain wrote into the git tree"
    assert "--restart" not in first.split("your command:", 1)[1].splitlines()[0]
    assert "RESUME_ARGS appended: --restart auto" in second
    restart = re.search(r"Restarting training from '(\S+/model_(\d+)\.ckpt)'", second)
    assert restart and int(restart.group(2)) >= 2, second[-3000:]
    assert (job.sub.run_dir / restart.group(1)).is_file()  # its own run directory's
    assert (job.sub.run_dir / "model.pt").is_file()


def test_a_failing_command_is_not_requeued(ran):
    """Rank 1 exits 5: srun ends rank 0 at once (--kill-on-bad-exit: SIGTERM), the job FAILED
    with rank 1's own status, 5 (not srun's highest); the terminated rank 0 is not taken for
    one the time limit's warning stopped. Rank 1's last line is whole, labelled once (srun
    --unbuffered cut such lines in two)."""
    record, text = ended(ran["failing"])
    assert record.state == "FAILED" and record.restarts == 0, text[-3000:]
    assert record.exit_code[0] == 5, text[-3000:]
    assert f"\n1: RuntimeError: {FAILURE}\n" in text, text[-3000:]
    assert record.fields["RunTime"] < "00:00:50", "rank 0 waited for its 60 s"
    assert "srun: error: vm: task 1: Exited with exit code 5" in text.replace(
        ran["failing"].sub.slurm.node, "vm"
    )
    assert "error: your command failed on task 1 (exit status 5; its lines above" in text
    assert "Not requeued." in text and "requeueing" not in text
    assert not (ran["failing"].sub.run_dir / "REQUEUE").exists()


def test_a_command_that_is_not_there_is_one_line_before_the_doctor(ran):
    record, text = ended(ran["not-found"])
    assert record.state == "FAILED" and record.exit_code[0] == 127, text[-3000:]
    lines = [line for line in text.splitlines() if "no-such-tool" in line and "error:" in line]
    assert len(lines) == 1 and "command not found in" in lines[0], text[-3000:]
    assert record.restarts == 0 and "requeueing" not in text
    assert "doctor:" not in text, "the doctor ran before the check"


def test_exit_3_on_every_start_stops_at_max_requeues(ran):
    """Exit 3 ("asks to be requeued") with MAX_REQUEUES=1: requeued once, then FAILED with
    one line naming the limit."""
    record, text = ended(ran["asks-again"])
    assert record.state == "FAILED" and record.restarts == 1, text[-3000:]
    first, second = text.split("== job", 2)[1:]
    assert "python exited 3 (asks to be requeued); signals received: none" in first, first
    assert "requeueing job" in first and "requeueing" not in second, text
    assert "not requeued: job" in second and "MAX_REQUEUES=1" in second, second


def test_a_cancelled_run_submitted_again_resumes(ran):
    """The same line submitted again after a cancel: the run directory shows the run started
    before, so RESUME_ARGS is appended (the first start had none)."""
    first, second = ran["cancelled"], ran["cancelled-again"]
    record, text = ended(first)
    assert record.state == "CANCELLED", text[-3000:]
    assert "0: arguments:\n" in text and "RESUME_ARGS appended" not in text, text[-3000:]
    record, text = ended(second)
    assert record.state == "COMPLETED", text[-3000:]
    assert "RESUME_ARGS appended: --resumed" in text and "0: arguments: --resumed" in text


def test_a_failing_doctor_stops_the_job_before_the_command(ran):
    """A FAIL from the doctor (a data directory that is a file; DOCTOR_ARGS come last and win)
    ends the job, FAILED, with the reason and the way out; the command never starts."""
    job = ran["failing-doctor"]
    record, text = ended(job)
    assert record.state == "FAILED" and record.exit_code[0] == 1, text[-3000:]
    assert "FAIL  cpu" not in text, "only the data directory may fail"
    assert re.search(r"FAIL +data_dir .*not-a-directory", text), text[-3000:]
    assert "error: the doctor found a problem" in text and "DOCTOR=0" in text
    assert "your command:" not in text and not (job.sub.run_dir / "hello").exists()
