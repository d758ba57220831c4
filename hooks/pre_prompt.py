"""Check the choice and yes/no answers given on the cookiecutter command line, before cookiecutter
itself does.

cookiecutter checks `key=value` answers for a choice variable (`cluster=Clariden`) or a boolean
(`git_init=maybe`) while it loads cookiecutter.json, before the pre-generation hook can see
them, and ends with a Python traceback. This hook runs earlier (cookiecutter >= 2.4 runs
`pre_prompt` before it loads the answers) but is given no answers: it reads the command line of
the cookiecutter process that started it (Linux /proc) and parses it with cookiecutter's own
command-line parser. It prints one line per bad answer, in the pre-generation hook's form, and
exits 1; cookiecutter then prints "Pre-Prompt Hook script failed" and stops, with no traceback.

Where there is no such command line to read (cookiecutter or cruft used from Python, e.g.
pytest-cookies; macOS), it does nothing and cookiecutter's own check applies.
This file is run as it is (not rendered by Jinja), from a copy of the template that cookiecutter
makes in the temporary directory; on failure it removes that copy (cookiecutter does not).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path


def cookiecutter_arguments(pid: int) -> list[str] | None:
    """The arguments after `cookiecutter` / `python -m cookiecutter` of process pid, else None."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    argv = [a.decode("utf-8", "surrogateescape") for a in raw.split(b"\0")[:-1]]
    for i, arg in enumerate(argv[:3]):
        if arg == "-m" and i + 1 < len(argv) and argv[i + 1] == "cookiecutter":
            return argv[i + 2 :]
        if Path(arg).name == "cookiecutter":
            return argv[i + 1 :]
    return None


def command_line_answers(pid: int) -> dict[str, str]:
    """The `key=value` answers of the cookiecutter command line of process pid ({} if none)."""
    args = cookiecutter_arguments(pid)
    if not args:
        return {}
    try:
        from cookiecutter.cli import main as cookiecutter_cli

        context = cookiecutter_cli.make_context("cookiecutter", args)
    except Exception:  # noqa: BLE001 - cookiecutter reports its own usage errors
        return {}
    return dict(context.params.get("extra_context") or {})


def is_boolean_answer(value: str) -> bool:
    """Whether cookiecutter converts value to true/false (its own yes/no parser)."""
    try:
        from cookiecutter.prompt import YesNoPrompt
        from rich.prompt import InvalidResponse
    except ImportError:  # pragma: no cover - cookiecutter >= 2.2 has both
        return value.strip().lower() in {"1", "true", "t", "yes", "y", "on", "0", "false", "f"}
    try:
        YesNoPrompt().process_response(value)
    except InvalidResponse:
        return False
    return True


def answer_errors(answers: dict[str, str], defaults: dict) -> list[str]:
    """One line per answer cookiecutter would refuse (choice not listed, yes/no not readable)."""
    errors = []
    for field, value in answers.items():
        default = defaults.get(field)
        if isinstance(default, list) and value not in default:
            form = "one of " + ", ".join(map(str, default))
            if value.lower() in [str(choice).lower() for choice in default]:
                form += " (in lowercase, as listed)"
        elif isinstance(default, bool) and not is_boolean_answer(value):
            form = "true or false (yes or no)"
        else:
            continue
        shown = value.encode("utf-8", "backslashreplace").decode()
        errors.append(f"error: {field} = {shown!r} is invalid: expected {form}")
    return errors


def remove_this_copy() -> None:
    """Remove the template copy cookiecutter made for this hook (/tmp/cookiecutterXXXX/<name>),
    which it leaves behind when the hook fails; nothing else."""
    copy = Path.cwd().resolve()
    holder = copy.parent
    if (
        holder.parent == Path(tempfile.gettempdir()).resolve()
        and holder.name.startswith("cookiecutter")
        and [p.name for p in holder.iterdir()] == [copy.name]
        and (copy / "hooks" / "pre_prompt.py").is_file()
    ):
        os.chdir(holder.parent)
        shutil.rmtree(holder, ignore_errors=True)


def main() -> int:
    defaults = json.loads(Path("cookiecutter.json").read_text(encoding="utf-8"))
    errors = answer_errors(command_line_answers(os.getppid()), defaults)
    if not errors:
        return 0
    for line in errors:
        print(line, file=sys.stderr)
    print("Nothing was generated. Run cookiecutter again with corrected answers.", file=sys.stderr)
    remove_this_copy()
    return 1


if __name__ == "__main__":
    sys.exit(main())
