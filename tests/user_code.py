"""A user's own code added to a copy of a bake as a docs page of the generated repo shows it
(docs/your-model.md, docs/data.md, docs/your-data.md): what tests/test_new_model.py,
tests/test_new_data_format.py and tests/test_your_data.py share."""

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


def add_from_docs(
    baked: Path, repo: Path, page: str, module: str, registry: str, after: str, *more: tuple
):
    """Copy the bake to `repo` and add what docs/<page> shows: the ```python block after
    `<!-- file: <module> -->` becomes the package's <module>, the one after
    `<!-- registry line: <registry> -->` goes into <registry> after the line that starts with
    `after`; `more`: further (module, registry, after) of the same page, or (page, module,
    registry, after) of another. No other file of the package changes, one line is added to each
    registry; returns the package name."""
    shutil.copytree(baked, repo, ignore=shutil.ignore_patterns(".git", "__pycache__"))
    (package,) = [p.name for p in (repo / "src").iterdir() if (p / "__init__.py").exists()]
    src = repo / "src" / package
    before = digests(src)
    added = [(page, module, registry, after), *((page, *m) if len(m) == 3 else m for m in more)]
    for new_page, new_module, new_registry, new_after in added:
        docs = (repo / "docs" / new_page).read_text()
        (src / new_module).write_text(code_after(docs, f"<!-- file: {new_module} -->"))
        lines = (src / new_registry).read_text().splitlines(keepends=True)
        (line,) = [i for i, text in enumerate(lines) if text.strip().startswith(new_after)]
        lines.insert(line + 1, code_after(docs, f"<!-- registry line: {new_registry} -->"))
        (src / new_registry).write_text("".join(lines))
        # one line, none edited
        assert len((src / new_registry).read_text().splitlines()) == len(lines)
    now = digests(src)
    changed = {name for name in now if before.get(name) != now[name]}
    assert changed == {name for added_file in added for name in added_file[1:3]}
    return package


def python(repo: Path, package: str, *args: str, check: bool = True):
    """`python -m <package> ARGS` in the repo, the package imported from its src/."""
    cmd = [sys.executable, "-m", package, *args]
    return run(cmd, cwd=repo, env=package_env(repo), timeout=300, check=check)


def torchrun(repo: Path, package: str, *args: str):
    """`python -m <package> ARGS` on two ranks of this machine (torchrun)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    return run([*cmd, "-m", package, *args], cwd=repo, env=package_env(repo), timeout=300)
