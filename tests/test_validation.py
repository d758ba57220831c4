"""Bad answers are refused before anything is written; free text is rendered safely."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest
from conftest import TEMPLATE_DIR, clean_env, run


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


# Refused by cookiecutter itself (choice and boolean answers), before any hook runs.
COOKIECUTTER_REFUSES = {
    "cluster": "{value} provided for choice variable cluster",
    "env_flavour": "{value} provided for choice variable env_flavour",
    "container_base": "{value} provided for choice variable container_base",
    "launcher": "{value} provided for choice variable launcher",
    "ci": "{value} provided for choice variable ci",
    "git_init": "{value} provided for variable git_init could not be converted to a boolean",
}
LATIN1_NAME = "caf\udce9"  # the byte 0xE9 (Latin-1 e-acute) as Python passes it on undecoded
LONG = "x" * 300

# (field, bad value, a phrase of the accepted form the message must show). This list is also
# the table of docs/hostile-answers.md (test_hostile_answers_table_is_current).
BAD_ANSWERS = [
    ("project_slug", "My Project", "lowercase letters and digits"),
    ("project_slug", "x" * 65, "at most 64 characters"),
    ("project_slug", "a/b", "lowercase letters and digits"),
    ("project_slug", "../escape", "lowercase letters and digits"),
    ("package_name", "1abc", "Python identifier"),
    ("package_name", "a" * 256, "at most 64 characters"),
    ("package_name", "json", "does not shadow"),
    ("package_name", "class", "does not shadow"),
    ("package_name", "pip", "does not shadow"),
    ("package_name", "setuptools", "does not shadow"),
    ("package_name", "pytest", "does not shadow"),
    ("package_name", "matplotlib", "does not shadow"),
    ("package_name", "triton", "does not shadow"),
    ("package_name", "nvidia", "does not shadow"),
    ("package_name", "flash_attn", "does not shadow"),
    ("package_name", "test", "does not shadow"),
    ("package_name", "conftest", "does not shadow"),
    ("project_name", "two\nlines", "no newlines"),
    ("project_name", LATIN1_NAME, "valid UTF-8"),
    ("project_name", "x" * 101, "at most 100 characters"),
    ("description", "tab\there", "no newlines, tabs"),
    ("description", "emoji \U0001f600", "printable characters"),
    ("description", "{% raw %}{{ config }}{% endraw %}", "no template syntax"),
    ("description", "{{ '{{' }} x }}", "no template syntax"),
    ("author_name", "", "not empty"),
    ("author_email", "not-an-email", "e-mail address"),
    ("author_email", 'a"@b.org', "e-mail address"),
    ("author_email", "a@" + "b" * 250 + ".org", "at most 254 characters"),
    ("account", "a-g34; rm -rf ~", "Slurm account"),
    ("account", "$(id)", "Slurm account"),
    ("account", "a" * 65, "at most 64 characters"),
    ("partition", "normal\n#SBATCH --environment=x", "partition name"),
    ("partition", "", "partition name"),
    ("__derived_base_image", "nvcr.io/nvidia/pytorch:25.06-py3\nRUN id", "derived from"),
    ("__derived_image_sqsh", '/x/p+25.06.sqsh"; $(id)', "derived: <image_dir>"),
    ("__derived_image_tag", "../../etc", "derived from __ngc_pytorch_tag"),
    ("_lustre_layout", "-c 1 $(touch /tmp/x)", "lfs setstripe options"),
    ("_lustre_layout", "-c ٣٢", "lfs setstripe options"),
    ("cluster", "eiger", "one of clariden, daint, santis"),
    ("env_flavour", "docker", "one of container, uenv, both"),
    ("container_base", "ubuntu", "one of ngc, alps-extended"),
    ("launcher", "mpirun", "one of srun, torchrun"),
    ("ci", "jenkins", "one of github, gitlab, none"),
    ("git_init", "maybe", "true or false"),
    ("__ngc_pytorch_tag", "latest", "YY.MM"),
    ("__ngc_pytorch_tag", "\u0662\u0665.\u0660\u0666", "YY.MM"),  # Arabic-Indic digits
    ("__alps_extended_tag", "26.02", "YY.MM-py3-alpsN"),
    ("__uenv_image", "pytorch", "name/version[:tag]"),
    ("__uenv_image", "pytorch/v2.9.1:v1`id`", "name/version[:tag]"),
    ("nodes", "0", "whole number of nodes"),
    ("nodes", "-2", "whole number of nodes"),
    ("nodes", "two", "whole number of nodes"),
    ("nodes", "\uff11", "whole number of nodes"),  # a full-width digit one
    ("time_limit", "0", "Slurm time limit"),
    ("time_limit", "1:60:00", "Slurm time limit"),
    ("time_limit", "1-24", "Slurm time limit"),
    ("time_limit", "one hour", "Slurm time limit"),
    ("time_limit", "\u0661\u0662", "Slurm time limit"),  # Arabic-Indic 12
    ("time_limit", "99999999999999999999", "at most 16 characters"),
    ("time_limit", "8-00:00:00", "1 minute to 7 days"),
    ("image_dir", "$SCRATCH/images", "${VAR}"),
    ("image_dir", "/iopsstor", "shared or system root"),
    ("data_dir", "relative/data", "absolute path"),
    ("data_dir", '/scratch/"quoted"', "absolute path"),
    ("data_dir", "/", "shared or system root"),
    ("data_dir", "//users", "shared or system root"),
    ("data_dir", "/users", "shared or system root"),
    ("data_dir", "${HOME}", "whole home directory"),
    ("data_dir", "${HOME}/.", "whole home directory"),
    ("data_dir", "/users/${USER}/..", "without '..'"),
    ("data_dir", "${SCRATCH}/../..", "without '..'"),
    ("data_dir", "/" + LONG, "at most 255 characters"),
    ("checkpoint_dir", "/capstor/$(whoami)/runs", "absolute path"),
    ("checkpoint_dir", "/capstor/my runs", "absolute path"),
    ("checkpoint_dir", "/users/someone", "whole home directory"),
    ("checkpoint_dir", "/users/${USER}", "whole home directory"),
    ("checkpoint_dir", "/capstor/scratch/cscs", "shared or system root"),
    ("checkpoint_dir", "/capstor/store/cscs/swissai", "a shared root"),
]


def shown(value: str) -> str:
    """How the hook prints a value: lone surrogates escaped, long values cut."""
    value = value.encode("utf-8", "backslashreplace").decode()
    return value[:60] + f"... ({len(value)} characters)" if len(value) > 80 else value


def rendered(value: str) -> str:
    """The value after cookiecutter's Jinja rendering (what the hook sees)."""
    return {
        "{% raw %}{{ config }}{% endraw %}": "{{ config }}",
        "{{ '{{' }} x }}": "{{ x }}",
    }.get(value, value)


