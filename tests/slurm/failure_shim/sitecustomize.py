"""Test-only failure injection for tests/test_slurm_e2e.py (never part of a generated repo).

Python imports `sitecustomize` at start-up from sys.path, so putting this directory on
PYTHONPATH of a job (sbatch exports the submission environment to every step) arms it in each
training process. It does nothing unless ALPS_E2E_FAIL_TARGET is set:

    ALPS_E2E_FAIL_TARGET=<module>:<function>  function to wrap, e.g. mypkg.training.step:train_step
    ALPS_E2E_FAIL_RANK=<rank>                 only this rank fails (RANK, else SLURM_PROCID)
    ALPS_E2E_FAIL_AFTER=<n>                   the (n+1)-th call fails (default 5)
    ALPS_E2E_FAIL_ACTION=raise|stop           how (default raise)

raise: the wrapped function raises RuntimeError("ALPS_E2E injected failure ...") on that call,
as a bug in one rank would. stop: the process sends itself SIGSTOP, as a rank hung in a driver
call or a dead file system would look: alive, silent, its peers waiting in a collective.

    ALPS_E2E_SLOW_TARGET=<module>:<function>  every rank sleeps before each call ...
    ALPS_E2E_SLOW_S=<seconds>                 ... this long, on the job's first start only

slow: a preemption test's first start takes its steps at a pace the signal cannot miss (sent
once a step is logged, it reaches the ranks within about a second), without the CPU that many
more steps would cost; once requeued (SLURM_RESTART_COUNT 1) the run goes at full speed.
Sleeping changes nothing that is computed. The training package needs no hook for any of this.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import signal
import sys
import time

_TARGET = os.environ.get("ALPS_E2E_FAIL_TARGET", "")
_RANK = os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0"))
_ACTION = os.environ.get("ALPS_E2E_FAIL_ACTION", "raise")


class _WrapOnImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself; when `module` is imported, wraps `function` after it executes."""

    def __init__(self, module: str, function: str, wrap) -> None:
        self.module, self.function, self.wrap_function = module, function, wrap

    def find_spec(self, name, path, target=None):
        if name != self.module:
            return None
        sys.meta_path.remove(self)  # find the real spec with the other finders
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_wrap(module):
            exec_module(module)
            setattr(module, self.function, self.wrap_function(getattr(module, self.function)))

        spec.loader.exec_module = exec_and_wrap
        return spec


def failing_after(after: int, name: str):
    """The wrapper that fails (ALPS_E2E_FAIL_ACTION) on call after+1."""

    def wrap(original):
        calls = 0

        def failing(*args, **kwargs):
            nonlocal calls
            calls += 1
            if calls > after and _ACTION == "stop":
                print(f"ALPS_E2E stopping rank {_RANK} (SIGSTOP)", file=sys.stderr, flush=True)
                os.kill(os.getpid(), signal.SIGSTOP)
            elif calls > after:
                raise RuntimeError(
                    f"ALPS_E2E injected failure: rank {_RANK}, call {calls} of {name}"
                )
            return original(*args, **kwargs)

        print(
            f"ALPS_E2E failure shim armed: rank {_RANK} fails ({_ACTION}) in {name} after "
            f"{after} calls",
            file=sys.stderr,
            flush=True,
        )
        return failing

    return wrap


def sleeping(seconds: float, name: str):
    """The wrapper that sleeps `seconds` before each call."""

    def wrap(original):
        def slow(*args, **kwargs):
            time.sleep(seconds)
            return original(*args, **kwargs)

        print(
            f"ALPS_E2E slow first start: rank {_RANK} sleeps {seconds} s before each {name}",
            file=sys.stderr,
            flush=True,
        )
        return slow

    return wrap


if _TARGET and _RANK == os.environ.get("ALPS_E2E_FAIL_RANK", "1"):
    _module, _, _function = _TARGET.partition(":")
    _after = int(os.environ.get("ALPS_E2E_FAIL_AFTER", "5"))
    sys.meta_path.insert(
        0, _WrapOnImport(_module, _function, failing_after(_after, _TARGET.replace(":", ".")))
    )

_SLOW = os.environ.get("ALPS_E2E_SLOW_TARGET", "")
if _SLOW and os.environ.get("SLURM_RESTART_COUNT", "0") == "0":
    _module, _, _function = _SLOW.partition(":")
    _seconds = float(os.environ.get("ALPS_E2E_SLOW_S", "0.2"))
    sys.meta_path.insert(
        0, _WrapOnImport(_module, _function, sleeping(_seconds, _SLOW.replace(":", ".")))
    )
