"""Bad answers are refused before anything is written; free text is rendered safely."""

from __future__ import annotations

import importlib.util
import json
import random
import re
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest
from conftest import TEMPLATE_DIR, answers, clean_env, load_hook, run
from jinja2 import Environment, FileSystemLoader
from markdown_it import MarkdownIt


def cookiecutter(out: Path, *options: str, **answers: str) -> subprocess.CompletedProcess:
    """Run the cookiecutter CLI as a user would (default: --no-input with these answers).
    Its temporary directory is out/../tmp, so that a template copy left there shows."""
    args = [f"{k}={v}" for k, v in answers.items()]
    tmp = out.parent / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
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
        env={**clean_env(), "TMPDIR": str(tmp)},
    )


# Choice and yes/no answers: cookiecutter checks them while loading cookiecutter.json, before
# the pre-generation hook; hooks/pre_prompt.py checks them first (from the command line).
PRE_PROMPT_FIELDS = ("cluster", "env_flavour", "container_base", "launcher", "ci", "git_init")
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
    # installed with torch or an extra (derived: test_dependency_modules_are_refused)
    ("package_name", "mpmath", "does not shadow"),
    ("package_name", "torchgen", "does not shadow"),
    ("package_name", "dill", "does not shadow"),
    ("package_name", "pyarrow", "does not shadow"),
    ("package_name", "safetensors", "does not shadow"),
    ("package_name", "transformers", "does not shadow"),
    ("package_name", "triton", "does not shadow"),
    ("package_name", "nvidia", "does not shadow"),
    ("package_name", "flash_attn", "does not shadow"),
    ("package_name", "test", "does not shadow"),
    ("package_name", "conftest", "does not shadow"),
    ("package_name", "sitecustomize", "imports at start-up"),
    ("package_name", "usercustomize", "imports at start-up"),
    ("project_name", "two\nlines", "no newlines"),
    ("project_name", LATIN1_NAME, "valid UTF-8"),
    ("project_name", "x" * 101, "at most 100 characters"),
    ("project_name", "!!!", "at least one letter or digit"),
    ("project_name", "Foo ", "no leading or trailing spaces"),
    ("project_name", " Foo", "no leading or trailing spaces"),
    ("project_name", "Foo\u00a0", "no leading or trailing spaces"),  # a no-break space
    ("project_name", "next\u0085line", "control character U+0085"),  # NEL
    ("project_name", "csi\u009b31m", "control character U+009B"),  # a C1 control
    ("project_name", "line\u2028sep", "line separator U+2028"),
    ("project_name", "para\u2029sep", "paragraph separator U+2029"),
    ("project_name", "\ufeffBOM", "format or bidi control character U+FEFF"),
    ("description", "safe \u202etxt.exe", "bidi control character U+202E"),  # RLO
    ("description", "isolate \u2066x\u2069", "bidi control character U+2066"),
    ("description", "zero\u200bwidth", "format or bidi control character U+200B"),
    ("description", "private \ue000", "private-use character U+E000"),
    ("description", "trailing ", "no leading or trailing spaces"),
    ("author_name", "Ada\u200f", "bidi control character U+200F"),  # RLM
    ("author_name", " Ada", "no leading or trailing spaces"),
    ("description", "tab\there", "no newlines, tabs"),
    ("description", "emoji \U0001f600", "printable characters"),
    ("description", "{% raw %}{{ config }}{% endraw %}", "no template syntax"),
    ("description", "{{ '{{' }} x }}", "no template syntax"),
    ("description", "{{ 6 * 7 }}", "no template syntax"),  # never evaluated, not even 6 * 7
    ("author_name", "", "not empty"),
    ("author_email", "not-an-email", "e-mail address"),
    ("author_email", 'a"@b.org', "e-mail address"),
    ("author_email", "a@" + "b" * 250 + ".org", "at most 254 characters"),
    ("author_email", ".a..b.@x.org", "dot-separated words"),  # pip could not install these
    ("author_email", "a.@b.org", "dot-separated words"),
    ("author_email", "a@b..org", "a domain name after it"),
    ("author_email", "a@-x.org", "a domain name after it"),
    ("author_email", "a@localhost", "a domain name after it"),
    ("author_email", "a" * 65 + "@x.org", "at most 64 characters"),
    ("author_email", "ada@example.org ", "e-mail address"),
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
    ("cluster", "Clariden", "in lowercase, as listed"),
    ("launcher", "SRUN", "in lowercase, as listed"),
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
    ("image_dir", "$SCRATCH/images", "${SCRATCH}"),
    ("image_dir", "${IFS}", "${SCRATCH}, ${HOME} or ${STORE}"),
    ("image_dir", "${PATH}/images", "${SCRATCH}, ${HOME} or ${STORE}"),
    ("image_dir", "/x/${IFS}y", "${USER} after the start only"),
    ("data_dir", "${USER}/data", "${SCRATCH}, ${HOME} or ${STORE}"),  # relative
    ("data_dir", "${SCRATCH}data", "${SCRATCH}, ${HOME} or ${STORE}"),
    ("data_dir", "/data/${SCRATCH}", "${USER} after the start only"),
    ("data_dir", "${STORE}/", "not all of it"),
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


