"""The run directory's marker names are written twice: in the package (`run/rundir.py`,
`run/program.py`) and in the job scripts (`${RUN_DIR}/REQUEUE`, which decides whether the job is
requeued; `STARTED`, whether RESUME_ARGS are appended; `FAILED-task*`, the first failing task). In
every baked configuration the rendered job scripts must use the names the package writes."""

import re

import pytest


def package_constant(repo, name: str, module: str = "rundir") -> str:
    (path,) = (repo / "src").glob(f"*/run/{module}.py")
    match = re.search(rf'^{name} = "([^"]+)"', path.read_text(), re.MULTILINE)
    assert match, f"{name} not found in {path}"
    return match.group(1)


def test_job_scripts_read_the_requeue_marker_the_package_writes(baked):
    name, repo = baked
    # REQUEUE: the package's and your program's stop; STARTED: your program's first start
    # (run/program.py), which decides whether RESUME_ARGS are appended
    written = {package_constant(repo, "REQUEUE"), package_constant(repo, "STARTED", "program")}
    scripts = sorted(p for p in (repo / "jobs").rglob("*") if p.is_file())
    if not scripts:
        pytest.skip(f"{name}: no job scripts")
    text = "".join(p.read_text() for p in scripts)
    used = set(re.findall(r'"\$\{RUN_DIR\}/([A-Z]+)"', text))
    assert used == written, f"{name}: job scripts use {used}, the package writes {written}"
    failed = package_constant(repo, "FAILED", "program")  # one file per failing task
    assert f'"${{RUN_DIR}}"/{failed}*' in text, f"{name}: job scripts do not read {failed}*"
