"""What the tests of the `language` and `images` bakes share (tests/test_bake_language.py,
tests/test_bake_images.py): a bake of one training workload is complete. Every module of its
package imports, and importing all of them loads none of the other workload's libraries;
`python -m <pkg> --help` and each listed command's `--help` answer (in one process: the same
`cli.main` a user's command line calls); its generated tests collect, and its layout and config
tests pass (one pytest process: test_layout.py, and test_config*.py, which check
configs/default.toml and docs/training.md's table of keys against the code, both of which differ
per bake); its pyproject names none of the other workload's libraries. The bake's other
generated tests run in the default bake (`all`), which holds the same files: a generated test
runs in one bake only (tests/test_training_package.py)."""

from __future__ import annotations

import json
import os
import re
import sys
import tomllib
from pathlib import Path

from conftest import package_env, run

# A pytest plugin (`-p bake_probe`) for a run inside the bake: before the tests are collected,
# import every module, then `--help` for the command list and for every command; writes what it
# found as JSON to $BAKE_PROBE_OUT. One interpreter then also collects every test file and runs
# the selected ones: torch (and transformers) are imported once, not twice.
PROBE = """
import contextlib, importlib, io, json, os, pathlib, sys


def pytest_configure(config):
    package = os.environ["BAKE_PROBE_PACKAGE"]
    src = pathlib.Path("src") / package
    for path in sorted(src.rglob("*.py")):
        if path.name != "__main__.py":
            name = ".".join(path.relative_to("src").with_suffix("").parts)
            importlib.import_module(name.removesuffix(".__init__"))
    cli = importlib.import_module(package + ".cli")
    commands = importlib.import_module(package + ".commands").COMMANDS
    helps = {}
    for argv in (["--help"], *([name, "--help"] for name in commands)):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            try:
                status = cli.main(argv)
            except SystemExit as exit:
                status = exit.code
        helps[" ".join(argv)] = [status, out.getvalue()]
    found = {"modules": sorted(sys.modules), "commands": list(commands), "helps": helps}
    pathlib.Path(os.environ["BAKE_PROBE_OUT"]).write_text(json.dumps(found))
"""


def check_complete(
    repo: Path, absent: tuple[str, ...], tmp_path: Path, unsaid: tuple[str, ...]
) -> list[str]:
    """Asserts the bake is complete (this module's docstring), and that no `--help` names a word
    of `unsaid` (what the bake lacks); returns its command names."""
    package = repo.name.replace("-", "_")
    probe = tmp_path / "probe"
    probe.mkdir()
    (probe / "bake_probe.py").write_text(PROBE)
    env = package_env(repo)
    env["PYTHONPATH"] += os.pathsep + str(probe)
    env.update(BAKE_PROBE_PACKAGE=package, BAKE_PROBE_OUT=str(probe / "found.json"))
    # every test file collects (an import error fails the run); the layout and config tests run
    selected = "test_layout or test_config"
    layout = run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "bake_probe"]
        + ["-k", selected],
        cwd=repo,
        env=env,
        timeout=300,
    )
    assert re.search(r"\d+ passed, \d+ deselected in", layout.stdout), layout.stdout[-2000:]
    found = json.loads((probe / "found.json").read_text())
    loaded = {name.split(".")[0] for name in found["modules"]} & set(absent)
    assert not loaded, f"importing the package loaded {sorted(loaded)}"
    for argv, (status, text) in found["helps"].items():
        assert status in (0, None) and text.startswith(f"usage: python -m {package}"), argv
    said = {(argv, w) for argv, (_, text) in found["helps"].items() for w in unsaid if w in text}
    assert not said, sorted(said)
    listed = found["helps"]["--help"][1]
    assert "{" + ",".join(found["commands"]) + "}" in listed
    project = tomllib.loads((repo / "pyproject.toml").read_text())["project"]
    requirements = [*project["dependencies"]]
    requirements += [r for extra in project["optional-dependencies"].values() for r in extra]
    named = {r.split(">")[0].split("=")[0].split(";")[0].strip() for r in requirements}
    assert not named & set(absent), sorted(named & set(absent))
    return found["commands"]


def part_tests(repo: Path, post_gen_hook, part: str) -> list[str]:
    """The generated test files of one part of the hook's table that the bake holds."""
    return sorted(
        path
        for path in post_gen_hook.WORKLOAD_PARTS[part]
        if path.startswith("tests/test_") and (repo / path).is_file()
    )
