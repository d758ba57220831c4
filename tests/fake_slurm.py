"""srun and scontrol replaced by recorders, for running the generated job and helper scripts
as Slurm would start them, without Slurm (the real-Slurm versions: tests/test_slurm_e2e.py)."""

from __future__ import annotations

from pathlib import Path

# each call's arguments, NUL-separated, in calls/<n> (an argument may hold newlines)
RECORD = 'printf "%s\\0" "${0##*/}" "$@" > "${FAKE_CALLS}/$(ls "${FAKE_CALLS}" | wc -l)"\n'


# FAKE_MARKER: a file the step writes, as rank 0 writes <run_dir>/REQUEUE before it exits;
# FAKE_STEP: bash code the step runs in srun's own shell (its $PPID: the job script's shell)
FAKE_SRUN = (
    "#!/bin/bash\n"
    + RECORD
    + 'if [[ -n "${FAKE_MARKER:-}" ]]; then sleep 1; echo stop > "${FAKE_MARKER}"; fi\n'
    + 'if [[ -n "${FAKE_STEP:-}" ]]; then eval "${FAKE_STEP}"; fi\n'
    + 'exit "${FAKE_SRUN_STATUS:-0}"\n'
)


FAKE_SCONTROL = "#!/bin/bash\n" + "if [[ $1 == show ]]; then echo node1; exit; fi\n" + RECORD


def fake_env(home: Path, fake_bin: Path, calls: Path) -> dict[str, str]:
    """A minimal login environment whose srun/scontrol are the fakes in `fake_bin` (each call's
    argv lands in `calls`)."""
    return {
        "PATH": f"{fake_bin}:/usr/bin:/bin",
        "HOME": str(home),
        "USER": "u",
        "SCRATCH": str(home / "scratch"),
        "FAKE_CALLS": str(calls),
    }