def leftovers(tmp_path: Path) -> list[str]:
    """Everything under tmp_path but the empty output directory (waits for the hook's cleaner
    of a slug's parent directories, which runs once cookiecutter has removed the project)."""
    deadline = time.monotonic() + 10
    while True:
        found = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
        if found in ([], ["out"]) or time.monotonic() > deadline:
            return [f for f in found if f != "out"]
        time.sleep(0.1)


@pytest.mark.parametrize(
    ("field", "value", "form"),
    BAD_ANSWERS,
    ids=[f"{f}-{i}" for i, (f, _, _) in enumerate(BAD_ANSWERS)],
)
def test_bad_answer_is_refused_and_leaves_nothing(tmp_path, field, value, form):
    out = tmp_path / "out"
    proc = cookiecutter(out, **{field: value})
    assert proc.returncode != 0
    if field in COOKIECUTTER_REFUSES:
        assert COOKIECUTTER_REFUSES[field].format(value=value) in proc.stderr, proc.stderr
    else:
        message = f"error: {field} = {shown(rendered(value))!r} is invalid: expected "
        assert message in proc.stderr, proc.stderr[-3000:]
        line = next(x for x in proc.stderr.splitlines() if x.startswith(f"error: {field} = "))
        assert form in line
        # the only traceback is cookiecutter's own report of the failed hook, after our lines
        assert proc.stderr.count("Traceback") <= 1
        assert "FailedHookException" in proc.stderr or "Traceback" not in proc.stderr
    assert leftovers(tmp_path) == [], "a half-generated repo was left behind"


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


