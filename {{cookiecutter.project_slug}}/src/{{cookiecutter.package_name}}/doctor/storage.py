"""The doctor's check of a directory a job writes to or reads from (the run directory, the data
directory): it exists or can be made, takes a file written and fsynced, has room, and on Lustre
is striped as CSCS recommends, with the layout the repository's scripts/stripe_lustre.sh applies.
A plain function of its inputs, as the other checks (checks.py)."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
from collections.abc import Callable
from pathlib import Path

from .checks import FAIL, MIN_FREE_GIB, OK, WARN, Result


def nearest_existing(path: Path) -> Path:
    path = Path(os.path.abspath(path))
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def write_probe(directory: Path) -> None:
    """Create, write, fsync and remove a small file: what a checkpoint write needs."""
    probe = directory / f".doctor-probe-{socket.gethostname()}-{os.getpid()}"
    fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, b"doctor\n")
        os.fsync(fd)
    finally:
        os.close(fd)
        probe.unlink()


def lustre_stripe_count(path: Path) -> int | None:
    """Largest stripe count of the directory's default layout (-1: all OSTs); None off Lustre or
    without `lfs`. A progressive layout prints one count per component."""
    if shutil.which("lfs") is None:
        return None
    try:
        out = subprocess.run(
            ["lfs", "getstripe", "-d", "-c", str(path)],
            capture_output=True,
            text=True,
            timeout=20,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    counts = [int(n) for n in re.findall(r"-?\d+", out.stdout)]
    if out.returncode != 0 or not counts:
        return None
    return -1 if -1 in counts else max(counts)


# CSCS's Lustre layout is written once, in the repository's scripts/stripe_lustre.sh
# (LAYOUT=(...)); the advice below reads it from there, as tools/alps_lint.py does.
STRIPE_SCRIPT = "scripts/stripe_lustre.sh"
REPO_ROOT = Path(__file__).resolve().parents[3]  # src/<package>/doctor/ in the repository


def lustre_layout(script: Path) -> str | None:
    """The `lfs setstripe` options on the script's LAYOUT=(...) line, or None."""
    try:
        match = re.search(r"(?m)^LAYOUT=\(([^)\n]*)\)", script.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError):
        return None
    return " ".join(match.group(1).split()) if match else None


def stripe_advice(directory: Path, roots: tuple[Path, ...] = (Path.cwd(), REPO_ROOT)) -> str:
    """How to stripe `directory`: the repository's script, and the layout it applies."""
    for root in roots:
        layout = lustre_layout(root / STRIPE_SCRIPT)
        if layout:
            return f"{STRIPE_SCRIPT} {directory} (lfs setstripe {layout})"
    return f"{STRIPE_SCRIPT} {directory} from the repository (CSCS's progressive layout)"


def check_directory(
    role: str,
    path: Path,
    min_free_gib: float = MIN_FREE_GIB,
    stripe_count: Callable[[Path], int | None] = lustre_stripe_count,
) -> Result:
    """`path` exists and is writable, or its nearest existing parent is (it will be created
    there); enough free space; on Lustre, striped as CSCS recommends (https://docs.cscs.ch/guides/storage/)."""
    existing = nearest_existing(path)
    if not existing.is_dir():
        return Result(
            FAIL, role, f"{role} {path}: {existing} is not a directory; choose another {role}"
        )
    try:
        write_probe(existing)
    except OSError as err:
        return Result(
            FAIL,
            role,
            f"{role} {path} is not writable ({err.strerror or err}): choose another {role} "
            "(e.g. under $SCRATCH) or fix its permissions",
        )
    where = str(path) if existing == Path(os.path.abspath(path)) else f"{path} (in {existing})"
    free_gib = shutil.disk_usage(existing).free / 2**30
    if free_gib < min_free_gib:
        return Result(
            WARN, role, f"{role} {where}: only {free_gib:.1f} GiB free; free space or move it"
        )
    stripes = stripe_count(existing)
    if stripes is not None and 0 <= stripes <= 1:
        return Result(
            WARN,
            role,
            f"{role} {where} is on Lustre but not striped (stripe count {stripes}): before "
            f"writing, run {stripe_advice(existing)}",
        )
    striped = "" if stripes is None else f", Lustre stripe count {stripes}"
    return Result(OK, role, f"{role} {where}: writable, {free_gib:.0f} GiB free{striped}")
