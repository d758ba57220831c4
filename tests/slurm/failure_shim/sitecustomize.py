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
The training package needs no hook for this.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import signal
import sys

_TARGET = os.environ.get("ALPS_E2E_FAIL_TARGET", "")
_RANK = os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0"))
_ACTION = os.environ.get("ALPS_E2E_FAIL_ACTION", "raise")


class _WrapOnImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself; when `module` is imported, wraps `function` after it executes."""

    def __init__(self, module: str, function: str, after: int) -> None:
        self.module, self.function, self.after = module, function, after

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
            self.wrap(module)

        spec.loader.exec_module = exec_and_wrap
        return spec

    def wrap(self, module) -> None:
        original = getattr(module, self.function)
        calls = 0

        def failing(*args, **kwargs):
            nonlocal calls
            calls += 1
            if calls > self.after and _ACTION == "stop":
                print(f"ALPS_E2E stopping rank {_RANK} (SIGSTOP)", file=sys.stderr, flush=True)
                os.kill(os.getpid(), signal.SIGSTOP)
            elif calls > self.after:
                raise RuntimeError(
                    f"ALPS_E2E injected failure: rank {_RANK}, call {calls} of "
                    f"{self.module}.{self.function}"
                )
            return original(*args, **kwargs)

        setattr(module, self.function, failing)
        print(
            f"ALPS_E2E failure shim armed: rank {_RANK} fails ({_ACTION}) in {self.module}."
            f"{self.function} after {self.after} calls",
            file=sys.stderr,
            flush=True,
        )


if _TARGET and _RANK == os.environ.get("ALPS_E2E_FAIL_RANK", "1"):
    _module, _, _function = _TARGET.partition(":")
    sys.meta_path.insert(
        0,
        _WrapOnImport(_module, _function, int(os.environ.get("ALPS_E2E_FAIL_AFTER", "5"))),
    )