def leftovers(tmp_path: Path) -> list[str]:
    """Everything under tmp_path but the empty output and temporary directories (waits for the
    hook's cleaner of a slug's parent directories, which runs once cookiecutter has removed the
    project). A copy of the template left in the temporary directory counts."""
    deadline = time.monotonic() + 10
    while True:
        found = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
        found = [f for f in found if f not in ("out", "tmp")]
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


def expected_line(field: str, value: str) -> str:
    """The start of the hook's line for a bad answer (before the accepted form)."""
    return f"error: {field} = {shown(value)!r} is invalid: expected "


@pytest.fixture(scope="module")
def hooks(tmp_path_factory) -> tuple:
    """(pre_prompt, pre_gen_project): the template's two answer-checking hooks, imported."""
    directory = tmp_path_factory.mktemp("hooks")
    spec = importlib.util.spec_from_file_location(
        "pre_prompt", TEMPLATE_DIR / "hooks" / "pre_prompt.py"
    )
    pre_prompt = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pre_prompt)  # run as it is: cookiecutter does not render this hook
    return pre_prompt, load_hook(directory, "pre_gen_project", answers("default"))


def hook_errors(hooks: tuple, **given: str) -> list[str]:
    """What the hooks print for these command-line answers, in-process: choices and yes/no by
    the pre-prompt hook; the rest by the pre-generation hook, on the answers as cookiecutter
    --no-input hands them over (defaults filled in, Jinja in every answer rendered)."""
    from cookiecutter.generate import generate_context
    from cookiecutter.prompt import prompt_for_config

    pre_prompt, pre_gen = hooks
    defaults = json.loads((TEMPLATE_DIR / "cookiecutter.json").read_text())
    errors = pre_prompt.answer_errors(given, defaults)  # lines as printed
    if errors:
        return errors
    context = generate_context(TEMPLATE_DIR / "cookiecutter.json", extra_context=given)
    return [f"error: {m}" for m in pre_gen.validate(prompt_for_config(context, no_input=True))]


@pytest.mark.parametrize(
    ("field", "value", "form"),
    BAD_ANSWERS,
    ids=[f"{f}-{i}" for i, (f, _, _) in enumerate(BAD_ANSWERS)],
)
def test_bad_answer_alone_is_refused(hooks, field, value, form):
    """Each bad answer, given alone, is refused with one line that shows the accepted form."""
    errors = hook_errors(hooks, **{field: value})
    assert len(errors) == 1 and errors[0].startswith(expected_line(field, value)), errors
    assert form in errors[0]


def test_dependency_modules_are_refused(hooks):
    """No package name shadows a module that torch or one of the package's extras installs
    (pip refuses mpmath beside sympy; `import torch` fails with a package named torchgen): the
    hook holds the derived list (tests/shadowed_names.py), and it is complete here, where
    requirements-dev.txt installs torch and every extra."""
    import shadowed_names

    names, missing = shadowed_names.derived_names()
    assert not missing, f"not installed, cannot derive their modules: {missing}"
    _, pre_gen = hooks
    absent = sorted(names - pre_gen.SHADOWED_MODULES)
    assert not absent, f"the hook would accept {absent}: python3 tests/shadowed_names.py --write"
    assert {"torch", "torchgen", "mpmath", "dill", "pyarrow", "safetensors"} <= names


