"""The top-level modules that torch and the generated package's dependencies and extras install:
a package named like one of them would shadow it (`pip install -e` puts src/ on sys.path), or
pip would refuse to install it beside it (mpmath, torchgen, dill, pyarrow ...).

The pre-generation hook cannot derive this list (the machine that runs cookiecutter need not
have torch), so it holds a copy, written by this script and checked against the installed
distributions by tests/test_answers_refused.py:

    python3 tests/shadowed_names.py            # print the derived names
    python3 tests/shadowed_names.py --write    # rewrite the block in hooks/pre_gen_project.py

Run it in the test environment (requirements-dev.txt installs torch and every extra).
"""

from __future__ import annotations

import re
import sys
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

TEMPLATE_DIR = Path(__file__).resolve().parent.parent
HOOK = TEMPLATE_DIR / "hooks" / "pre_gen_project.py"
PYPROJECT = TEMPLATE_DIR / "{{cookiecutter.project_slug}}" / "pyproject.toml"
BEGIN, END = "# BEGIN derived by tests/shadowed_names.py", "# END derived"


def package_requirements() -> list[Requirement]:
    """The generated pyproject's dependencies and every extra's, as Requirements (torch first).
    Read as text: the file is a Jinja template; its tags (which workload keeps an extra) are
    dropped, so that the names are every workload's together."""
    text = PYPROJECT.read_text(encoding="utf-8")
    requirements = []
    for table in ("dependencies = [", "[project.optional-dependencies]"):
        block = text.split(table, 1)[1].split("\n[", 1)[0].split("\n]", 1)[0]
        block = re.sub(r"{%.*?%}", "", block)  # a tag quotes a workload's name, not a package
        block = re.sub(r"#.*", "", block)  # comments may quote names too
        requirements += [Requirement(r) for r in re.findall(r'"([^"]+)"', block)]
    return [r for r in requirements if not r.marker or r.marker.evaluate()]


def top_level_modules(dist: metadata.Distribution) -> set[str]:
    """The importable top-level names a distribution installs."""
    names = set()
    for file in dist.files or ():
        parts = file.parts
        if not parts or parts[0] in ("..", "__pycache__") or ".dist-info" in parts[0]:
            continue
        if parts[0].endswith((".data", ".pth", ".egg-link")):
            continue
        name = parts[0].split(".", 1)[0] if len(parts) == 1 else parts[0]
        if len(parts) > 1 or parts[0].endswith((".py", ".so", ".pyd")):
            if name.isidentifier():
                names.add(name)
    top_level = dist.read_text("top_level.txt") or ""
    names.update(n.strip() for n in top_level.split() if n.strip().isidentifier())
    return names


def derived_names() -> tuple[set[str], list[str]]:
    """(module names, requirements that are not installed here) over the dependency closure of
    the package's requirements, extras included."""
    names, missing, seen = set(), [], set()
    todo = [(req, frozenset(req.extras)) for req in package_requirements()]
    while todo:
        req, extras = todo.pop()
        key = (req.name.lower().replace("_", "-"), extras)
        if key in seen:
            continue
        seen.add(key)
        try:
            dist = metadata.distribution(req.name)
        except metadata.PackageNotFoundError:
            missing.append(req.name)
            continue
        names |= top_level_modules(dist)
        for text in dist.requires or ():
            sub = Requirement(text)
            if sub.marker is None or any(
                sub.marker.evaluate({"extra": extra}) for extra in (*extras, "")
            ):
                todo.append((sub, frozenset(sub.extras)))
    return names, sorted(set(missing))


def hook_block() -> set[str]:
    """The names the hook holds between BEGIN and END."""
    text = HOOK.read_text(encoding="utf-8")
    block = text.split(BEGIN, 1)[1].split(END, 1)[0]
    return set(re.findall(r'"([A-Za-z_][A-Za-z0-9_]*)"', block))


def render_block(names: set[str]) -> str:
    lines, line = [], "    "
    for name in sorted(names, key=str.lower):
        item = f'"{name}", '
        if len(line) + len(item) > 99:
            lines.append(line.rstrip())
            line = "    "
        line += item
    lines.append(line.rstrip())
    header = BEGIN + " --write (torch + every extra)\n# fmt: off\n"
    body = "DEPENDENCY_MODULES = frozenset({\n" + "\n".join(lines) + "\n})\n# fmt: on\n"
    return header + body + END


def main(argv: list[str]) -> int:
    names, missing = derived_names()
    if missing:
        missing_list = ", ".join(missing)
        print(
            f"error: not installed: {missing_list} (pip install -r requirements-dev.txt)",
            file=sys.stderr,
        )
        return 2
    if "--write" in argv:
        text = HOOK.read_text(encoding="utf-8")
        start, end = text.index(BEGIN), text.index(END) + len(END)
        HOOK.write_text(text[:start] + render_block(names) + text[end:], encoding="utf-8")
        print(f"wrote {len(names)} names into {HOOK.relative_to(TEMPLATE_DIR)}")
    else:
        print("\n".join(sorted(names)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
