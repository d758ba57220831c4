"""Hostile answers that are accepted on purpose stay inert data; every Slurm time form, e-mail form
and known path variable that is accepted works; the prompts are the same for every flavour."""

from __future__ import annotations

import json
import random
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from conftest import TEMPLATE_DIR, answers, clean_env, load_hook, run
from template_runs import (
    cookiecutter,
    hook_errors,
    markdown_title_and_first_paragraph,
)


@pytest.mark.parametrize("limit", ["30", "90:00", "01:00:00", "1-0", "1-12:00", "2-00:00:00"])
def test_slurm_time_forms_accepted(hooks, limit):
    """Every form sbatch --time takes is accepted (the bakes render "30" and the default into the
    job scripts)."""
    assert hook_errors(hooks, time_limit=limit) == []


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
    assert markdown_title_and_first_paragraph(repo / "README.md") == (HOSTILE, HOSTILE)
    scripts = sorted(str(p) for p in repo.rglob("*") if p.suffix in {".sh", ".sbatch"})
    run(["shellcheck", "--shell=bash", *scripts], cwd=repo)
    for script in scripts:
        run(["bash", "-n", script], cwd=repo)
    assert not list(tmp_path.rglob("pwned*")) and not Path("pwned").exists()
    # git got the hostile author name as data too (git itself drops "<" and ">" from names)
    author = run(["git", "log", "-1", "--format=%an"], cwd=repo).stdout.strip()
    configured = run(["git", "config", "user.name"], cwd=repo, check=False).stdout.strip()
    assert author in (HOSTILE.replace("<", "").replace(">", ""), configured)


@pytest.mark.parametrize("flag", ["yes", "no"])
def test_git_init_accepts_old_yes_no(tmp_path, flag):
    """git_init is a boolean; "yes"/"no" from older .cruft.json files still work (true and false:
    the configurations baked by the other tests)."""
    out = tmp_path / "out"
    proc = cookiecutter(out, git_init=flag, env_flavour="uenv", ci="none")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (out / "alps-torch-project" / ".git").exists() == (flag in ("yes", "true"))


def no_git_identity_env(tmp_path: Path) -> dict[str, str]:
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in clean_env().items() if not k.startswith("GIT_")}
    return {**env, "HOME": str(home), "GIT_CONFIG_NOSYSTEM": "1", "XDG_CONFIG_HOME": str(home)}


@pytest.mark.parametrize(
    ("author", "expected"),
    [
        (".", "alps-torch-template <alps-torch-template@localhost>"),
        ("<>", "alps-torch-template <alps-torch-template@localhost>"),
        ("Ada Lovelace", "Ada Lovelace <ada@example.org>"),
    ],
)
def test_first_commit_without_git_identity(tmp_path, author, expected):
    """No global git identity and an author name git refuses: the project is kept, the first
    commit falls back to a safe identity and the hook says so."""
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "cookiecutter", "--no-input", "-o", str(out), str(TEMPLATE_DIR)]
        + [f"author_name={author}", "author_email=ada@example.org", "ci=none"],
        capture_output=True,
        text=True,
        timeout=120,
        env=no_git_identity_env(tmp_path),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    repo = out / "alps-torch-project"
    log = run(["git", "log", "--format=%an <%ae>"], cwd=repo).stdout.splitlines()
    assert log == [expected]
    assert f"the first commit is authored by {expected}" in proc.stdout
    assert run(["git", "status", "--porcelain"], cwd=repo).stdout == ""


VISIBLE_QUESTIONS = [
    k for k in json.loads((TEMPLATE_DIR / "cookiecutter.json").read_text()) if not k.startswith("_")
]


