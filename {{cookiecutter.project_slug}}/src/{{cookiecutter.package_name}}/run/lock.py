"""One live job per run directory: `<run_dir>/LOCK`, held by rank 0 for the whole run.

Submitting the same job script twice gives both jobs the same run name, and two `srun` steps of
one allocation share a job id; without a lock they would resume from each other's checkpoints
and interleave `metrics.jsonl`. The lock file is written to a temp file and hard-linked into
place (`link` fails if the name exists, atomically, Lustre included; `flock` is not reliable
there), so it is complete or absent. It records who holds it; the holder is taken over only
when it is provably gone:
- the same Slurm job started again with a higher SLURM_RESTART_COUNT (a requeue),
- a dead process on this host (its pid is gone), or
- a holder on another host silent for `stale_after_s` (its heartbeat, refreshed at every log
  step, is old: the node died, say).
Anything else is a live job, another step of this job included: `RunDirBusy` names it and the
fix. A LOCK that holds no readable record (empty, cut, not JSON, not a record) was not written
by a live run of this code: it is taken over, with a warning naming the file.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .atomic import atomic_write_bytes, create_exclusive
from .rundir import RunDir, RunDirError, os_error_text

log = logging.getLogger(__name__.split(".")[0])

STALE_AFTER_S = 900.0  # no heartbeat for 15 min: the holder is gone (a node died, say)


class RunDirBusy(RunDirError):
    """Another live job trains in this run directory."""


def identity(environ=None) -> dict:
    """Who we are: the Slurm job (stable across requeues), how often it was restarted, the
    step of the allocation, the host, the process."""
    env = os.environ if environ is None else environ
    array_job, task = env.get("SLURM_ARRAY_JOB_ID"), env.get("SLURM_ARRAY_TASK_ID")
    job = f"{array_job}_{task}" if array_job and task else env.get("SLURM_JOB_ID")
    restart = env.get("SLURM_RESTART_COUNT", "0")
    return {
        "job": job,
        "restart": int(restart) if restart.isdigit() else 0,
        "step": env.get("SLURM_STEP_ID"),
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "started": time.time(),
    }


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


def _as_int(value, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _why_takeover(holder: dict, me: dict, age_s: float, stale_after_s: float) -> str | None:
    """Why the recorded holder is provably gone, or None if it may be alive."""
    if me["job"] and holder.get("job") == me["job"]:
        if me["restart"] > _as_int(holder.get("restart"), 0):
            return f"the same job {me['job']}, requeued (restart {me['restart']})"
    if holder.get("host") == me["host"]:
        pid = _as_int(holder.get("pid"), -1)
        if pid > 0 and not pid_alive(pid):
            return f"its process {pid} on {me['host']} is gone"
        return None  # alive on this host (or no pid to check): not provably gone
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
        except OSError:  # removed by hand, or the file system hiccups: the run goes on
            pass

    def release(self) -> None:
        """Remove the file if it is still ours (a takeover may have replaced it)."""
        try:
            holder = _read(self.path)
        except RunDirError:  # replaced by something unreadable: not ours any more
            return
        if isinstance(holder, dict) and (holder.get("host"), holder.get("pid")) == (
            self.me["host"],
            self.me["pid"],
        ):
            self.path.unlink(missing_ok=True)


def _describe(holder: dict) -> str:
    job = f"job {holder['job']}" if holder.get("job") else "a process outside Slurm"
    if holder.get("job") and holder.get("step") is not None:
        job += f" step {holder['step']}"
    return f"{job} on {holder.get('host', '?')} (pid {holder.get('pid', '?')})"


def _read(path: Path) -> dict | str | None:
    """The holder's record; None if there is no lock; a string saying what is wrong with it."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except IsADirectoryError:
        raise RunDirError(
            f"{path} is a directory, not a lock file: remove it (rmdir) to train in this run_dir"
        ) from None
    except OSError as err:
        raise RunDirError(f"cannot read the lock {path}: {os_error_text(err)}") from None
    except UnicodeDecodeError:
        return "not text"
    if not text.strip():
        return "empty"
    try:
        holder = json.loads(text)
    except ValueError:
        return "not JSON"
    if not isinstance(holder, dict):
        return f"a JSON {type(holder).__name__}, not a record"
    if not isinstance(holder.get("host"), str) or not isinstance(holder.get("pid"), int):
        return "a record without host and pid"
    return holder


def acquire(run_dir: RunDir, stale_after_s: float = STALE_AFTER_S, environ=None) -> RunDirLock:
    path = RunDir.of(run_dir).lock
    me = identity(environ)
    data = json.dumps(me).encode()
    for _ in range(3):  # retry when the holder changes under us
        try:
            if create_exclusive(path, data):
                return RunDirLock(path, me)
        except IsADirectoryError:
            pass  # _read says it in one line
        except OSError as err:
            raise RunDirError(f"cannot write the lock {path}: {os_error_text(err)}") from None
        holder = _read(path)
        if holder is None:
            continue  # released meanwhile: try again
        if isinstance(holder, str):
            reason = f"it holds no lock record ({holder}): not written by a live run"
        else:
            try:
                age_s = time.time() - path.stat().st_mtime
            except FileNotFoundError:
                continue
            reason = _why_takeover(holder, me, age_s, stale_after_s)
        if reason is None:
            raise RunDirBusy(
                f"{RunDir.of(run_dir)} is in use by {_describe(holder)}: two jobs would train "
                "into the same checkpoints. Use another RUN_NAME (or run_dir=...), or cancel "
                "that job (scancel). A lock whose holder is gone is taken over: on this host "
                "once its process has ended, from another host after "
                f"{stale_after_s / 60:.0f} minutes without a heartbeat; or remove {path}."
            )
        try:  # atomic: whoever renames last holds it, and re-reading tells
            atomic_write_bytes(path, data)
        except OSError as err:
            raise RunDirError(f"cannot write the lock {path}: {os_error_text(err)}") from None
        time.sleep(0.05)
        now = _read(path)
        if isinstance(now, dict) and now.get("pid") == me["pid"] and now.get("host") == me["host"]:
            # a requeue taking over its own lock is routine; any other holder is worth a line
            routine = reason.startswith("the same job")
            (log.info if routine else log.warning)("taking over %s: %s", path, reason)
            return RunDirLock(path, {**me, "took_over": reason})
    raise RunDirBusy(
        f"{RunDir.of(run_dir)}: could not take the lock {path} (it keeps changing hands)"
    )


@contextmanager
def hold(run_dir: RunDir, stale_after_s: float = STALE_AFTER_S) -> Iterator[RunDirLock]:
    lock = acquire(run_dir, stale_after_s)
    try:
        yield lock
    finally:
        lock.release()
