"""Bad answers are refused before anything is written: one line each, all at once, in the hooks
and through the cookiecutter command line, with nothing left behind; an answer is never
evaluated as a template."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import TEMPLATE_DIR, clean_env, run
from hostile_answers import ACCEPTED_CASES, BAD_ANSWERS, PRE_PROMPT_FIELDS, hostile_table
from template_runs import (
    EMPTY_SLUG_FORM,
    cookiecutter,
    expected_line,
    hook_errors,
    leftovers,
    shown,
)


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
    # workload=audio: a workload this template version does not offer (yet)
    proc = cookiecutter(
        tmp_path / "out", cluster="Daint", ci="GitLab", git_init="maybe", workload="audio"
    )
    errors = [x.split(" = ")[0] for x in proc.stderr.splitlines() if x.startswith("error: ")]
    assert errors == ["error: cluster", "error: ci", "error: git_init", "error: workload"]
    assert "expected one of all, language, images, program" in proc.stderr
    assert leftovers(tmp_path) == []


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


def test_empty_slug_is_explained_once_through_pytest_cookies(cookies, capfd):
    """Baked as a Python caller would (pytest-cookies): the hook's one line names the project
    name, not the three values derived from it."""
    result = cookies.bake(extra_context={"project_name": "!!!"}, template=str(TEMPLATE_DIR))
    assert result.exit_code != 0
    errors = [x for x in capfd.readouterr().err.splitlines() if x.startswith("error: ")]
    assert errors == [f"error: project_name = '!!!' is invalid: expected {EMPTY_SLUG_FORM}"]


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
    replayed = {
        **prompt_for_config(context, no_input=True),
        **{"cluster": "eiger", "ci": "jenkins", "workload": "audio"},
    }
    assert sorted(pre_gen.validate(replayed)) == [
        "ci = 'jenkins' is invalid: expected one of github, gitlab, none",
        "cluster = 'eiger' is invalid: expected one of clariden, daint, santis",
        "workload = 'audio' is invalid: expected one of all, language, images, program",
    ]


HOSTILE_DOC = TEMPLATE_DIR / "docs" / "hostile-answers.md"


TABLE_START = "<!-- table: python3 tests/hostile_answers.py > the lines below -->\n"


TABLE_END = "<!-- end of table -->"


def test_hostile_answers_table_is_current():
    """docs/hostile-answers.md shows exactly the cases the answer tests try: BAD_ANSWERS (this
    module) and ACCEPTED_CASES, each named by a test of tests/test_answers_*.py."""
    tests = "".join(p.read_text() for p in Path(__file__).parent.glob("test_answers_*.py"))
    for _, _, test in ACCEPTED_CASES:
        assert f"\ndef {test}(" in tests, f"{test} is not a test of tests/test_answers_*.py"
    text = HOSTILE_DOC.read_text()
    table = text.split(TABLE_START, 1)[1].split(TABLE_END, 1)[0]
    assert table == hostile_table(), "regenerate the table: python3 tests/hostile_answers.py"


def test_the_hook_and_the_repos_linter_share_how_alps_spells_home(hooks, bake, monkeypatch):
    """`/users/${USER}` and its normalisation are written once, in the template's
    templates/alps_home.py.j2; the pre-generation hook and the generated tools/alps_lint.py
    include it when rendered, so the hook reads no generated file and the linter stands alone."""
    _, pre_gen = hooks
    sources = {
        path: (TEMPLATE_DIR / path).read_text()
        for path in (
            "templates/alps_home.py.j2",
            "hooks/pre_gen_project.py",
            "{{cookiecutter.project_slug}}/tools/alps_lint.py",
        )
    }
    assert {path: text.count('HOME = "/users/${USER}"') for path, text in sources.items()} == {
        "templates/alps_home.py.j2": 1,
        "hooks/pre_gen_project.py": 0,
        "{{cookiecutter.project_slug}}/tools/alps_lint.py": 0,
    }
    assert "importlib" not in sources["hooks/pre_gen_project.py"]  # it loads no file
    assert pre_gen.HOME == "/users/${USER}"
    assert pre_gen.normalised_path("${HOME}/../x//y/.") == "/users/x/y"
    assert pre_gen.path_error("$HOME/") == pre_gen.path_error("/users/${USER}")
    linter = run(
        [sys.executable, "tools/alps_lint.py", "--explain", "EDF-HOME"], cwd=bake("default")
    )
    assert "normalising the path" in linter.stdout  # the baked linter runs on its own
    spec = importlib.util.spec_from_file_location(
        "alps_lint", bake("default") / "tools/alps_lint.py"
    )
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # its dataclasses look it up there
    spec.loader.exec_module(module)
    assert module.HOME == pre_gen.HOME
    for path in ("~", "~/x", "$HOME", "${HOME}/a/../b", "//users//u/./", "$HOMEX/y", "rel/./p", ""):
        assert module.normalised_path(path) == pre_gen.normalised_path(path), path
