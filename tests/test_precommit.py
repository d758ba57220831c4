"""The generated repository's pre-commit hooks: every freshly baked repo passes them, and an Alps
mistake makes them fail with the Alps linter's report.

Each test works on a copy of the shared baked repo (git init + add where the bake has no git).
Hook environments are installed once into the pre-commit cache ($PRE_COMMIT_HOME, else
~/.cache/pre-commit) and reused by every test and every later session; the first installation
downloads the pinned hooks from PyPI (about a minute).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import yaml
from conftest import CONFIGS, TEMPLATE_DIR, git_copy, run


def pre_commit(repo: Path, env: dict[str, str], *args: str, check: bool = True):
    return run(
        [
            sys.executable,
            "-m",
            "pre_commit",
            "run",
            "--all-files",
            "--color=never",
            *args,
        ],
        repo,
        env=env,
        timeout=900,
        check=check,
    )


def test_hooks_are_pinned_pypi_only(bake):
    """No hook needs GitHub: all are local hooks with pinned PyPI dependencies."""
    config = yaml.safe_load((bake("default") / ".pre-commit-config.yaml").read_text())
    hooks = [hook for repo in config["repos"] for hook in repo["hooks"]]
    assert [repo["repo"] for repo in config["repos"]] == ["local"]
    for hook in hooks:
        assert hook["language"] in {"python", "fail"}, hook["id"]
        for requirement in hook.get("additional_dependencies", []):
            assert "==" in requirement, f"{hook['id']}: {requirement} is not pinned"
    ids = {hook["id"] for hook in hooks}
    assert {"shellcheck", "ruff-check", "ruff-format", "hadolint", "alps-lint"} <= ids
    assert {"check-toml", "check-yaml", "check-merge-conflict", "no-rej-files"} <= ids


def test_generated_repo_passes_pre_commit(baked, tmp_path, pre_commit_env):
    name, path = baked
    repo = git_copy(path, tmp_path / name, pre_commit_env)
    proc = pre_commit(repo, pre_commit_env, "--show-diff-on-failure", check=False)
    assert proc.returncode == 0, f"pre-commit failed in {name}:\n{proc.stdout[-8000:]}"
    if CONFIGS[name].get("env_flavour") == "uenv":
        hadolint = [line for line in proc.stdout.splitlines() if line.startswith("hadolint")]
        assert hadolint and hadolint[0].endswith("Skipped"), "no Dockerfile: hadolint skips"


def test_template_repo_passes_its_own_pre_commit(tmp_path, pre_commit_env):
    """The template's own hooks (.pre-commit-config.yaml at its root: ruff on hooks/ and tests/,
    shellcheck on .ci/) pass on its tracked files: nothing ran them, and main drifted into six
    lint errors and three unformatted files unnoticed."""
    tracked = run(["git", "ls-files", "-z"], TEMPLATE_DIR, env=pre_commit_env).stdout
    repo = tmp_path / "template"
    for name in filter(None, tracked.split("\0")):
        source = TEMPLATE_DIR / name
        if source.is_file():  # a file deleted in the work tree but not yet from the index
            (repo / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, repo / name)
    run(["git", "init", "--quiet"], repo, env=pre_commit_env)
    run(["git", "add", "--all"], repo, env=pre_commit_env)
    proc = pre_commit(repo, pre_commit_env, "--show-diff-on-failure", check=False)
    assert proc.returncode == 0, f"the template's pre-commit failed:\n{proc.stdout[-8000:]}"


def test_sbatch_environment_directive_fails_pre_commit(bake, tmp_path, pre_commit_env):
    repo = git_copy(bake("default"), tmp_path / "repo", pre_commit_env)
    job = repo / "jobs" / "train_container.sbatch"
    lines = job.read_text().splitlines(keepends=True)
    lines.insert(1, "#SBATCH --environment=./container/edf.toml\n")
    job.write_text("".join(lines))
    proc = pre_commit(repo, pre_commit_env, check=False)
    assert proc.returncode == 1, proc.stdout
    assert (
        "jobs/train_container.sbatch:2: SB-ENV-DIRECTIVE: #SBATCH --environment: "
        "put it on each srun instead"
    ) in proc.stdout.splitlines(), proc.stdout
    alps = [line for line in proc.stdout.splitlines() if line.startswith("Alps linter")]
    assert alps and alps[0].endswith("Failed"), proc.stdout


def test_rej_file_fails_pre_commit(bake, tmp_path, pre_commit_env):
    """cruft update leaves *.rej files when a template hunk does not apply."""
    repo = git_copy(bake("default"), tmp_path / "repo", pre_commit_env)
    (repo / "README.md.rej").write_text("@@ -1 +1 @@\n-old\n+new\n")
    run(["git", "add", "README.md.rej"], repo, env=pre_commit_env)
    proc = pre_commit(repo, pre_commit_env, "no-rej-files", check=False)
    assert proc.returncode == 1, proc.stdout
    assert "README.md.rej" in proc.stdout
