"""What the tests read of a baked repository: its files, compared with the template's."""

from __future__ import annotations

from pathlib import Path

from conftest import CONFIGS, TEMPLATE_DIR


def generated_files(root: Path) -> set[str]:
    return {
        p.relative_to(root).as_posix()
        for p in root.rglob("*")
        if p.is_file() and ".git" not in p.relative_to(root).parts and "__pycache__" not in p.parts
    }


def template_files(package: str) -> set[str]:
    """Files of the template directory, names rendered."""
    src = TEMPLATE_DIR / "{{cookiecutter.project_slug}}"
    return {
        p.relative_to(src).as_posix().replace("{{cookiecutter.package_name}}", package)
        for p in src.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }


def under(files: set[str], paths: list[str]) -> set[str]:
    """The files that are one of paths or inside one of them."""
    return {f for f in files if any(f == p or f.startswith(p + "/") for p in paths)}


def text_files(root: Path) -> dict[str, str]:
    files = {}
    for rel in generated_files(root):
        try:
            files[rel] = (root / rel).read_text()
        except UnicodeDecodeError:
            continue
    return files


def rendered_answers(name: str) -> dict:
    """The answers of a configuration as the bake used them: cookiecutter's Jinja rendered."""
    from cookiecutter.generate import generate_context
    from cookiecutter.prompt import prompt_for_config

    context = generate_context(TEMPLATE_DIR / "cookiecutter.json", extra_context=CONFIGS[name])
    return prompt_for_config(context, no_input=True)
