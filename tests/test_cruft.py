"""Template updates with cruft: create, check, update (user edits survive), link.

Each test works on a throw-away git copy of this template (commit "v1"), generates a project
from it with cruft, commits a template change ("v2") that touches the job scripts and runs
`cruft update` in the project. Commands run in an isolated HOME, so no user git or
cookiecutter configuration takes part.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
import tempfile
from pathlib import Path
from types import ModuleType

import pytest
from conftest import TEMPLATE_DIR, clean_env, load_hook, run

SLUG = "alps-torch-project"
PACKAGE = "alps_torch_project"
STRIPING_NOTE = "Lustre striping not applied here"  # printed by the post-gen hook
CRUFT_JSON_NOTE = "git add .cruft.json"  # the post-gen hook's advice under cruft create
NEW_DOC = "docs/added-in-v2.md"  # a file that only the template's v2 has
SIGNAL_V1, SIGNAL_V2 = "--signal=USR2@180", "--signal=USR2@240"
NODES_V1, NODES_USER = "#SBATCH --nodes=1\n", "#SBATCH --nodes=8\n"
MODEL_V1, MODEL_USER = (
    "cfg.mlp.hidden_dim",
    "2 * cfg.mlp.hidden_dim",
)  # the user doubles the width
JOBS = {
    "container": ["train_container"],
    "uenv": ["train_uenv"],
    "both": ["train_container", "train_uenv"],
}
COPY_IGNORE = shutil.ignore_patterns(
    ".git", "__pycache__", "*.pyc", ".pytest_cache", ".ruff_cache", ".venv*", "venv"
)


DATA_DIR = "/capstor/scratch/cscs/${USER}/own-data"  # a setting given instead of its default


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    home = tmp_path / "home"
    home.mkdir()
    return {
        **clean_env(),
        "HOME": str(home),  # no ~/.gitconfig, ~/.cookiecutterrc or replay files of the user
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_AUTHOR_NAME": "Test",
        "GIT_AUTHOR_EMAIL": "test@example.org",
        "GIT_COMMITTER_NAME": "Test",
        "GIT_COMMITTER_EMAIL": "test@example.org",
    }


def git(cwd: Path, env: dict[str, str], *args: str) -> str:
    return run(["git", *args], cwd, env=env).stdout.strip()


def cruft(cwd: Path, env: dict[str, str], *args: str, check: bool = True):
    return run([sys.executable, "-m", "cruft", *args], cwd, env=env, timeout=120, check=check)


@pytest.fixture
def template(tmp_path: Path, env: dict[str, str]) -> Path:
    """A git copy of this template's working tree, committed as "v1"."""
    repo = tmp_path / "alps-torch-template"
    shutil.copytree(TEMPLATE_DIR, repo, ignore=COPY_IGNORE)
    git(repo, env, "init", "--quiet", "--initial-branch=main")
    git(repo, env, "add", "--all")
    git(repo, env, "commit", "--quiet", "--no-verify", "-m", "v1")
    return repo


def commit_template_v2(template: Path, env: dict[str, str]) -> None:
    """The template improves: a new preemption warning time in every job script, a new doc."""
    include = template / "templates" / "train.sbatch.j2"
    text = include.read_text()
    assert SIGNAL_V1 in text, "the test's template change no longer applies"
    include.write_text(text.replace(SIGNAL_V1, SIGNAL_V2))
    new_doc = template / "{{cookiecutter.project_slug}}" / NEW_DOC
    new_doc.parent.mkdir(exist_ok=True)
    new_doc.write_text("# New in v2\n")
    git(template, env, "add", "--all")
    git(template, env, "commit", "--quiet", "--no-verify", "-m", "v2")


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{path.name} no longer contains {old!r}: update the test's user edit"
    path.write_text(text.replace(old, new, 1))


def changed_paths(project: Path, env: dict[str, str]) -> set[str]:
    status = run(["git", "status", "--porcelain", "--untracked-files=all"], project, env=env)
    return {line[3:] for line in status.stdout.splitlines()}  # "XY path"


def leftover_conflicts(project: Path) -> list[str]:
    """*.rej files and files with conflict markers anywhere in the project (.git aside)."""
    found = []
    marker = re.compile(rb"^(<<<<<<<|>>>>>>>)( |$)", re.MULTILINE)
    for path in project.rglob("*"):
        rel = path.relative_to(project)
        if rel.parts[0] == ".git" or not path.is_file():
            continue
        if path.suffix == ".rej" or path.name.endswith(".orig") or marker.search(path.read_bytes()):
            found.append(str(rel))
    return found