@pytest.mark.parametrize(("flavour", "number"), [("container", 1), ("uenv", 2), ("both", 3)])
def test_prompt_count_per_flavour(tmp_path, flavour, number):
    """Interactive cookiecutter asks len(VISIBLE_QUESTIONS) questions whatever the flavour:
    cookiecutter 2.7.1 cannot skip a question depending on an earlier answer (only private
    `_`/`__` keys are not asked)."""
    before = VISIBLE_QUESTIONS.index("env_flavour")
    answers_in = "\n" * before + f"{number}\n" + "\n" * 40
    proc = subprocess.run(
        [sys.executable, "-m", "cookiecutter", "-o", str(tmp_path / "out"), str(TEMPLATE_DIR)],
        input=answers_in,
        capture_output=True,
        text=True,
        timeout=120,
        env={**clean_env(), "COLUMNS": "200"},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    asked = re.findall(r"\[(\d+)/(\d+)\]", proc.stdout)
    total = len(VISIBLE_QUESTIONS)
    assert [int(i) for i, n in asked if int(n) == total] == list(range(1, total + 1))
    assert total == 20  # the image tags are `__` settings, not asked
    # the workload's prompt says what each choice brings
    assert "all: the training package" in proc.stdout and "program: your own program" in proc.stdout
    doc = (tmp_path / "out" / "alps-torch-project" / "docs" / "answers.md").read_text()
    assert f"| `env_flavour` | {flavour} |" in doc


def test_explicit_slug_rescues_a_name_without_letters(tmp_path):
    proc = cookiecutter(tmp_path / "out", project_name="!!!", project_slug="bangs", git_init="no")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (tmp_path / "out" / "bangs" / "src" / "bangs").is_dir()


@pytest.mark.parametrize(
    "path",
    ["${SCRATCH}/x", "${HOME}/data", "${STORE}/ds", "/capstor/scratch/cscs/${USER}/r", "/a/b"],
)
def test_known_variables_in_paths_are_accepted(tmp_path, path):
    hook = load_hook(tmp_path, "pre_gen_project", answers("default"))
    assert hook.field_error("data_dir", path) is None


# Forms of author_email the hook accepts, each built into package metadata by setuptools below.
ACCEPTED_EMAILS = [
    "you@example.org",
    "Ada.Lovelace@example.org",
    "a.b.c@x.org",
    "ada+alps@example.org",
    "a_b%c-d@x-y.example.org",
    "ADA@EXAMPLE.ORG",
    "0@0.ch",
    "ada@xn--bcher-kva.ch",
    "ada@sub.domain.example.co.uk",
    "a" * 64 + "@x.org",
    "a@" + "b" * 63 + ".org",
    "a@b.c-d.org",
    "ada@example.museum",
]


# Refused by the hook and by setuptools/pip alike (issue 20: the project could not be installed).
UNINSTALLABLE_EMAILS = [".a..b.@x.org", "a.@b.org", "a@b..org", "a@localhost", ".a@x.org"]


_METADATA_BUILDER = r"""
import contextlib, io, json, pathlib, re, sys, tempfile
from setuptools import build_meta
pyproject = pathlib.Path("pyproject.toml")
original = pyproject.read_text()
results = {}
for email in json.loads(sys.argv[1]):
    quoted = "email = " + json.dumps(email)
    pyproject.write_text(re.sub(r'email = "[^"]*"', lambda m: quoted, original))
    out = tempfile.mkdtemp()
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            name = build_meta.prepare_metadata_for_build_wheel(out)
        results[email] = (pathlib.Path(out) / name / "METADATA").read_text()
    except BaseException as error:
        results[email] = "FAILED: " + type(error).__name__
print(json.dumps(results))
"""


def build_metadata(repo: Path, emails: list[str], tmp_path: Path) -> dict[str, str]:
    """email -> the METADATA setuptools (the project's build backend) writes for a copy of the
    baked repo with that author e-mail, or "FAILED: <error>"."""
    work = tmp_path / "project"
    work.mkdir()
    for name in ("pyproject.toml", "README.md"):
        (work / name).write_text((repo / name).read_text())
    (work / "src").mkdir()
    package = next(p for p in (repo / "src").iterdir() if p.is_dir() and "egg" not in p.name)
    (work / "src" / package.name).mkdir()
    (work / "src" / package.name / "__init__.py").write_text("")
    assert 'build-backend = "setuptools.build_meta"' in (work / "pyproject.toml").read_text()
    proc = run([sys.executable, "-c", _METADATA_BUILDER, json.dumps(emails)], cwd=work)
    return json.loads(proc.stdout)


def test_every_accepted_email_form_builds_package_metadata(bake, tmp_path):
    """Each e-mail form the hook accepts (listed, and 40 random ones from the same grammar) is
    written by setuptools into the metadata pip builds when it installs the project; the forms
    that broke `pip install` are refused by the hook and by setuptools."""
    hook = load_hook(tmp_path, "pre_gen_project", answers("default"))
    rng = random.Random(20)
    word = "abcXYZ019_%+-"
    label = "abz09"
    randoms = [
        ".".join("".join(rng.choices(word, k=rng.randint(1, 5))) for _ in range(rng.randint(1, 3)))
        + "@"
        + ".".join(
            rng.choice(label) + "".join(rng.choices(label + "-", k=rng.randint(0, 3))) + "x"
            for _ in range(rng.randint(1, 3))
        )
        + "."
        + "".join(rng.choices("abcdefghij", k=rng.randint(2, 4)))
        for _ in range(40)
    ]
    accepted = ACCEPTED_EMAILS + randoms
    for email in accepted:
        assert hook.field_error("author_email", email) is None, email
    for email in UNINSTALLABLE_EMAILS:
        assert hook.field_error("author_email", email) is not None, email
    metadata = build_metadata(bake("default"), accepted + UNINSTALLABLE_EMAILS, tmp_path)
    for email in accepted:
        assert f"Author-email: Your Name <{email}>" in metadata[email].splitlines(), (
            email,
            metadata[email][:200],
        )
    for email in UNINSTALLABLE_EMAILS:
        assert metadata[email].startswith("FAILED"), email