# The pre-generation hook reports every bad answer at once, so one cookiecutter run tries one
# bad value of several fields: every case of BAD_ANSWERS goes through the command line in a
# few runs instead of one run each. A bad answer is reported once, at itself, not at what
# cookiecutter.json derives from it (the hook's DERIVED_FROM): such fields never share a run.
PATH_FIELDS = ("image_dir", "data_dir", "checkpoint_dir")  # the hook's; default paths hold the slug
HIDES = {
    "project_name": {"project_slug"},  # and, where its slug comes out empty, NAMELESS too
    "project_slug": {"package_name", "__derived_image_sqsh", *PATH_FIELDS},
    "__ngc_pytorch_tag": {"__derived_image_tag", "__derived_base_image", "__derived_image_sqsh"},
    "__alps_extended_tag": {"__derived_image_tag", "__derived_base_image", "__derived_image_sqsh"},
    "__derived_image_tag": {"__derived_image_sqsh"},
    "image_dir": {"__derived_image_sqsh"},
}
# A bad project name comes with a good slug of its own (a name may slugify to a bad slug):
# only a name without letters or digits (its slug comes out empty) hides the slug's answers.
GOOD_SLUG = {"project_slug": "named-apart"}
NAMELESS = {"package_name", "__derived_image_sqsh", *PATH_FIELDS}


def hides(field: str, value: str) -> set[str]:
    hidden = set(HIDES.get(field, ()))
    if field == "project_name" and not any(c.isalnum() for c in value):
        hidden |= NAMELESS
    return hidden


def cli_runs() -> list[list[int]]:
    """BAD_ANSWERS (as indexes) grouped into cookiecutter runs: one value per field a run, no
    field with one it hides, the choice and yes/no fields apart (the pre-prompt hook that checks
    them stops cookiecutter before the pre-generation hook checks the rest)."""
    runs: list[list[int]] = []
    for index, (field, value, _) in enumerate(BAD_ANSWERS):
        for run_ in runs:
            given = [BAD_ANSWERS[i] for i in run_]
            apart = (field in PRE_PROMPT_FIELDS) != (given[0][0] in PRE_PROMPT_FIELDS)
            hidden = any(field in hides(f, v) or f in hides(field, value) for f, v, _ in given)
            if field not in {f for f, _, _ in given} and not apart and not hidden:
                run_.append(index)
                break
        else:
            runs.append([index])
    return runs


CLI_RUNS = cli_runs()


@pytest.mark.parametrize("cases", CLI_RUNS, ids=[f"run{k}" for k in range(len(CLI_RUNS))])
def test_bad_answers_are_refused_on_the_command_line_and_leave_nothing(tmp_path, cases):
    """cookiecutter --no-input with these bad answers: one line each, no
    other error, no traceback but cookiecutter's own report of the failed hook, nothing left."""
    given = [BAD_ANSWERS[i] for i in cases]
    bad = {field: value for field, value, _ in given}
    named = "project_name" in bad and not NAMELESS & hides("project_name", bad["project_name"])
    proc = cookiecutter(tmp_path / "out", **bad, **(GOOD_SLUG if named else {}))
    assert proc.returncode != 0
    errors = [x for x in proc.stderr.splitlines() if x.startswith("error: ")]
    assert len(errors) == len(given), proc.stderr[-3000:]
    for field, value, form in given:
        line = [x for x in errors if x.startswith(expected_line(field, value))]
        assert len(line) == 1 and form in line[0], (field, form, errors)
    if given[0][0] in PRE_PROMPT_FIELDS:  # refused before cookiecutter's own check: no traceback
        assert "Traceback" not in proc.stderr + proc.stdout
        assert proc.stdout.strip() == "Pre-Prompt Hook script failed"  # cookiecutter's one line
    else:  # the only traceback is cookiecutter's own report of the failed hook, after our lines
        assert proc.stderr.count("Traceback") <= 1
        assert "FailedHookException" in proc.stderr or "Traceback" not in proc.stderr
    assert leftovers(tmp_path) == [], "a half-generated repo or a template copy was left behind"


def test_all_errors_reported_at_once(tmp_path):
    proc = cookiecutter(tmp_path / "out", nodes="0", time_limit="x", account="a b")
    errors = [x for x in proc.stderr.splitlines() if x.startswith("error: ")]
    assert {e.split(" = ")[0] for e in errors} == {
        "error: nodes",
        "error: time_limit",
        "error: account",
    }
    proc = cookiecutter(tmp_path / "out", cluster="Daint", ci="GitLab", git_init="maybe")
    errors = [x.split(" = ")[0] for x in proc.stderr.splitlines() if x.startswith("error: ")]
    assert errors == ["error: cluster", "error: ci", "error: git_init"]
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("limit", ["30", "90:00", "01:00:00", "1-0", "1-12:00", "2-00:00:00"])
def test_slurm_time_forms_accepted(hooks, limit):
    """Every form sbatch --time takes is accepted (the bakes render "30" and the default into the
    job scripts)."""
    assert hook_errors(hooks, time_limit=limit) == []


