"""A user's own command in one module and one table entry (docs/training.md of the generated
repo, "Commands"): both copied out of the docs page into a copy of a baked repository, no other
file of the package touched; the command runs, `--help` lists it, a bad argument is one line,
and the repo's layout test still passes (no map row needed)."""

from __future__ import annotations

import sys

from conftest import package_env, run
from user_code import add_from_docs, python


def test_a_command_of_your_own_is_one_module_and_one_entry(bake, tmp_path):
    repo = tmp_path / "repo"
    package = add_from_docs(
        bake("default"), repo, "training.md", "commands/hello.py", "commands/__init__.py",
        'Command("compare",',
    )  # fmt: skip
    assert "hello" in python(repo, package, "--help").stdout
    said = python(repo, package, "hello", f"run_dir={tmp_path}").stdout
    assert said == f"hello from {tmp_path}\n"
    bad = python(repo, package, "hello", str(tmp_path), check=False)
    assert bad.returncode == 2 and "expected run_dir=DIR" in bad.stderr
    layout = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0"]
    run([*layout, "tests/test_layout.py"], cwd=repo, env=package_env(repo), timeout=300)
