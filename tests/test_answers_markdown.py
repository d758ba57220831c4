"""Markup in free-text answers renders as exactly the text given, in the README and in
docs/answers.md (checked with a CommonMark parser, as GitHub and GitLab render them)."""

from __future__ import annotations

import pytest
from conftest import TEMPLATE_DIR
from jinja2 import Environment, FileSystemLoader
from template_runs import (
    MARKDOWN,
    cookiecutter,
    markdown_title_and_first_paragraph,
)

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
