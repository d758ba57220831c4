"""The run-directory lock: a live second job is refused and named; a requeued job, a dead
process and a silent holder are taken over; only the holder releases; one winner in a race."""

import json
import multiprocessing
import os
import socket
import subprocess
import sys
import time

import pytest

from {{ cookiecutter.package_name }}.rundir import LOCK
from {{ cookiecutter.package_name }}.rundir_lock import RunDirBusy, acquire, hold


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


def test_a_dead_process_on_this_host_is_taken_over(tmp_path, monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    plant(tmp_path, job=None, host=socket.gethostname(), pid=dead.pid)
    assert "is gone" in acquire(tmp_path).me["took_over"]


def test_a_silent_holder_on_another_host_is_taken_over(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "200")
    plant(tmp_path, job="100", host="another-node", pid=1)
    with pytest.raises(RunDirBusy):
        acquire(tmp_path, stale_after_s=60)
    old = time.time() - 120
    os.utime(tmp_path / LOCK, (old, old))
    assert "no heartbeat" in acquire(tmp_path, stale_after_s=60).me["took_over"]


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