HOSTILE = 'Ada\'s "model" $(touch pwned) `touch pwned2`; rm -rf / \\ & <b> {x}'

# CommonMark with GitHub's tables and strikethrough, as GitHub/GitLab render a README
MARKDOWN = MarkdownIt("commonmark").enable(["table", "strikethrough"])


def markdown_title_and_first_paragraph(readme: Path) -> tuple[str, str]:
    """The text of a rendered README's first heading and first paragraph; fails if either
    holds anything but plain text (a link, emphasis, code, HTML ...) or is not at the top."""
    tokens = MARKDOWN.parse(readme.read_text())
    kinds = [t.type for t in tokens[:6]]
    assert kinds == ["heading_open", "inline", "heading_close"] + [
        "paragraph_open",
        "inline",
        "paragraph_close",
    ], kinds
    assert tokens[0].tag == "h1"
    for inline in (tokens[1], tokens[4]):
        assert [c.type for c in inline.children] == ["text"], inline.children
    return tokens[1].children[0].content, tokens[4].children[0].content


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


def payloads(marker: Path) -> dict[str, str]:
    """Jinja answers that would create `marker` if cookiecutter evaluated them (server-side
    template injection through Jinja's globals), one per free-text field."""
    command = f"touch {marker}"
    return {
        "description": "{{ cycler.__init__.__globals__.os.popen('" + command + "').read() }}",
        "author_name": "{% set x = lipsum.__globals__['os'].popen('" + command + "').read() %}x",
        "partition": "{{ joiner.__init__.__globals__.os.system('" + command + "') }}",
    }


def test_jinja_in_an_answer_is_never_evaluated(tmp_path):
    """An answer is data: cookiecutter would render it as a Jinja template before any hook runs,
    so the template's Jinja extension (alps_torch_template_guard.py) hands it over literally and
    the pre-generation hook refuses it, one line a field. Through the command line and through a
    replay file here; through cruft in tests/test_cruft.py."""
    marker = tmp_path / "pwned"
    given = payloads(marker)
    proc = cookiecutter(tmp_path / "out", **given)
    assert proc.returncode != 0 and not marker.exists()
    errors = [x for x in proc.stderr.splitlines() if x.startswith("error: ")]
    assert sorted(errors) == sorted(
        f"error: {field} = {shown(value)!r} is invalid: expected no template syntax "
        "({{, {%, {#): answers are data, not templates"
        for field, value in given.items()
    ), proc.stderr[-3000:]
    assert leftovers(tmp_path) == []
    # a replay file (cookiecutter --replay-file) with a payload in an answer
    from cookiecutter.generate import generate_context
    from cookiecutter.prompt import prompt_for_config

    replayed = prompt_for_config(generate_context(TEMPLATE_DIR / "cookiecutter.json"), True)
    replayed["description"] = given["description"]
    replay = tmp_path / "replay.json"
    replay.write_text(json.dumps({"cookiecutter": replayed}))
    proc = cookiecutter(tmp_path / "out", "--replay-file", str(replay))
    assert proc.returncode != 0 and not marker.exists()
    assert [x for x in proc.stderr.splitlines() if x.startswith("error: ")] == [
        x for x in errors if x.startswith("error: description = ")
    ]
    assert leftovers(tmp_path) == ["replay.json"]


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