def test_answers_are_rendered_by_cookiecutter_first(tmp_path):
    """cookiecutter evaluates Jinja in an answer before any hook sees it (README: what the
    template can and cannot guarantee): the expression's result is what gets validated."""
    out = tmp_path / "out"
    proc = cookiecutter(out, description="{{ 6 * 7 }}", git_init="no")
    assert proc.returncode == 0, proc.stderr[-2000:]
    project = tomllib.loads((out / "alps-torch-project" / "pyproject.toml").read_text())
    assert project["project"]["description"] == "42"


@pytest.mark.parametrize("flag", ["yes", "no", "true", "false"])
def test_git_init_accepts_old_yes_no(tmp_path, flag):
    """git_init is a boolean; "yes"/"no" from older .cruft.json files still work."""
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


# Hostile answers that are accepted on purpose: (what is tried, what happens, the test).
ACCEPTED_CASES = [
    (
        "free text with quotes, `$(...)`, backticks, `;`, `\\` and `<b>`",
        "accepted as data: TOML strings via JSON escaping, inert in every shell script",
        "test_free_text_is_rendered_safely",
    ),
    (
        "`description={{ 6 * 7 }}` (any Jinja expression, prompted or with `--no-input`)",
        "cookiecutter evaluates it before any hook runs: the project gets `42`. Expressions run "
        "with your rights; the hook refuses only what still looks like template syntax after",
        "test_answers_are_rendered_by_cookiecutter_first",
    ),
    (
        "`author_name=.` or `<>` with no git identity configured",
        "the project is kept; the first commit is authored by "
        "`alps-torch-template <alps-torch-template@localhost>` and the hook says so",
        "test_first_commit_without_git_identity",
    ),
    (
        '`git_init="yes"`/`"no"` (from an older `.cruft.json`)',
        "accepted: cookiecutter turns them into true/false",
        "test_git_init_accepts_old_yes_no",
    ),
]


def code(value: str) -> str:
    """A value as a Markdown code span in a table cell."""
    text = repr(value if len(value) <= 40 else value[:12])
    if len(value) > 40:
        text += f" + ... ({len(value)} characters)"
    fence = "``" if "`" in text else "`"
    return f"{fence} {text} {fence}".replace("|", "\\|")


def hostile_table() -> str:
    """The table of docs/hostile-answers.md, made from BAD_ANSWERS and ACCEPTED_CASES."""
    rows = ["| answer | tried | what happens |", "|---|---|---|"]
    for field, value, form in BAD_ANSWERS:
        who = "cookiecutter" if field in COOKIECUTTER_REFUSES else "the pre-generation hook"
        rows.append(f"| `{field}` | {code(value)} | refused by {who}: expected ...{form}... |")
    for tried, outcome, _ in ACCEPTED_CASES:
        rows.append(f"| | {tried} | {outcome} |")
    return "\n".join(rows) + "\n"


HOSTILE_DOC = TEMPLATE_DIR / "docs" / "hostile-answers.md"
TABLE_START = "<!-- table: python3 tests/test_validation.py > the lines below -->\n"
TABLE_END = "<!-- end of table -->"


def test_hostile_answers_table_is_current():
    """docs/hostile-answers.md shows exactly the cases this module tests."""
    for _, _, test in ACCEPTED_CASES:
        assert callable(globals().get(test)), f"{test} is not a test of this module"
    text = HOSTILE_DOC.read_text()
    table = text.split(TABLE_START, 1)[1].split(TABLE_END, 1)[0]
    assert table == hostile_table(), "regenerate the table: python3 tests/test_validation.py"


if __name__ == "__main__":
    print(hostile_table(), end="")


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
    assert total == 19  # the image tags are `__` settings, not asked
    doc = (tmp_path / "out" / "alps-torch-project" / "docs" / "answers.md").read_text()
    assert f"| `env_flavour` | {flavour} |" in doc
