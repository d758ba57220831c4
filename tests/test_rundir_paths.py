"""The run directory's marker names are written twice: in the package (`run/rundir.py`) and in the
job scripts (`${RUN_DIR}/REQUEUE`, which decides whether the job is requeued). In every baked
configuration the rendered job scripts must use the names the package writes."""

import re

import pytest


def package_constant(repo, name: str) -> str:
    (rundir,) = (repo / "src").glob("*/run/rundir.py")
    match = re.search(rf'^{name} = "([^"]+)"', rundir.read_text(), re.MULTILINE)
    assert match, f"{name} not found in {rundir}"
    return match.group(1)


def test_job_scripts_read_the_requeue_marker_the_package_writes(baked):
    name, repo = baked
    requeue = package_constant(repo, "REQUEUE")
    scripts = sorted(p for p in (repo / "jobs").rglob("*") if p.is_file())
    if not scripts:
        pytest.skip(f"{name}: no job scripts")
    text = "".join(p.read_text() for p in scripts)
    used = set(re.findall(r'"\$\{RUN_DIR\}/([A-Z]+)"', text))
    assert used == {requeue}, f"{name}: job scripts use {used}, the package writes {requeue}"