# Hostile answers that are accepted on purpose: (what is tried, what happens, the test).
ACCEPTED_CASES = [
    (
        "free text with quotes, `$(...)`, backticks, `;`, `\\` and `<b>`",
        "accepted as data: TOML strings via JSON escaping, inert in every shell script",
        "test_free_text_is_rendered_safely",
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
    (
        "Markdown in free text: `# x`, `* x`, `1. x`, `> x`, `<script>`, `[x](y)`, backticks, "
        "`|`, `~~x~~`, `$x$`, `&lt;`",
        "accepted and escaped: the README title and description and the docs/answers.md row "
        "render as exactly the text given (checked with a CommonMark parser)",
        "test_markup_in_free_text_renders_as_plain_text",
    ),
    (
        "e-mail forms such as `a.b.c@x.org`, `ada+alps@example.org`, `a_b%c-d@x-y.example.org`, "
        "`ada@xn--bcher-kva.ch`, a 64-character local part, a 63-character domain label",
        "accepted: setuptools builds the package metadata with each (listed and 40 random ones)",
        "test_every_accepted_email_form_builds_package_metadata",
    ),
    (
        "`${SCRATCH}/x`, `${HOME}/data`, `${STORE}/ds`, `/capstor/scratch/cscs/${USER}/r`",
        "accepted: the documented Alps variables, in the place where each makes an absolute path",
        "test_known_variables_in_paths_are_accepted",
    ),
    (
        "`project_name=!!!` with `project_slug=bangs`",
        "accepted: the slug given is used",
        "test_explicit_slug_rescues_a_name_without_letters",
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
        who = "the pre-prompt hook" if field in PRE_PROMPT_FIELDS else "the pre-generation hook"
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


# Text that Markdown reads as markup, each given as project name and description.
MARKUP = [
    "# heading",
    "## two",
    "Title #",
    "* item",
    "- item",
    "+ item",
    "1. item",
    "2024) item",
    "> quote",
    "---",
    "===",
    "***",
    "<script>alert(1)</script>",
    "<!-- hidden -->",
    "<b>bold</b>",
    "[x](https://example.org)",
    "![img](x.png)",
    "[ref]: https://example.org",
    "<https://example.org>",
    "`code` and ``more``",
    "```",
    "~~~",
    "~~struck~~",
    "*em* **strong** _u_ __uu__",
    "a | b | c",
    "| a |",
    "&lt;escaped&gt; &amp; &#60;",
    "back\\slash\\",
    "\\*not\\*",
    "$x^2$ math",
    "[^1] footnote",
    "C# and F#",
    "v1.0 of 2024. Final)",
]


def render_markdown_template(source: str, **values: str) -> str:
    """Render Jinja source that imports templates/markdown.j2, as cookiecutter would."""
    env = Environment(loader=FileSystemLoader(str(TEMPLATE_DIR / "templates")))
    header = '{%- from "markdown.j2" import inert -%}\n'
    return env.from_string(header + source).render(**values)


@pytest.mark.parametrize("text", MARKUP, ids=[f"markup-{i}" for i in range(len(MARKUP))])
def test_markup_in_free_text_renders_as_plain_text(tmp_path, text):
    """The README's title and description lines and an answers.md table row, rendered by a
    CommonMark parser: exactly the answer as text, no heading, list, link, HTML or code."""
    readme = tmp_path / "README.md"
    readme.write_text(
        render_markdown_template(
            "# {{ inert(name) }}\n\n{{ inert(description) }}\n\nThis repository trains.\n",
            name=text,
            description=text,
        )
    )
    assert markdown_title_and_first_paragraph(readme) == (text, text)
    table = render_markdown_template(
        "| answer | value |\n|---|---|\n| `description` | {{ inert(d, line_start=false) }} |\n",
        d=text,
    )
    tokens = MARKDOWN.parse(table)
    cells = [t for t in tokens if t.type == "inline"]
    assert [c.content for c in cells[:2]] == ["answer", "value"]
    assert len(cells) == 4, [c.content for c in cells]  # still one row of two cells
    assert [c.type for c in cells[3].children] == ["text"], cells[3].children
    assert cells[3].children[0].content == text


def test_baked_readme_and_answers_doc_show_markup_as_text(tmp_path):
    """Through the cookiecutter CLI: the generated README and docs/answers.md."""
    name, description = "<b>x</b> # [y](z)", "1. <script>alert(1)</script> *a* `b` | c ~~d~~"
    out = tmp_path / "out"
    proc = cookiecutter(
        out, project_name=name, description=description, author_name="_Ada_", git_init="no"
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (repo,) = out.iterdir()
    assert markdown_title_and_first_paragraph(repo / "README.md") == (name, description)
    tokens = MARKDOWN.parse((repo / "docs" / "answers.md").read_text())
    cells = [t.children for t in tokens if t.type == "inline"]
    shown = {}
    for key_cell, value_cell in zip(cells, cells[1:], strict=False):
        if key_cell and key_cell[0].type == "code_inline":
            shown[key_cell[0].content] = value_cell
    for key, value in [("project_name", name), ("description", description)]:
        assert [c.type for c in shown[key]] == ["text"], shown[key]
        assert shown[key][0].content == value
    assert [c.content for c in shown["author_name"]] == ["_Ada_"]


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


EMPTY_SLUG_FORM = (
    "a name with at least one letter or digit: the repository name project_slug is derived "
    "from it and came out empty (or give project_slug=my-project too)"
)


def test_empty_slug_is_explained_once_through_pytest_cookies(cookies, capfd):
    """Baked as a Python caller would (pytest-cookies): the hook's one line names the project
    name, not the three values derived from it."""
    result = cookies.bake(extra_context={"project_name": "!!!"}, template=str(TEMPLATE_DIR))
    assert result.exit_code != 0
    errors = [x for x in capfd.readouterr().err.splitlines() if x.startswith("error: ")]
    assert errors == [f"error: project_name = '!!!' is invalid: expected {EMPTY_SLUG_FORM}"]


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


def test_a_failed_bake_leaves_no_template_copy_in_the_temporary_directory(tmp_path):
    """cookiecutter copies a template with a pre_prompt hook into the temporary directory and
    removes the copy only after a successful generation; both hooks remove it on failure."""
    for bad in ({"cluster": "Eiger"}, {"nodes": "0"}):
        proc = cookiecutter(tmp_path / "out", **bad)
        assert proc.returncode != 0
        assert leftovers(tmp_path) == [], bad
    proc = cookiecutter(tmp_path / "out", git_init="no")
    assert proc.returncode == 0, proc.stderr[-2000:]
    deadline = time.monotonic() + 30  # the hook's detached cleaner removes the empty holder
    while list((tmp_path / "tmp").glob("cookiecutter*")) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert list((tmp_path / "tmp").glob("cookiecutter*")) == []


def test_empty_slug_in_the_current_directory_is_explained_by_the_hook(tmp_path):
    """Without -o cookiecutter generates into the current directory: an empty slug made it stop
    with "... directory already exists" before any hook; now the hook's line explains it."""
    work = tmp_path / "work"
    work.mkdir()
    (tmp_path / "tmp").mkdir()
    proc = subprocess.run(
        [sys.executable, "-m", "cookiecutter", "--no-input", str(TEMPLATE_DIR), "project_name=?!"],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=120,
        env={**clean_env(), "TMPDIR": str(tmp_path / "tmp")},
    )
    assert proc.returncode == 1
    errors = [x for x in proc.stderr.splitlines() if x.startswith("error: ")]
    assert errors == [f"error: project_name = '?!' is invalid: expected {EMPTY_SLUG_FORM}"]
    assert "already exists" not in proc.stdout + proc.stderr
    assert list(work.iterdir()) == [] and list((tmp_path / "tmp").iterdir()) == []


def test_the_pre_generation_hook_takes_its_choices_from_cookiecutter_json(hooks):
    """A replay file or cruft hands answers past cookiecutter's own choice check: the hook
    refuses a choice cookiecutter.json does not list, and knows the lists from there alone."""
    _, pre_gen = hooks
    lists = {
        k: v
        for k, v in json.loads((TEMPLATE_DIR / "cookiecutter.json").read_text()).items()
        if isinstance(v, list) and not k.startswith("_")
    }
    assert pre_gen.CHOICES == lists and "cluster" in lists
    from cookiecutter.generate import generate_context
    from cookiecutter.prompt import prompt_for_config

    context = generate_context(TEMPLATE_DIR / "cookiecutter.json")
    replayed = {**prompt_for_config(context, no_input=True), "cluster": "eiger", "ci": "jenkins"}
    assert sorted(pre_gen.validate(replayed)) == [
        "ci = 'jenkins' is invalid: expected one of github, gitlab, none",
        "cluster = 'eiger' is invalid: expected one of clariden, daint, santis",
    ]


def test_the_hook_reads_how_alps_spells_home_from_the_repos_linter(hooks):
    """`/users/${USER}` and its normalisation are written once, in tools/alps_lint.py of the
    generated repo; the pre-generation hook loads them from there."""
    _, pre_gen = hooks
    linter = (TEMPLATE_DIR / "{{cookiecutter.project_slug}}" / "tools" / "alps_lint.py").read_text()
    assert linter.count('HOME = "/users/${USER}"') == 1
    assert "/users/${USER}" not in (TEMPLATE_DIR / "hooks" / "pre_gen_project.py").read_text()
    assert pre_gen.HOME == "/users/${USER}"
    assert pre_gen.normalised_path("${HOME}/../x//y/.") == "/users/x/y"
    assert pre_gen.path_error("$HOME/") == pre_gen.path_error("/users/${USER}")
