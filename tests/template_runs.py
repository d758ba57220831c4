"""Running the template as a user does: the cookiecutter command line, the hooks' lines for a
bad answer, what a failed run leaves behind, and a README as GitHub renders it."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from conftest import TEMPLATE_DIR, clean_env
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


EMPTY_SLUG_FORM = (
    "a name with at least one letter or digit: the repository name project_slug is derived "
    "from it and came out empty (or give project_slug=my-project too)"
)
