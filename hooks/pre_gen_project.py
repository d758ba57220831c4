"""Validate every answer before cookiecutter writes anything.

Answers are data: they arrive here as JSON (never pasted into code), and each is checked
against the form the generated files need. On failure this prints one line per bad answer
(field, value, accepted form) and exits non-zero; cookiecutter then removes the output
directory, so nothing half-written is left behind.
"""

from __future__ import annotations

import json
import keyword
import re
import sys

ANSWERS: dict = json.loads({{cookiecutter | tojson | tojson}})

CHOICES = {
    "cluster": ("clariden", "daint", "santis"),
    "env_flavour": ("container", "uenv", "both"),
    "container_base": ("ngc", "alps-extended"),
    "launcher": ("srun", "torchrun"),
    "git_init": ("yes", "no"),
}

# Free text ends up in TOML strings (rendered with tojson) and in comments: it may contain
# quotes, $, backticks, ; and backslashes, but no control characters (a newline would end a
# comment in a shell script) and nothing outside the Basic Multilingual Plane (JSON would
# escape it as a surrogate pair, which TOML rejects).
FREE_TEXT = {"project_name": 100, "description": 300, "author_name": 100}

# ${NAME} references are expanded by bash and by the Container Engine alike; other shell
# syntax ($NAME without braces, $(...), quotes, spaces) is not allowed in a path.
_VAR = r"\$\{[A-Z_][A-Z0-9_]*\}"
PATH_RE = re.compile(rf"^(?:/|{_VAR})(?:[A-Za-z0-9_.+@/-]|{_VAR})*$")
PATH_FORM = (
    "an absolute path or one starting with ${VAR}, e.g. ${SCRATCH}/ce-images; "
    "letters, digits, _ . + @ - / and ${VAR} only"
)

PATTERNS: dict[str, tuple[str, str]] = {
    "project_slug": (
        r"^[a-z][a-z0-9]*(-[a-z0-9]+)*$",
        "lowercase letters and digits in words joined by '-', e.g. my-project",
    ),
    "package_name": (
        r"^[a-z][a-z0-9_]*$",
        "a lowercase Python identifier, e.g. my_project",
    ),
    "author_email": (
        r"^[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}$",
        "an e-mail address, e.g. ada@example.org",
    ),
    "account": (
        r"^([A-Za-z0-9][A-Za-z0-9_-]{0,63})?$",
        "empty (your default account) or a Slurm account such as a-g34 or g34",
    ),
    "partition": (
        r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$",
        "a Slurm partition name such as normal or debug",
    ),
    "ngc_pytorch_tag": (r"^\d{2}\.\d{2}$", "an NGC release YY.MM, e.g. 25.06"),
    "alps_extended_tag": (
        r"^\d{2}\.\d{2}-py3-alps\d+$",
        "YY.MM-py3-alpsN, e.g. 26.02-py3-alps6",
    ),
    "uenv_image": (
        r"^[a-z0-9][a-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._+-]*(:[A-Za-z0-9][A-Za-z0-9._-]*)?$",
        "a uenv label name/version[:tag], e.g. pytorch/v2.9.1:v1",
    ),
    "nodes": (r"^[1-9][0-9]{0,3}$", "a whole number of nodes from 1 to 9999"),
    "image_dir": (PATH_RE.pattern, PATH_FORM),
    "data_dir": (PATH_RE.pattern, PATH_FORM),
    "checkpoint_dir": (PATH_RE.pattern, PATH_FORM),
}

TIME_FORM = "a Slurm time limit: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS (not zero)"
_TIME_RE = re.compile(
    r"^(?:(?P<d>\d+)-(?P<dh>\d{1,2})(?::(?P<dm>\d{1,2})(?::(?P<ds>\d{1,2}))?)?"
    r"|(?P<a>\d+)(?::(?P<b>\d{1,2})(?::(?P<c>\d{1,2}))?)?)$"
)


def time_limit_error(value: str) -> str | None:
    """None if value is a valid, non-zero Slurm time limit, else the accepted form."""
    m = _TIME_RE.match(value)
    if not m:
        return TIME_FORM
    g = {k: int(v) for k, v in m.groupdict().items() if v is not None}
    if "d" in g:  # D-HH[:MM[:SS]]
        hours, minutes, seconds = g["dh"], g.get("dm", 0), g.get("ds", 0)
        total = ((g["d"] * 24 + hours) * 60 + minutes) * 60 + seconds
        if hours > 23 or minutes > 59 or seconds > 59:
            return TIME_FORM
    elif "c" in g:  # HH:MM:SS
        if g["b"] > 59 or g["c"] > 59:
            return TIME_FORM
        total = (g["a"] * 60 + g["b"]) * 60 + g["c"]
    elif "b" in g:  # MM:SS
        if g["b"] > 59:
            return TIME_FORM
        total = g["a"] * 60 + g["b"]
    else:  # MM
        total = g["a"] * 60
    return None if total > 0 else TIME_FORM


def free_text_error(value: str, max_len: int) -> str | None:
    form = f"one line of at most {max_len} printable characters"
    if not value.strip() or len(value) > max_len:
        return form
    if any(ord(ch) < 32 or ord(ch) == 127 or ord(ch) > 0xFFFF for ch in value):
        return form + " (no newlines, tabs or other control characters)"
    return None


def validate(answers: dict) -> list[str]:
    """Return one message per invalid answer (empty list: all valid)."""
    errors = []

    def bad(field: str, form: str) -> None:
        errors.append(f"{field} = {answers.get(field)!r} is invalid: expected {form}")

    for field, choices in CHOICES.items():
        if answers.get(field) not in choices:
            bad(field, "one of " + ", ".join(choices))
    for field, max_len in FREE_TEXT.items():
        problem = free_text_error(str(answers.get(field, "")), max_len)
        if problem:
            bad(field, problem)
    for field, (pattern, form) in PATTERNS.items():
        if not re.fullmatch(pattern, str(answers.get(field, ""))):
            bad(field, form)
    package = str(answers.get("package_name", ""))
    if (
        keyword.iskeyword(package)
        or package in sys.stdlib_module_names
        or package
        in {
            "torch",
            "numpy",
            "tests",
        }
    ):
        bad(
            "package_name",
            "a name that does not shadow a keyword, the standard library, torch or numpy",
        )
    if len(str(answers.get("project_slug", ""))) > 64:
        bad("project_slug", "at most 64 characters (it is the Slurm job name)")
    problem = time_limit_error(str(answers.get("time_limit", "")))
    if problem:
        bad("time_limit", problem)
    return errors


def main() -> int:
    errors = validate(ANSWERS)
    for message in errors:
        print(f"error: {message}", file=sys.stderr)
    if errors:
        print(
            "Nothing was generated. Run cookiecutter again with corrected answers.",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
