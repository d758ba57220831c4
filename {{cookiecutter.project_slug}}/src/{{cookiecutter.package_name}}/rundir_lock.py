"""One live job per run directory: `<run_dir>/LOCK`, held by rank 0 for the whole run.

Submitting the same job script twice gives both jobs the same run name, so without a lock they
would resume from each other's checkpoints and interleave `metrics.jsonl`. The lock file is made
with `O_CREAT | O_EXCL`, which is atomic on Lustre too (`flock` is not reliable there). It records
who holds it; a holder is taken over when it is
- the same Slurm job (a requeued job keeps its job id; an array task its array job and task id),
- a dead process on this host (its pid is gone), or
- silent for `stale_after_s` (another host: its heartbeat, refreshed at every log step, is old).
Anything else is a live job: `RunDirBusy` names it and the fix.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

LOCK_FILE = "LOCK"
STALE_AFTER_S = 900.0  # no heartbeat for 15 min: the holder is gone (a node died, say)


class RunDirBusy(RuntimeError):
    """Another live job trains in this run directory."""


def identity(environ=None) -> dict:
    """Who we are: the Slurm job (stable across requeues), the host, the process."""
    env = os.environ if environ is None else environ
    array_job, task = env.get("SLURM_ARRAY_JOB_ID"), env.get("SLURM_ARRAY_TASK_ID")
    job = f"{array_job}_{task}" if array_job and task else env.get("SLURM_JOB_ID")
    return {"job": job, "host": socket.gethostname(), "pid": os.getpid(), "started": time.time()}


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


def _why_takeover(holder: dict, me: dict, age_s: float, stale_after_s: float) -> str | None:
    """Why the recorded holder may be replaced, or None if it is a live other job."""
    if holder.get("job") and holder.get("job") == me["job"]:
        return f"the same job {me['job']} (requeued)"
    if holder.get("host") == me["host"] and not _pid_alive(int(holder.get("pid", -1))):
        return f"its process {holder.get('pid')} on {me['host']} is gone"
    if age_s > stale_after_s:
        return f"no heartbeat for {age_s / 60:.0f} min"
    return None


class RunDirLock:
    def __init__(self, path: Path, me: dict):
        self.path, self.me = path, me

    def refresh(self) -> None:
        """Heartbeat: the lock's modification time says the holder is alive."""
        try:
            os.utime(self.path)
        except FileNotFoundError:
            pass

    def release(self) -> None:
        """Remove the file if it is still ours (a takeover may have replaced it)."""
        try:
            holder = json.loads(self.path.read_text())
            if (holder.get("host"), holder.get("pid")) == (self.me["host"], self.me["pid"]):
                self.path.unlink()
        except (FileNotFoundError, json.JSONDecodeError):
            pass


def _describe(holder: dict) -> str:
    job = f"job {holder['job']}" if holder.get("job") else "a process outside Slurm"
    return f"{job} on {holder.get('host', '?')} (pid {holder.get('pid', '?')})"


def acquire(run_dir: Path, stale_after_s: float = STALE_AFTER_S, environ=None) -> RunDirLock:
    path = Path(run_dir) / LOCK_FILE
    me = identity(environ)
    text = json.dumps(me)
    for _ in range(3):  # retry when the holder changes under us
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            pass
        else:
            with os.fdopen(fd, "w") as f:
                f.write(text)
            return RunDirLock(path, me)
        try:
            holder = json.loads(path.read_text() or "{}")
            age_s = time.time() - path.stat().st_mtime
        except FileNotFoundError:
            continue  # released meanwhile: try again
        except json.JSONDecodeError:  # being written right now, or cut by a crash
            holder, age_s = {}, time.time() - path.stat().st_mtime
            if age_s < 5:
                time.sleep(0.5)
                continue
        reason = _why_takeover(holder, me, age_s, stale_after_s)
        if reason is None:
            raise RunDirBusy(
                f"{run_dir} is in use by {_describe(holder)}: two jobs would train into the same "
                "checkpoints. Use another RUN_NAME (or run_dir=...), or cancel that job "
                "(scancel); a lock left by a job that no longer runs is taken over after "
                f"{stale_after_s / 60:.0f} minutes, or remove {path}."
            )
        tmp = path.with_name(f".{LOCK_FILE}.{me['host']}.{me['pid']}")
        tmp.write_text(text)
        os.replace(tmp, path)  # atomic: whoever renames last holds it, and re-reading tells
        time.sleep(0.05)
        if json.loads(path.read_text()).get("pid") == me["pid"]:
            return RunDirLock(path, {**me, "took_over": reason})
    raise RunDirBusy(f"{run_dir}: could not take the lock {path} (it keeps changing hands)")


@contextmanager
def hold(run_dir: Path, stale_after_s: float = STALE_AFTER_S) -> Iterator[RunDirLock]:
    lock = acquire(run_dir, stale_after_s)
    try:
        yield lock
    finally:
        lock.release()