@pytest.mark.parametrize(
    ("git_init", "flavour"),
    [(False, "uenv"), (True, "both")],
    ids=["git_init-no", "git_init-yes"],
)
def test_update_brings_template_change_and_keeps_user_edits(
    tmp_path: Path, template: Path, env: dict[str, str], git_init: bool, flavour: str
):
    # a directory other than the default is recorded and replayed
    answers = {"git_init": git_init, "env_flavour": flavour, "nodes": "1", "data_dir": DATA_DIR}
    out = tmp_path / "projects"
    out.mkdir()
    created = cruft(
        out,
        env,
        "create",
        "--no-input",
        "--extra-context",
        json.dumps(answers),
        str(template),
    )
    project = out / SLUG
    assert created.stdout.count(STRIPING_NOTE) == 1, created.stdout

    # cruft create recorded the template and the answers
    state = json.loads((project / ".cruft.json").read_text())
    assert Path(state["template"]) == template
    assert state["commit"] == git(template, env, "rev-parse", "HEAD")
    assert {k: state["context"]["cookiecutter"][k] for k in answers} == answers

    if git_init:
        # the hook made the first commit with .cruft.json as cruft then writes it (cruft #155:
        # cruft writes it after the hook), so the fresh repository has nothing to commit
        assert git(project, env, "rev-list", "--count", "HEAD") == "1"
        assert ".cruft.json" in git(project, env, "ls-files").splitlines()
        assert changed_paths(project, env) == set()
        assert CRUFT_JSON_NOTE in created.stdout  # for create --checkout, which it cannot know
    else:
        assert not (project / ".git").exists()
        assert CRUFT_JSON_NOTE not in created.stdout
        # a repository generated before the template asked `workload`: none recorded
        del state["context"]["cookiecutter"]["workload"]
        (project / ".cruft.json").write_text(json.dumps(state, indent=2) + "\n")
        git(project, env, "init", "--quiet", "--initial-branch=main")
        git(project, env, "add", "--all")
        git(project, env, "commit", "--quiet", "--no-verify", "-m", "Generated with cruft")
    # the scratch render of `cruft diff` equals the project: the hook added nothing to it
    cruft(project, env, "diff", "--exit-code")

    # the user's own work, committed
    job = project / "jobs" / f"{JOBS[flavour][0]}.sbatch"
    model = project / "src" / PACKAGE / "models" / "mlp.py"
    edit(job, NODES_V1, NODES_USER)
    edit(model, MODEL_V1, MODEL_USER)
    git(project, env, "commit", "--quiet", "--no-verify", "--all", "-m", "User edits")
    head = git(project, env, "rev-parse", "HEAD")

    commit_template_v2(template, env)
    assert cruft(project, env, "check", check=False).returncode != 0  # behind the template

    updated = cruft(project, env, "update", "--skip-apply-ask")
    # the hook ran in cruft's scratch renders without printing, initialising or committing
    assert STRIPING_NOTE not in updated.stdout and CRUFT_JSON_NOTE not in updated.stdout
    assert git(project, env, "rev-parse", "HEAD") == head
    assert [p.parent for p in project.rglob(".git")] == [project]

    # the template change arrived, in every job script of the flavour and a new file
    for name in JOBS[flavour]:
        script = (project / "jobs" / f"{name}.sbatch").read_text()
        assert SIGNAL_V2 in script and SIGNAL_V1 not in script, name
    dirs = (project / "scripts" / "dirs.sh").read_text()  # the answer's one place
    assert f"data_root() {{ printf '%s\\n' \"{DATA_DIR}\"; }}" in dirs
    assert (project / NEW_DOC).read_text() == "# New in v2\n"
    # the user's edits survived, nothing was left to resolve, nothing else changed
    assert NODES_USER in job.read_text() and NODES_V1 not in job.read_text()
    assert MODEL_USER in model.read_text()
    assert leftover_conflicts(project) == []
    assert git(project, env, "ls-files", "--unmerged") == ""
    assert changed_paths(project, env) == {
        ".cruft.json",
        NEW_DOC,
        *(f"jobs/{name}.sbatch" for name in JOBS[flavour]),
    }
    if flavour == "uenv":
        assert not (project / "Dockerfile").exists()  # unchosen flavour stays removed
    # the repository without a recorded workload is `all` now, with every file it had
    state = json.loads((project / ".cruft.json").read_text())
    assert state["context"]["cookiecutter"]["workload"] == "all"
    assert (project / "configs" / "default.toml").is_file() and (
        project / "docs/training.md"
    ).is_file()

    assert cruft(project, env, "check").returncode == 0
    assert json.loads((project / ".cruft.json").read_text())["commit"] == git(
        template, env, "rev-parse", "HEAD"
    )


