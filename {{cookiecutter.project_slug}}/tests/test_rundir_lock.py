"""The run-directory lock: a live second job is refused and named; a requeued job, a dead
process and a silent holder are taken over; only the holder releases; one winner in a race."""

import errno
import json
import logging
import multiprocessing
import os
import socket
import subprocess
import sys
import time

import pytest
from _faults import fail_writes

from {{ cookiecutter.package_name }}.run.lock import RunDirBusy, acquire, hold
from {{ cookiecutter.package_name }}.run.rundir import LOCK, RunDirError


def plant(run_dir, **holder):
    (run_dir / LOCK).write_text(json.dumps(holder))


def live_other_process():
    """The pid of a process that runs (this test's parent, pytest's launcher or a shell)."""
    return os.getppid()


def test_a_second_live_job_is_refused_with_the_holder_named(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "200")
    plant(tmp_path, job="100", host=socket.gethostname(), pid=live_other_process())
    with pytest.raises(RunDirBusy, match=r"in use by job 100 on .* \(pid \d+\).*RUN_NAME"):
        acquire(tmp_path)
    assert json.loads((tmp_path / LOCK).read_text())["job"] == "100"  # untouched


def test_the_same_job_requeued_takes_over(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "100")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")  # Slurm counts the requeues
    plant(tmp_path, job="100", restart=0, host="another-node", pid=1)
    lock = acquire(tmp_path)
    assert "requeued" in lock.me["took_over"]
    assert json.loads((tmp_path / LOCK).read_text())["pid"] == os.getpid()


def test_array_tasks_are_separate_jobs(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "7")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "1")
    plant(tmp_path, job="7_0", host="another-node", pid=1)
    with pytest.raises(RunDirBusy, match="job 7_0"):
        acquire(tmp_path)


def test_a_dead_process_on_this_host_is_taken_over(tmp_path, monkeypatch, lock_warnings):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    plant(tmp_path, job=None, host=socket.gethostname(), pid=dead.pid)
    assert "is gone" in acquire(tmp_path).me["took_over"]
    (said,) = lock_warnings.messages  # the takeover is logged, naming the file and the why
    host = socket.gethostname()
    assert said == f"taking over {tmp_path / LOCK}: its process {dead.pid} on {host} is gone"


def test_a_silent_holder_on_another_host_is_taken_over(tmp_path, monkeypatch, lock_warnings):
    monkeypatch.setenv("SLURM_JOB_ID", "200")
    plant(tmp_path, job="100", host="another-node", pid=1)
    with pytest.raises(RunDirBusy):
        acquire(tmp_path, stale_after_s=60)
    old = time.time() - 120
    os.utime(tmp_path / LOCK, (old, old))
    assert "no heartbeat" in acquire(tmp_path, stale_after_s=60).me["took_over"]
    assert lock_warnings.messages == [f"taking over {tmp_path / LOCK}: no heartbeat for 2 min"]


def test_refresh_is_a_heartbeat_and_release_removes_only_our_lock(tmp_path):
    with hold(tmp_path) as lock:
        old = time.time() - 1000
        os.utime(lock.path, (old, old))
        lock.refresh()
        assert time.time() - lock.path.stat().st_mtime < 60
    assert not (tmp_path / LOCK).exists()

    lock = acquire(tmp_path)
    plant(tmp_path, job="999", host="another-node", pid=1)  # taken over by someone else
    lock.release()
    assert json.loads((tmp_path / LOCK).read_text())["job"] == "999"


def _contend(run_dir, barrier, results):
    barrier.wait()
    try:
        acquire(run_dir)
        results.put("won")
        time.sleep(1)  # hold it while the other one looks
    except RunDirBusy:
        results.put("busy")


def test_two_processes_racing_one_wins(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_contend, args=(tmp_path, barrier, results)) for _ in range(2)]
    for p in procs:
        p.start()
    outcome = sorted(results.get(timeout=60) for _ in procs)
    for p in procs:
        p.join(60)
    assert outcome == ["busy", "won"]


def test_two_steps_of_one_allocation_do_not_share_a_run_dir(tmp_path, monkeypatch):
    """`srun ... &` twice in one job: the same job id, another step, both alive."""
    monkeypatch.setenv("SLURM_JOB_ID", "100")
    monkeypatch.setenv("SLURM_STEP_ID", "1")
    plant(tmp_path, job="100", step="0", restart=0, host=socket.gethostname(), pid=os.getppid())
    with pytest.raises(RunDirBusy, match=r"in use by job 100 step 0 on "):
        acquire(tmp_path)
    plant(tmp_path, job="100", step="0", restart=0, host="another-node", pid=1)
    with pytest.raises(RunDirBusy, match="job 100 step 0 on another-node"):
        acquire(tmp_path)  # its heartbeat is fresh: alive


def test_a_requeue_on_the_same_host_takes_over_even_if_the_pid_is_reused(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "100")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "2")
    plant(tmp_path, job="100", restart=1, host=socket.gethostname(), pid=os.getppid())
    assert "requeued (restart 2)" in acquire(tmp_path).me["took_over"]


@pytest.fixture
def lock_warnings(caplog, monkeypatch):
    log = logging.getLogger("{{ cookiecutter.package_name }}")
    monkeypatch.setattr(log, "propagate", True)
    caplog.set_level(logging.WARNING, logger=log.name)
    return caplog


@pytest.mark.parametrize(
    "content, what",
    [
        (b"", "empty"),
        (b"  \n", "empty"),
        (b"\x00\x00garbage{", "not JSON"),
        (b"\xff\xfe", "not text"),
        (b"[1, 2]", "a JSON list"),
        (b'{"job": "1"}', "without host and pid"),
    ],
)
def test_a_lock_without_a_readable_record_never_blocks(
    tmp_path, monkeypatch, lock_warnings, content, what
):
    """E.g. the 0-byte LOCK a full disk left: taken over at once, with the path and the why."""
    monkeypatch.setenv("SLURM_JOB_ID", "100")
    (tmp_path / LOCK).write_bytes(content)
    started = time.monotonic()
    lock = acquire(tmp_path)
    assert time.monotonic() - started < 2
    assert what in lock.me["took_over"]
    assert json.loads((tmp_path / LOCK).read_text())["pid"] == os.getpid()
    assert str(tmp_path / LOCK) in lock_warnings.text and what in lock_warnings.text


def test_a_directory_named_lock_is_one_line(tmp_path):
    (tmp_path / LOCK).mkdir()
    with pytest.raises(RunDirError, match=r"/LOCK is a directory, not a lock file: remove it"):
        acquire(tmp_path)


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EROFS])
def test_a_lock_that_cannot_be_written_leaves_no_file(tmp_path, monkeypatch, code):
    """Full disk or read-only: one line with the cause, and no empty LOCK to block the rerun."""
    fail_writes(monkeypatch, tmp_path, code)
    with pytest.raises(RunDirError, match=f"cannot write the lock .*LOCK: {os.strerror(code)}"):
        acquire(tmp_path)
    monkeypatch.undo()
    assert list(tmp_path.iterdir()) == []
    acquire(tmp_path)  # space freed: the rerun takes it at once
