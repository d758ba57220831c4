"""Bad answers are refused before anything is written; free text is rendered safely."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from conftest import TEMPLATE_DIR, run


def cookiecutter(out: Path, *options: str, **answers: str) -> subprocess.CompletedProcess:
    """Run the cookiecutter CLI as a user would (default: --no-input with these answers)."""
    args = [f"{k}={v}" for k, v in answers.items()]
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "cookiecutter",
            *(options or ["--no-input"]),
            "-o",
            str(out),
            str(TEMPLATE_DIR),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )


CHOICE_FIELDS = {"cluster", "env_flavour", "container_base", "launcher", "git_init"}

# (field, bad value, a phrase of the accepted form the message must show)
BAD_ANSWERS = [
    ("project_slug", "My Project", "lowercase letters and digits"),
    ("project_slug", "x" * 65, "at most 64 characters"),
    ("package_name", "1abc", "Python identifier"),
    ("package_name", "json", "does not shadow"),
    ("package_name", "class", "does not shadow"),
    ("project_name", "two\nlines", "no newlines"),
    ("description", "tab\there", "no newlines, tabs"),
    ("description", "emoji \U0001f600", "printable characters"),
    ("author_name", "", "one line of at most 100"),
    ("author_email", "not-an-email", "e-mail address"),
    ("author_email", 'a"@b.org', "e-mail address"),
    ("account", "a-g34; rm -rf ~", "Slurm account"),
    ("account", "$(id)", "Slurm account"),
    ("partition", "normal\n#SBATCH --environment=x", "partition name"),
    ("partition", "", "partition name"),
    ("cluster", "eiger", "one of clariden, daint, santis"),
    ("env_flavour", "docker", "one of container, uenv, both"),
    ("container_base", "ubuntu", "one of ngc, alps-extended"),
    ("launcher", "mpirun", "one of srun, torchrun"),
    ("git_init", "maybe", "one of yes, no"),
    ("ngc_pytorch_tag", "latest", "YY.MM"),
    ("alps_extended_tag", "26.02", "YY.MM-py3-alpsN"),
    ("uenv_image", "pytorch", "name/version[:tag]"),
    ("uenv_image", "pytorch/v2.9.1:v1`id`", "name/version[:tag]"),
    ("nodes", "0", "whole number of nodes"),
    ("nodes", "-2", "whole number of nodes"),
    ("nodes", "two", "whole number of nodes"),
    ("time_limit", "0", "Slurm time limit"),
    ("time_limit", "1:60:00", "Slurm time limit"),
    ("time_limit", "1-24", "Slurm time limit"),
    ("time_limit", "one hour", "Slurm time limit"),
    ("image_dir", "$SCRATCH/images", "${VAR}"),
    ("data_dir", "relative/data", "absolute path"),
    ("checkpoint_dir", "/capstor/$(whoami)/runs", "absolute path"),
    ("checkpoint_dir", "/capstor/my runs", "absolute path"),
    ("data_dir", '/scratch/"quoted"', "absolute path"),
]


@pytest.mark.parametrize(
    ("field", "value", "form"),
    BAD_ANSWERS,
    ids=[f"{f}-{i}" for i, (f, _, _) in enumerate(BAD_ANSWERS)],
)
def test_bad_answer_is_refused_and_leaves_nothing(tmp_path, field, value, form):
    out = tmp_path / "out"
    proc = cookiecutter(out, **{field: value})
    assert proc.returncode != 0
    if field in CHOICE_FIELDS:  # cookiecutter itself refuses a value outside the choices
        assert f"{value} provided for choice variable {field}" in proc.stderr
        assert form.removeprefix("one of ").split(", ")[0] in proc.stderr
    else:
        message = f"error: {field} = {value!r} is invalid: expected "
        assert message in proc.stderr, proc.stderr[-3000:]
        line = next(x for x in proc.stderr.splitlines() if x.startswith(f"error: {field} = "))
        assert form in line
    assert not out.exists() or not any(out.iterdir()), "a half-generated repo was left behind"


def test_all_errors_reported_at_once(tmp_path):
    proc = cookiecutter(tmp_path / "out", nodes="0", time_limit="x", account="a b")
    errors = [x for x in proc.stderr.splitlines() if x.startswith("error: ")]
    assert {e.split(" = ")[0] for e in errors} == {
        "error: nodes",
        "error: time_limit",
        "error: account",
    }


@pytest.mark.parametrize("limit", ["30", "90:00", "01:00:00", "1-0", "1-12:00", "2-00:00:00"])
def test_slurm_time_forms_accepted(tmp_path, limit):
    proc = cookiecutter(tmp_path / "out", time_limit=limit, git_init="no")
    assert proc.returncode == 0, proc.stderr[-2000:]


HOSTILE = 'Ada\'s "model" $(touch pwned) `touch pwned2`; rm -rf / \\ & <b> {x}'


def test_free_text_is_rendered_safely(tmp_path):
    """Quotes, $(), backticks, ; and backslashes in free text stay inert data."""
    out = tmp_path / "out"
    proc = cookiecutter(
        out,
        project_name=HOSTILE,
        description=HOSTILE,
        author_name=HOSTILE,
        env_flavour="both",
        git_init="yes",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (repo,) = out.iterdir()
    # the slug is derived safely from the name
    assert repo.name == "ada-s-model-touch-pwned-touch-pwned2-rm-rf-b-x"
    project = tomllib.loads((repo / "pyproject.toml").read_text())["project"]
    assert project["description"] == HOSTILE
    assert project["authors"][0]["name"] == HOSTILE
    assert (repo / "README.md").read_text().startswith(f"# {HOSTILE}\n")
    scripts = sorted(str(p) for p in repo.rglob("*") if p.suffix in {".sh", ".sbatch"})
    run(["shellcheck", "--shell=bash", *scripts], cwd=repo)
    for script in scripts:
        run(["bash", "-n", script], cwd=repo)
    assert not list(tmp_path.rglob("pwned*")) and not Path("pwned").exists()
    # git got the hostile author name as data too (git itself drops "<" and ">" from names)
    author = run(["git", "log", "-1", "--format=%an"], cwd=repo).stdout.strip()
    configured = run(["git", "config", "user.name"], cwd=repo, check=False).stdout.strip()
    assert author in (HOSTILE.replace("<", "").replace(">", ""), configured)
