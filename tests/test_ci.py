"""The generated repository's CI files: they parse, the unchosen one is gone, and the commands
of their steps pass in a baked repo (run as commands, not through a CI engine).

The install step is checked, not run: this machine reaches PyPI only, not the PyTorch CPU index,
and torch is installed here already. The test step runs with PYTEST_ADDOPTS selecting the linter
tests: the package's whole suite runs in tests/test_training_package.py already.
"""

from __future__ import annotations

import shlex

import pytest
import yaml
from conftest import answers, git_copy, run

CPU_INDEX = "--index-url https://download.pytorch.org/whl/cpu torch torchvision"
# workload=program and workload=language have no image model: torch alone
CPU_INDEX_TORCH = "--index-url https://download.pytorch.org/whl/cpu torch"


def github_commands(repo) -> list[str]:
    workflow = yaml.safe_load((repo / ".github/workflows/ci.yml").read_text())
    steps = workflow["jobs"]["test"]["steps"]
    assert [s["uses"] for s in steps if "uses" in s] == [
        "actions/checkout@v4",
        "actions/setup-python@v5",
    ]
    return [line for s in steps if "run" in s for line in s["run"].splitlines() if line]


def gitlab_commands(repo) -> list[str]:
    return yaml.safe_load((repo / ".gitlab-ci.yml").read_text())["test"]["script"]


@pytest.mark.parametrize(
    ("name", "reader"),
    [
        ("default", github_commands),
        ("both-extended-srun", gitlab_commands),
        ("program", github_commands),
        ("language", gitlab_commands),
        ("images", github_commands),
    ],
)
def test_ci_files_parse_and_match(bake, name, reader):
    repo = bake(name)
    commands = reader(repo)
    index = CPU_INDEX if answers(name)["workload"] in ("all", "images") else CPU_INDEX_TORCH
    assert commands == [
        f"python -m pip install {index}",
        "python -m pip install -e '.[dev]'",
        "python -m pytest",
        commands[3],
    ]
    assert commands[3].startswith("pre-commit run --all-files --show-diff-on-failure")
    other = ".gitlab-ci.yml" if reader is github_commands else ".github"
    assert not (repo / other).exists()
    assert answers(name)["ci"] == ("github" if reader is github_commands else "gitlab")


def test_no_ci_files_for_ci_none(bake):
    repo = bake("uenv-torchrun")
    assert answers("uenv-torchrun")["ci"] == "none"
    assert not (repo / ".github").exists() and not (repo / ".gitlab-ci.yml").exists()


def test_workflow_steps_pass_in_a_baked_repo(bake, tmp_path, pre_commit_env):
    """The test and pre-commit steps of the GitHub workflow, run as they are written."""
    repo = git_copy(bake("default"), tmp_path / "repo", pre_commit_env)
    test_step, pre_commit_step = github_commands(repo)[2:]
    # the step as written, on one file of the suite (which the generated suite's run collects
    # and runs in full): collecting all 58 files cost 11 s more
    env = {**pre_commit_env, "PYTHONPATH": "", "PYTEST_ADDOPTS": "-q tests/test_alps_lint.py"}
    proc = run(shlex.split(test_step), repo, env=env, timeout=600)
    assert " passed" in proc.stdout
    run(shlex.split(pre_commit_step), repo, env=pre_commit_env, timeout=900)
