"""A user's own code added to a copy of a bake as a docs page of the generated repo shows it
(docs/your-model.md, docs/data.md): what tests/test_new_model.py and
tests/test_new_data_format.py share."""

from __future__ import annotations

import hashlib
import shutil
import sys
from pathlib import Path

from conftest import package_env, run


def code_after(text: str, mark: str) -> str:
    """The ```python block that follows `mark` in the docs page."""
    return text.split(mark, 1)[1].split("```python\n", 1)[1].split("```", 1)[0]


def digests(src: Path) -> dict[str, str]:
    return {
        str(p.relative_to(src)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(src.rglob("*.py"))
    }


def add_from_docs(baked: Path, repo: Path, page: str, module: str, registry: str, after: str):
    """Copy the bake to `repo` and add what docs/<page> shows: the ```python block after
    `<!-- file: <module> -->` becomes the package's <module>, the one after
    `<!-- registry line: <registry> -->` goes into <registry> after the line that starts with
    `after`. No other file of the package changes, one line is added; returns the package name."""
    shutil.copytree(baked, repo, ignore=shutil.ignore_patterns(".git", "__pycache__"))
    (package,) = [p.name for p in (repo / "src").iterdir() if (p / "__init__.py").exists()]
    src = repo / "src" / package
    before = digests(src)
    docs = (repo / "docs" / page).read_text()
    (src / module).write_text(code_after(docs, f"<!-- file: {module} -->"))
    lines = (src / registry).read_text().splitlines(keepends=True)
    (line,) = [i for i, text in enumerate(lines) if text.strip().startswith(after)]
    lines.insert(line + 1, code_after(docs, f"<!-- registry line: {registry} -->"))
    (src / registry).write_text("".join(lines))
    now = digests(src)
    assert {name for name in now if before.get(name) != now[name]} == {module, registry}
    assert len((src / registry).read_text().splitlines()) == len(lines)  # one line, none edited
    return package


def python(repo: Path, package: str, *args: str, check: bool = True):
    """`python -m <package> ARGS` in the repo, the package imported from its src/."""
    cmd = [sys.executable, "-m", package, *args]
    return run(cmd, cwd=repo, env=package_env(repo), timeout=300, check=check)