def test_link_project_generated_with_plain_cookiecutter(
    tmp_path: Path, template: Path, env: dict[str, str]
):
    """The recipe of docs/template-updates.md: cruft link, then cruft update works."""
    answers = {"git_init": "yes", "env_flavour": "container", "launcher": "torchrun"}
    out = tmp_path / "projects"
    overrides = [f"{k}={v}" for k, v in answers.items()]
    cookiecutter = [
        sys.executable,
        "-m",
        "cookiecutter",
        "--no-input",
        "--output-dir",
        str(out),
    ]
    run([*cookiecutter, str(template), *overrides], tmp_path, env=env)
    project = out / SLUG
    assert git(project, env, "rev-list", "--count", "HEAD") == "1"  # plain cookiecutter: as before

    v1 = git(template, env, "rev-parse", "HEAD")
    commit_template_v2(template, env)  # the template moved on before the project was linked
    link = [
        "link",
        "--no-input",
        "--checkout",
        v1,
        "--extra-context",
        json.dumps(answers),
    ]
    cruft(project, env, *link, str(template))
    state = json.loads((project / ".cruft.json").read_text())
    assert state["commit"] == v1
    cruft(project, env, "diff", "--exit-code")  # linked to the version and answers it came from
    git(project, env, "add", ".cruft.json")
    git(
        project,
        env,
        "commit",
        "--quiet",
        "--no-verify",
        "-m",
        "Link to the template (cruft)",
    )

    assert cruft(project, env, "check", check=False).returncode != 0
    cruft(project, env, "update", "--skip-apply-ask")
    script = (project / "jobs" / "train_container.sbatch").read_text()
    assert SIGNAL_V2 in script and SIGNAL_V1 not in script
    assert leftover_conflicts(project) == []
    assert cruft(project, env, "check").returncode == 0


def test_jinja_answers_through_cruft_run_nothing(
    tmp_path: Path, template: Path, env: dict[str, str]
):
    """An answer is data under cruft too: a Jinja payload given to `cruft create --extra-context`,
    or written into a project's .cruft.json (anyone who can commit to the project can) before
    `cruft update`, is never evaluated: no file is created, the answer is refused."""
    marker = tmp_path / "pwned"
    payload = "{{ cycler.__init__.__globals__.os.popen('touch " + str(marker) + "').read() }}"
    out = tmp_path / "projects"
    out.mkdir()
    given = json.dumps({"description": payload, "git_init": False})
    created = cruft(
        out, env, "create", "--no-input", "--extra-context", given, str(template), check=False
    )
    assert created.returncode != 0 and not marker.exists()
    assert "answers are data, not templates" in created.stdout + created.stderr
    assert list(out.iterdir()) == []

    cruft(
        out,
        env,
        "create",
        "--no-input",
        "--extra-context",
        json.dumps({"git_init": False, "ci": "none"}),
        str(template),
    )
    project = out / SLUG
    state = json.loads((project / ".cruft.json").read_text())
    state["context"]["cookiecutter"]["description"] = payload
    (project / ".cruft.json").write_text(json.dumps(state))
    git(project, env, "init", "--quiet", "--initial-branch=main")
    git(project, env, "add", "--all")
    git(project, env, "commit", "--quiet", "--no-verify", "-m", "A colleague's .cruft.json")
    commit_template_v2(template, env)
    updated = cruft(project, env, "update", "--skip-apply-ask", check=False)
    assert not marker.exists(), updated.stdout + updated.stderr
    assert updated.returncode != 0
    assert "answers are data, not templates" in updated.stdout + updated.stderr


def load_post_gen_hook(tmp_path: Path, answers: dict) -> ModuleType:
    """hooks/post_gen_project.py rendered for `answers` and imported (main() does not run)."""
    return load_hook(tmp_path, "post_gen_project", answers)


def test_hook_detects_cruft_scratch_renders_only(tmp_path: Path, monkeypatch):
    answers = json.loads((TEMPLATE_DIR / "cookiecutter.json").read_text())
    plain = load_post_gen_hook(tmp_path, answers)
    under_cruft = load_post_gen_hook(tmp_path, {**answers, "_commit": "0" * 40})

    scratch = Path(tempfile.mkdtemp())  # where cruft update/diff render: <tmp>/tmpXXXXXXXX/<slug>
    try:
        (scratch / SLUG).mkdir()
        monkeypatch.chdir(scratch / SLUG)
        assert under_cruft.cruft_scratch_render(under_cruft.ANSWERS)
        assert not plain.cruft_scratch_render(plain.ANSWERS)  # plain cookiecutter: never
        (scratch / "other").mkdir()  # an output dir that holds more than the new project
        assert not under_cruft.cruft_scratch_render(under_cruft.ANSWERS)
    finally:
        shutil.rmtree(scratch)

    for chosen in (
        tmp_path / "tmpabcd1234",
        tmp_path,
    ):  # cruft create --output-dir <chosen>
        (chosen / SLUG).mkdir(parents=True, exist_ok=True)
        monkeypatch.chdir(chosen / SLUG)
        assert not under_cruft.cruft_scratch_render(under_cruft.ANSWERS)
