"""Jinja extension that keeps answers data: cookiecutter renders every answer as a Jinja template
before any hook runs, so `description={{ cycler.__init__.__globals__.os.popen('...').read() }}`
would run a command (cookiecutter's own environment is not sandboxed). cookiecutter.json loads
this module through `_extensions`, so it is active wherever the template is rendered: the
cookiecutter command line, a replay file, pytest-cookies, `cruft create` and `cruft update`.

Every string cookiecutter renders without a file name (`from_string`) is checked before Jinja
parses it. The template's own Jinja is trusted: the strings of cookiecutter.json (its derived
defaults such as project_slug), the names of its files and folders, and its hook scripts. Any
other source that contains Jinja syntax is an answer, and it is rendered literally: its text
arrives unchanged at the pre-generation hook, which refuses template syntax in one line
("no template syntax"). Nothing in an answer is evaluated.

The template directory is found on sys.path: cookiecutter appends the template it renders
(`_patch_import_path_for_repo`), and so does cruft (`AltTemporaryDirectory`), which is how this
module itself is imported. It is read again for every environment (cruft renders two versions of
the template from one checkout).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from jinja2 import FileSystemLoader
from jinja2.ext import Extension

MODULE = Path(__file__).name
OPENERS = ("{" + "{", "{" + "%", "{" + "#")  # written split: cookiecutter renders nothing here


def template_root() -> Path:
    """The template being rendered: the newest sys.path entry that holds this module and a
    cookiecutter.json."""
    for entry in reversed(sys.path):
        root = Path(entry or ".")
        if (root / MODULE).is_file() and (root / "cookiecutter.json").is_file():
            return root
    raise RuntimeError(f"{MODULE}: the template directory is not on sys.path")


def _strings(value) -> list[str]:
    """Every string in a JSON value (keys included)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in (*_strings(k), *_strings(v))]
    if isinstance(value, list):
        return [s for item in value for s in _strings(item)]
    return []


def template_sources(root: Path) -> tuple[frozenset[str], frozenset[str]]:
    """(whole sources the template renders: cookiecutter.json's strings and its hooks,
    names of the template's files and folders: what a rendered path is made of)."""
    whole = set(_strings(json.loads((root / "cookiecutter.json").read_text(encoding="utf-8"))))
    hooks = root / "hooks"
    if hooks.is_dir():
        whole.update(p.read_text(encoding="utf-8") for p in hooks.iterdir() if p.is_file())
    names = set()
    for _dirpath, dirnames, filenames in os.walk(root):
        names.update(n for n in (*dirnames, *filenames) if any(o in n for o in OPENERS))
    return frozenset(whole), frozenset(names)


def literal(source: str) -> str:
    """Jinja source that renders to `source` unchanged: every '{' becomes an expression that
    prints '{', so no block, expression or comment can start."""
    return source.replace("{", '{{ "{" }}')


class AnswersAreData(Extension):
    def __init__(self, environment):
        super().__init__(environment)
        starts = (
            environment.block_start_string,
            environment.variable_start_string,
            environment.comment_start_string,
        )
        prefixes = (environment.line_statement_prefix, environment.line_comment_prefix)
        if any(not s.startswith("{") for s in starts) or any(prefixes):
            raise RuntimeError(f"{MODULE} expects Jinja's default delimiters")
        root = template_root()
        self.whole, self.names = template_sources(root)
        # the choice lists of cookiecutter.json, for the pre-generation hook (not in its context)
        defaults = json.loads((root / "cookiecutter.json").read_text(encoding="utf-8"))
        choices = {k: v for k, v in defaults.items() if isinstance(v, list) and k[0] != "_"}
        environment.globals["template_choices"] = choices
        # cookiecutter renders the hooks without a loader (it sets one for the project's files
        # only): what they include (alps_home.py.j2) comes from the template's templates/ too
        if environment.loader is None:
            environment.loader = FileSystemLoader(str(root / "templates"))

    def trusted(self, source: str) -> bool:
        if source in self.whole:
            return True
        # a path of the template: every component with Jinja in it is one of its names
        parts = source.replace(os.sep, "/").split("/")
        return all(p in self.names for p in parts if any(o in p for o in OPENERS))

    def preprocess(self, source: str, name: str | None, filename: str | None = None) -> str:
        if name is not None or filename is not None:  # a template file, read by a loader
            return source
        if not any(o in source for o in OPENERS) or self.trusted(source):
            return source
        return literal(source)
