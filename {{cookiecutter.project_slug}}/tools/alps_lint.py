#!/usr/bin/env python3
"""Alps linter: catches CSCS Alps pitfalls in Container Engine EDFs and Slurm job scripts.

    python tools/alps_lint.py               # scan the repository (EDFs, *.sbatch, *.sh)
    python tools/alps_lint.py FILE...       # check these files (what the pre-commit hook does)
    python tools/alps_lint.py --explain [ID...]   # why each rule exists
    python tools/alps_lint.py --list-rules --markdown   # the rule table of docs/pre-commit.md

Each rule is a function registered with ``@rule(id, why, subject)`` over a parsed ``Edf`` or
``Script``; it yields ``Report(line, message)``. The Alps Extended Image requirements are rows
of ``BASE_REQUIREMENTS``.

Every problem is printed as ``file:line: RULE-ID: message``; the exit status is 1 when anything
was reported. Silence a report with a comment on the reported line (for a shell command continued
over several lines: on any of its lines)::

    srun hostname  # alps-lint: disable=SB-SRUN-ENV

File-level rules report line 1 and are silenced by such a comment on any line of the file.

Which TOML files are EDFs: files under a ``container/`` (or ``edf/``) directory, and files with a
top-level ``image``, ``mounts`` or ``base_environment`` key or an ``[annotations]`` table.

Which base image an EDF runs (for the annotation rules), first match wins:
1. a remote ``image`` reference (``nvcr.io/...``, ``.../alps-extended-images/...:...-alps6``);
2. for a local ``.sqsh`` image: the last ``FROM`` (global ``ARG`` defaults substituted) of the
   nearest ``Dockerfile``/``Containerfile`` in the EDF's directory or above it, up to the root;
3. a marker comment in the EDF: ``# base: ngc`` or ``# base: alps-extended`` (also written
   ``# alps-lint: base=...``). A marker that contradicts 1 or 2 is reported (EDF-BASE);
4. otherwise the image counts as "other" (not an Alps Extended Image).

Standard library only: tomllib, or tomli on Python 3.10.
"""

from __future__ import annotations

import argparse
import difflib
import functools
import os
import posixpath
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    try:
        import tomli as tomllib
    except ModuleNotFoundError:
        tomllib = None


@dataclass(frozen=True)
class Report:
    """What a rule's check yields: a line (and the last line of a continued command)."""

    line: int
    message: str
    end: int = 0


@dataclass(frozen=True)
class Rule:
    id: str
    why: str
    subject: str  # what the check reads: "edf-text", "edf", "shell" or "job" (see lint_file)
    check: Callable[..., Iterable[Report]]
    file_level: bool = False


# Every rule, in the order of `--explain` and of the table in docs/pre-commit.md.
RULES: dict[str, Rule] = {}


def rule(rule_id: str, why: str, subject: str, file_level: bool = False):
    """Register the decorated check as rule `rule_id`; `why` is its explanation (Markdown)."""

    def register(check: Callable[..., Iterable[Report]]):
        if rule_id in RULES:
            raise ValueError(f"rule {rule_id} registered twice")
        RULES[rule_id] = Rule(rule_id, " ".join(why.split()), subject, check, file_level)
        return check

    return register


# CSCS's progressive Lustre layout (storage guide, 2025-11) is written once, in this script's
# LAYOUT=(...) line; the linter and the doctor read it from there.
STRIPE_SCRIPT = "scripts/stripe_lustre.sh"
LAYOUT_RE = re.compile(r"(?m)^LAYOUT=\(([^)\n]*)\)")


def lustre_layout(root: Path) -> str | None:
    """The `lfs setstripe` options of the repository's scripts/stripe_lustre.sh, or None."""
    try:
        match = LAYOUT_RE.search((root / STRIPE_SCRIPT).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError):
        return None
    return " ".join(match.group(1).split()) if match else None


@dataclass(frozen=True)
class Finding:
    path: str
    line: int
    rule: str
    message: str
    end: int = 0  # last line of the reported construct (a continued shell command)

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.rule}: {self.message}"


# ---------------------------------------------------------------------------------------------
# suppression comments

DISABLE_RE = re.compile(r"#.*?alps-lint:\s*disable=\s*([\w-]+(?:\s*,\s*[\w-]+)*)")


def disabled_ids(lines: list[str]) -> dict[int, set[str]]:
    """line number -> rule ids disabled by an ``alps-lint: disable=`` comment on that line."""
    out: dict[int, set[str]] = {}
    for number, text in enumerate(lines, 1):
        match = DISABLE_RE.search(text)
        if match:
            out[number] = {part.strip() for part in match.group(1).split(",")}
    return out


def unsilenced(findings: list[Finding], lines: list[str]) -> list[Finding]:
    disabled = disabled_ids(lines)
    anywhere = set().union(*disabled.values()) if disabled else set()
    kept = []
    for f in findings:
        if RULES[f.rule].file_level:
            if f.rule in anywhere:
                continue
        elif any(f.rule in disabled.get(n, ()) for n in range(f.line, max(f.line, f.end) + 1)):
            continue
        kept.append(f)
    return kept


# ---------------------------------------------------------------------------------------------
# EDF (TOML)

EDF_DIRS = {"container", "containers", "edf", ".edf"}
EDF_HINT_RE = re.compile(r"(?m)^\s*(?:(?:image|mounts|base_environment)\s*=|\[\s*annotations\b)")
KEY_PART = r"""(?:[A-Za-z0-9_-]+|"(?:[^"\\]|\\.)*"|'[^']*')"""
DOTTED_KEY = rf"{KEY_PART}(?:\s*\.\s*{KEY_PART})*"
HEADER_RE = re.compile(rf"\s*\[\[?\s*({DOTTED_KEY})\s*\]")
ASSIGN_RE = re.compile(rf"\s*({DOTTED_KEY})\s*=")
BASE_MARKER_RE = re.compile(
    r"(?m)^\s*#\s*(?:alps-lint:\s*base\s*=|base\s*:)\s*(ngc|alps-extended|other)\b"
)
BASE_NAMES = {
    "alps-extended": "an Alps Extended Image",
    "ngc": "an NGC image",
    "other": "a non-Extended image",
}


def is_edf(path: Path, text: str) -> bool:
    if path.suffix != ".toml" or path.name == "pyproject.toml":
        return False
    return bool(EDF_DIRS & set(path.parent.parts)) or bool(EDF_HINT_RE.search(text))


def split_key(dotted: str) -> list[str]:
    parts = re.findall(KEY_PART, dotted)
    return [p[1:-1] if p[:1] in "\"'" else p for p in parts]


def key_lines(lines: list[str]) -> dict[str, int]:
    """Dotted key (tables and keys, e.g. 'annotations.com.hooks.cxi.enabled') -> first line."""
    index: dict[str, int] = {}
    table: list[str] = []
    for number, text in enumerate(lines, 1):
        header = HEADER_RE.match(text)
        if header:
            table = split_key(header.group(1))
            index.setdefault(".".join(table), number)
            continue
        assign = ASSIGN_RE.match(text)
        if assign:
            index.setdefault(".".join(table + split_key(assign.group(1))), number)
    return index


def flatten(table: dict, prefix: str = "") -> dict[str, object]:
    """Nested annotation tables -> {'com.hooks.cxi.enabled': value}."""
    out: dict[str, object] = {}
    for key, value in table.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, f"{name}."))
        else:
            out[name] = value
    return out


def unbraced_vars(value: str) -> list[str]:
    """Names written $NAME (not ${NAME}, not the $$ escape)."""
    names, i = [], 0
    while i < len(value):
        if value[i] != "$":
            i += 1
            continue
        if value[i + 1 : i + 2] in ("$", "{"):
            i += 2
            continue
        match = re.match(r"[A-Za-z_]\w*", value[i + 1 :])
        if match:
            names.append(match.group())
            i += len(match.group())
        i += 1
    return names


def split_mount(mount: str) -> list[str]:
    """'SRC:DST:FLAGS' -> parts, ignoring ':' inside ${VAR:-default}."""
    parts, current, depth, i = [], "", 0, 0
    while i < len(mount):
        char = mount[i]
        if mount.startswith("${", i):
            depth += 1
            current += "${"
            i += 2
            continue
        if char == "}" and depth:
            depth -= 1
        if char == ":" and not depth:
            parts.append(current)
            current = ""
        else:
            current += char
        i += 1
    return [*parts, current]


def is_relative(path: str) -> bool:
    return not path.startswith(("/", "./", "$"))


def is_local_image(image: str) -> bool:
    return image.endswith((".sqsh", ".squashfs")) or image.startswith(("/", ".", "$", "~"))


def classify_image(ref: str) -> str:
    tag = ref.rsplit("/", 1)[-1].partition(":")[2]
    if "alps-extended-images" in ref or "/alps-images/" in ref or re.search(r"-alps\d*$", tag):
        return "alps-extended"
    if "nvcr.io" in ref:
        return "ngc"
    return "other"


def dockerfile_base(path: Path) -> str | None:
    """The image the last stage of a Dockerfile builds on (global ARG defaults substituted)."""
    text = re.sub(r"\\\n", " ", path.read_text(encoding="utf-8", errors="replace"))
    args: dict[str, str] = {}
    stages: dict[str, str] = {}
    base = None
    for line in text.splitlines():
        words = line.split()
        if not words or words[0].startswith("#"):
            continue
        instruction = words[0].upper()
        if instruction == "ARG" and base is None and len(words) > 1:
            name, _, default = words[1].partition("=")
            args[name] = default.strip("\"'")
        elif instruction == "FROM":
            rest = [w for w in words[1:] if not w.startswith("--")]
            if not rest:
                continue
            ref = re.sub(
                r"\$\{(\w+)(?::?-([^}]*))?\}|\$(\w+)",
                lambda m: args.get(m.group(1) or m.group(3)) or m.group(2) or "",
                rest[0],
            )
            base = stages.get(ref, ref)
            if len(rest) >= 3 and rest[1].lower() == "as":
                stages[rest[2]] = base
    return base


def find_dockerfile(edf: Path, root: Path) -> Path | None:
    directory = edf.resolve().parent
    root = root.resolve()
    while True:
        for name in ("Dockerfile", "Containerfile"):
            if (directory / name).is_file():
                return directory / name
        if directory == root or root not in directory.parents:
            return None
        directory = directory.parent


def detect_base(text: str, image: str, edf: Path, root: Path) -> tuple[str, str, str | None]:
    """(base, how it was found, marker contradiction message or None)."""
    evidence = None
    if image and not is_local_image(image):
        evidence = (classify_image(image), f"image {image}")
    elif image:
        dockerfile = find_dockerfile(edf, root)
        ref = dockerfile_base(dockerfile) if dockerfile else None
        if ref and "$" not in ref:
            where = os.path.relpath(dockerfile, root.resolve()).replace(os.sep, "/")
            evidence = (classify_image(ref), f"{where}: FROM {ref}")
    marker = BASE_MARKER_RE.search(text)
    if evidence:
        conflict = None
        if marker and marker.group(1) != evidence[0]:
            conflict = f"'base: {marker.group(1)}' contradicts {evidence[1]} ({evidence[0]})"
        return evidence[0], evidence[1], conflict
    if marker:
        return marker.group(1), f"marker base: {marker.group(1)}", None
    return "other", "base image unknown", None


EDF_TYPES = {
    "base_environment": ((str, list), "a string or an array of strings"),
    "image": ((str,), "a string"),
    "workdir": ((str,), "a string"),
    "entrypoint": ((bool,), "a boolean"),
    "writable": ((bool,), "a boolean"),
    "mounts": ((list,), "an array of strings"),
    "env": ((dict,), "a table"),
    "annotations": ((dict,), "a table"),
    "devices": ((list,), "an array of strings"),
}
TOML_TYPE_NAMES = {bool: "a boolean", str: "a string", int: "an integer", float: "a float"}


def type_name(value: object) -> str:
    for kind, name in TOML_TYPE_NAMES.items():
        if isinstance(value, kind):
            return name
    return "an array" if isinstance(value, list) else "a table"


class Edf:
    """An EDF as the rules read it: the TOML data (None when it does not parse), where each key
    is written, its string values with their lines and the base image it runs."""

    def __init__(self, display: str, path: Path, text: str, root: Path):
        self.display, self.path, self.text, self.root = display, path, text, root
        self.lines = text.splitlines()
        self.error: str | None = None
        try:
            self.data: dict = tomllib.loads(text)
        except tomllib.TOMLDecodeError as err:
            self.data, self.error = {}, str(err)
            return
        self.index = key_lines(self.lines)
        image = self.data.get("image")
        self.image = image if isinstance(image, str) else ""
        self.image_line = self.line_of("image") if "image" in self.data else 1
        self.base, self.how, self.base_conflict = detect_base(text, self.image, path, root)
        annotations = self.data.get("annotations")
        self.annotations = flatten(annotations) if isinstance(annotations, dict) else {}

    def line_of(self, key: str, needle: str | None = None) -> int:
        """The line a (dotted) key is written on; with needle: the line of that array element."""
        start = self.index.get(key) or self.index.get(key.partition(".")[0]) or 1
        for probe in (f'"{needle}"', f"'{needle}'", needle) if needle else ():
            for number in range(start, len(self.lines) + 1):
                if probe in self.lines[number - 1]:
                    return number
        return start

    def strings(self) -> list[tuple[str, str, int]]:
        """(key, value, line) of every string value, array elements and tables included."""
        found = []
        for key, value in self.data.items():
            if isinstance(value, str):
                found.append((key, value, self.line_of(key)))
            elif isinstance(value, list):
                found += [(key, v, self.line_of(key, v)) for v in value if isinstance(v, str)]
            elif isinstance(value, dict):
                for name, item in flatten(value).items():
                    if isinstance(item, str):
                        found.append((f"{key}.{name}", item, self.line_of(f"{key}.{name}")))
        return found

    def mounts(self) -> list[tuple[str, str, int]]:
        """(source, destination, line) of every mount; a bare path mounts at the same path."""
        found = []
        for key, mount, line in self.strings():
            if key == "mounts":
                parts = split_mount(mount)
                found.append((parts[0], parts[1] if len(parts) > 1 else parts[0], line))
        return found


{# the template's templates/alps_home.py.j2, shared with its pre-generation hook #}
{%- include "alps_home.py.j2" %}

# Mounted over the image's own directory, these hide the image's system (a bare source mounts
# at the same path in the container).
SYSTEM_DIRS = {"/", "/usr", "/etc", "/bin", "/sbin", "/lib", "/lib64", "/opt", "/proc", "/sys"}
SYSTEM_DIRS |= {"/dev", "/var"}


def is_whole_home(path: str) -> bool:
    """/users, or one user's whole home directory, however it is spelled."""
    return re.fullmatch(r"/users(/[^/]+)?", normalised_path(path)) is not None


@rule(
    "EDF-TOML",
    "The Container Engine cannot read the EDF: every `srun --environment` using it fails.",
    "edf-text",
    file_level=True,
)
def edf_toml(edf: Edf) -> Iterator[Report]:
    if edf.error:
        yield Report(1, f"not valid TOML: {edf.error}")


@rule(
    "EDF-KEY",
    "The EDF knows only `base_environment`, `image`, `workdir`, `entrypoint`, `writable`, "
    "`mounts`, `env`, `annotations` (and `devices`); anything else is a typo or belongs under "
    "`[env]` or `[annotations]`.",
    "edf",
)
def edf_key(edf: Edf) -> Iterator[Report]:
    for key in edf.data:
        if key not in EDF_TYPES:
            close = difflib.get_close_matches(key, EDF_TYPES, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            yield Report(edf.line_of(key), f"unknown top-level key '{key}'{hint}")


@rule(
    "EDF-TYPE",
    "EDF values are typed: `entrypoint`/`writable` are booleans, `mounts` an array of strings, "
    '`[env]` and `[annotations]` values strings (write `"true"`, not `true`).',
    "edf",
)
def edf_type(edf: Edf) -> Iterator[Report]:
    for key, value in edf.data.items():
        if key not in EDF_TYPES:
            continue
        kinds, wanted = EDF_TYPES[key]
        if not isinstance(value, kinds) or (
            isinstance(value, list) and not all(isinstance(v, str) for v in value)
        ):
            yield Report(edf.line_of(key), f"'{key}' must be {wanted}, not {type_name(value)}")
    for table in ("env", "annotations"):
        if isinstance(edf.data.get(table), dict):
            for name, value in flatten(edf.data[table]).items():
                if not isinstance(value, str):
                    yield Report(
                        edf.line_of(f"{table}.{name}"),
                        f"[{table}] {name} must be a string, not {type_name(value)}",
                    )


@rule(
    "EDF-VAR",
    "The Container Engine expands variables written `${VAR}`; write the braces (`${VAR:-}` for "
    "an optional one, `$${VAR}` for a literal `${VAR}`).",
    "edf",
)
def edf_var(edf: Edf) -> Iterator[Report]:
    for key, value, line in edf.strings():
        for name in dict.fromkeys(unbraced_vars(value)):
            braced = "${" + name + "}"
            yield Report(line, f"'${name}' in {key} without braces: write '{braced}'")


@rule(
    "EDF-HOME",
    "Mounting all of `$HOME` or `/users` leaks shell init files and stale caches (`~/.triton`, "
    "`~/.cache`) into the container, exposes personal data and hides the SSH hook's `~/.ssh`: "
    "mount only the subdirectories you need. Checked after normalising the path (`${HOME}`, "
    "`$HOME`, `~`, `//`, `/.`, `..`).",
    "edf",
)
def edf_home(edf: Edf) -> Iterator[Report]:
    for source, _, line in edf.mounts():
        if is_whole_home(source):
            yield Report(line, f"mounts the whole home directory ('{source}')")


@rule(
    "EDF-ROOT",
    "A mount of the host's `/` exposes every file system, `/users` included; a mount onto `/`, "
    "`/usr`, `/etc`, `/opt`, `/lib`, ... hides the image's own files (a bare path is mounted at "
    "the same path in the container). Mount the directories you need.",
    "edf",
)
def edf_root(edf: Edf) -> Iterator[Report]:
    for source, destination, line in edf.mounts():
        if source.startswith(("/", "$", "~")) and normalised_path(source) == "/":
            yield Report(line, f"mounts the host's whole file system ('{source}')")
        elif normalised_path(destination) in SYSTEM_DIRS:
            yield Report(line, f"mounts over the image's {normalised_path(destination)}")


@rule(
    "EDF-RELPATH",
    "Relative EDF paths (image, workdir, mount sources) are resolved against the directory "
    "`srun` runs in and must be written `./path`; use `./path`, an absolute path or "
    "`${VAR}/path`.",
    "edf",
)
def edf_relpath(edf: Edf) -> Iterator[Report]:
    paths = []  # (what, path, line)
    if edf.image and is_local_image(edf.image):
        paths.append(("image", edf.image, edf.line_of("image")))
    if isinstance(edf.data.get("workdir"), str):
        paths.append(("workdir", edf.data["workdir"], edf.line_of("workdir")))
    paths += [("mount source", source, line) for source, _, line in edf.mounts()]
    for what, value, line in paths:
        if value and is_relative(value):
            yield Report(line, f"relative {what} '{value}' must start with './'")


@rule(
    "EDF-BASE",
    "The `# base:` marker tells the linter which base image a local `.sqsh` was built from; it "
    "must agree with the image reference or the Dockerfile's `FROM`.",
    "edf",
)
def edf_base(edf: Edf) -> Iterator[Report]:
    marker = BASE_MARKER_RE.search(edf.text)
    if edf.base_conflict and marker:
        yield Report(edf.text.count("\n", 0, marker.start(1)) + 1, edf.base_conflict)


@dataclass(frozen=True)
class BaseRequirement:
    """A setting an EDF needs for its base image: `key` (top level, or a flattened annotation)
    must be `wanted` (ABSENT: must not be "true"); a missing key counts as wrong unless a
    base_environment may set it."""

    rule_id: str
    extended: bool  # True: for Alps Extended Images; False: for every other base image
    key: str
    wanted: object
    message: str  # formatted with key, base (its name) and how (the evidence for the base)
    why: str


ABSENT = object()
OFI = "com.hooks.aws_ofi_nccl.enabled"
CXI = "com.hooks.cxi.enabled"

# The Alps Extended Image requirements, and the one NGC/other images have (https://docs.cscs.ch/software/alps-extended-images/).
BASE_REQUIREMENTS = [
    BaseRequirement(
        "EDF-EXT-OFI",
        True,
        f"annotations.{OFI}",
        ABSENT,
        "{key} with {base} ({how}): remove it",
        "Alps Extended Images carry their own libfabric and NCCL plugin; the `aws_ofi_nccl` "
        "hook must not inject a second one.",
    ),
    BaseRequirement(
        "EDF-EXT-CXI",
        True,
        f"annotations.{CXI}",
        "false",
        '{base} ({how}) needs {key} = "false"',
        "The CXI hook replaces the image's libfabric with the host's; Alps Extended Images "
        'need `com.hooks.cxi.enabled = "false"`.',
    ),
    BaseRequirement(
        "EDF-EXT-ENTRYPOINT",
        True,
        "entrypoint",
        True,
        "{base} ({how}) needs {key} = true",
        "The entrypoint of an Alps Extended Image sets up its network stack "
        "(`/opt/nvidia/entrypoint.d`): the EDF needs `entrypoint = true`.",
    ),
    BaseRequirement(
        "EDF-OFI",
        False,
        f"annotations.{OFI}",
        "true",
        '{key} = "true" is missing for {base} ({how})',
        "Without the `aws_ofi_nccl` hook an NGC (or other) image has no Slingshot plugin and "
        "NCCL falls back to TCP sockets; CSCS: keep it always on, even on one node.",
    ),
]


def check_base_requirement(requirement: BaseRequirement, edf: Edf) -> Iterator[Report]:
    if (edf.base == "alps-extended") != requirement.extended:
        return
    values = edf.annotations if requirement.key.startswith("annotations.") else edf.data
    key = requirement.key.removeprefix("annotations.")
    present = key in values
    if requirement.wanted is ABSENT:
        wrong = present and str(values[key]).lower() == "true"
    elif present:
        wrong = str(values[key]).lower() != str(requirement.wanted).lower()
    else:
        wrong = "base_environment" not in edf.data
    if wrong:
        line = edf.line_of(requirement.key) if present else edf.image_line
        name = BASE_NAMES[edf.base]
        yield Report(line, requirement.message.format(key=key, base=name, how=edf.how))


for _requirement in BASE_REQUIREMENTS:
    rule(_requirement.rule_id, _requirement.why, "edf")(
        functools.partial(check_base_requirement, _requirement)
    )


# ---------------------------------------------------------------------------------------------
# shell and sbatch scripts


@dataclass(frozen=True)
class Command:
    """One shell command line: physical lines joined by backslash-newlines or open quotes."""

    start: int
    end: int
    code: str  # comments removed; newlines kept so that offsets map back to lines

    def line_at(self, offset: int) -> int:
        return self.start + self.code.count("\n", 0, offset)


def shell_commands(text: str) -> list[Command]:
    commands: list[Command] = []
    code: list[str] = []
    start = line = 1
    quote = ""
    i = 0
    while i < len(text):
        char = text[i]
        if char == "\\" and quote != "'" and i + 1 < len(text):
            code.append(text[i : i + 2])
            line += text[i + 1] == "\n"
            i += 2
            continue
        if quote:
            if char == quote:
                quote = ""
        elif char in "'\"":
            quote = char
        elif char == "#" and (not code or code[-1][-1:] in " \t\n;&|("):
            end = text.find("\n", i)
            i = len(text) if end == -1 else end
            continue
        elif char == "\n":
            commands.append(Command(start, line, "".join(code)))
            code = []
            line += 1
            start = line
            i += 1
            continue
        code.append(char)
        line += char == "\n"
        i += 1
    if "".join(code).strip():
        commands.append(Command(start, line, "".join(code)))
    return commands


@dataclass(frozen=True)
class Directive:
    line: int
    name: str  # long form, e.g. --account
    value: str


SHORT_OPTIONS = {"-A": "--account", "-o": "--output", "-e": "--error", "-J": "--job-name"}


def sbatch_directives(lines: list[str]) -> list[Directive]:
    """#SBATCH options of the header (sbatch stops reading them at the first command)."""
    directives = []
    for number, text in enumerate(lines, 1):
        stripped = text.strip()
        if not stripped.startswith("#"):
            if stripped:
                break
            continue
        if not stripped.startswith("#SBATCH"):
            continue
        rest = stripped[len("#SBATCH") :]
        try:
            words = shlex.split(rest, comments=True)
        except ValueError:
            words = rest.split()
        i = 0
        while i < len(words):
            word, value = words[i], ""
            if word.startswith("--"):
                word, eq, value = word.partition("=")
                if not eq and i + 1 < len(words) and not words[i + 1].startswith("-"):
                    i += 1
                    value = words[i]
            elif word.startswith("-") and len(word) >= 2:
                word, value = word[:2], word[2:]
                if not value and i + 1 < len(words) and not words[i + 1].startswith("-"):
                    i += 1
                    value = words[i]
                word = SHORT_OPTIONS.get(word, word)
            directives.append(Directive(number, word, value))
            i += 1
    return directives


UENV_SNIPPET = (
    "NCCL_NET",
    "NCCL_NET_GDR_LEVEL",
    "NCCL_CROSS_NIC",
    "NCCL_PROTO",
    "FI_CXI_DEFAULT_CQ_SIZE",
    "FI_CXI_DEFAULT_TX_SIZE",
    "FI_CXI_DISABLE_HOST_REGISTER",
    "FI_CXI_RX_MATCH_MODE",
    "FI_MR_CACHE_MONITOR",
)
ASSIGNMENT_RE = re.compile(r"(?<![\w${./-])([A-Za-z_]\w*)(\+?=)")
# srun in command position (not in an echo'd string): after a separator, maybe behind a prefix
SRUN_RE = re.compile(
    r"(?:^|[;&|(`{\n])\s*"
    r"(?:(?:exec|time|command|nohup|then|do|else|if|while|until|!|timeout\s+\S+)\s+)*"
    r"srun(?![\w.-])"
)
STRIPE_RE = re.compile(r"(?<!\S)lfs\s+setstripe\b")
ALL_OSTS_RE = re.compile(r"(?<!\S)(?:-c|--stripe-count)(?:=|\s*)[\"']?-1(?!\d)")
TRITON_SHM_RE = re.compile(r"(?<![\w$])TRITON_HOME=[\"']?/dev/shm")
SOURCE_RE = re.compile(r"(?:^|[\s;&|(])(?:source|\.)\s+(\S+)")
ARRAY_REF_RE = re.compile(r"\$\{?([A-Za-z_]\w*)")


def assignments(commands: list[Command]) -> list[tuple[str, int]]:
    """(variable, line) of every NAME=... (export NAME=..., NAME+=...) in the commands."""
    return [
        (match.group(1), command.line_at(match.start()))
        for command in commands
        for match in ASSIGNMENT_RE.finditer(command.code)
    ]


def variable_texts(commands: list[Command]) -> dict[str, str]:
    """NAME -> everything assigned to it (NAME=..., NAME+=(...)), for srun "${args[@]}"."""
    texts: dict[str, str] = {}
    for command in commands:
        for match in ASSIGNMENT_RE.finditer(command.code):
            end = command.code.find("\n", match.end())
            value = command.code[match.end() : None if end == -1 else end]
            texts[match.group(1)] = texts.get(match.group(1), "") + " " + value
    return texts


def sourced_files(commands: list[Command], root: Path) -> list[tuple[Command, Path]]:
    """(source command, file) of each repository file the script sources (e.g. jobs/common.sh,
    or a shared NCCL snippet); paths relative to the repository root, where jobs run."""
    found = []
    for command in commands:
        for match in SOURCE_RE.finditer(command.code):
            target = match.group(1).strip("\"'")
            target = re.sub(r"^\$\{?(?:SLURM_SUBMIT_DIR|PWD)\}?/", "", target)
            if "$" not in target and (root / target).is_file():
                found.append((command, root / target))
    return found


def sourced_assignments(commands: list[Command], root: Path) -> set[str]:
    """Variables assigned in repository files the script sources."""
    names: set[str] = set()
    for _, path in sourced_files(commands, root):
        text = path.read_text(encoding="utf-8", errors="replace")
        names |= {name for name, _ in assignments(shell_commands(text))}
    return names


def git_tracks_something(root: Path, directory: str) -> bool | None:
    """Whether git tracks a file under directory (None when root is not a git work tree)."""
    if not (root / ".git").exists() or shutil.which("git") is None:
        return None
    result = subprocess.run(
        ["git", "-C", str(root), "ls-files", "--", directory],
        capture_output=True,
        text=True,
        check=False,
    )
    return bool(result.stdout.strip()) if result.returncode == 0 else None


def logdir_problem(value: str, root: Path) -> str | None:
    """What is wrong with the directory of an --output/--error file name, or None."""
    directory = posixpath.dirname(value)
    if not directory or directory.startswith("/"):
        return None
    if "$" in directory:
        return f"'{directory}': #SBATCH lines expand no variables"
    if "%" in directory:
        return f"'{directory}' has a %-pattern: Slurm cannot create it"
    if not (root / directory).is_dir():
        return f"'{directory}/' does not exist in the repository"
    if git_tracks_something(root, directory) is False:
        return f"'{directory}/' has no file in git: add .gitkeep"
    return None


class Script:
    """A shell script as the rules read it: its commands and, for a job script, its #SBATCH
    header, its srun steps and what it assigns."""

    def __init__(self, display: str, text: str, root: Path, job: bool):
        self.display, self.text, self.root, self.job = display, text, root, job
        self.lines = text.splitlines()
        self.commands = shell_commands(text)
        self.directives = sbatch_directives(self.lines)
        self.assigned = assignments(self.commands)
        variables = variable_texts(self.commands)
        self.sruns: list[tuple[Command, bool]] = []  # (command, runs with --environment)
        self.srun_args: list[str] = []  # each srun's options, "${array[@]}" contents appended
        steps = [(command, command) for command in self.commands]
        for command, path in sourced_files(self.commands, root):  # e.g. jobs/common.sh
            sourced = shell_commands(path.read_text(encoding="utf-8", errors="replace"))
            for name, text in variable_texts(sourced).items():
                variables[name] = variables.get(name, "") + text
            # a step of the sourced file is reported on the line that sources it
            steps += [(command, Command(command.start, command.end, c.code)) for c in sourced]
        for where, step in steps:
            match = SRUN_RE.search(step.code)
            if match:
                args = step.code[match.end() :]
                for name in ARRAY_REF_RE.findall(args):  # srun "${srun_args[@]}" ...
                    args += variables.get(name, "")
                self.sruns.append((where, "--environment" in args))
                self.srun_args.append(args)
        self.container_job = any(has_env for _, has_env in self.sruns)
        self.uenv_lines = [d.line for d in self.directives if d.name == "--uenv"]
        self.uenv_lines += [c.start for c, _ in self.sruns if re.search(r"--uenv[=\s]", c.code)]

    def first_command_line(self) -> int | None:
        """The line where sbatch stops reading #SBATCH options: the first non-comment line."""
        for number, text in enumerate(self.lines, 1):
            stripped = text.strip()
            if stripped and not stripped.startswith("#"):
                return number
        return None


@rule(
    "SB-ENV-DIRECTIVE",
    "`#SBATCH --environment` is experimental: the whole batch script runs in the container "
    "without Slurm, hooks or filesystems, `srun --environment` then enters a container twice, "
    "and Alps Extended Images fail to load `switch/hpe_slingshot`.",
    "job",
)
def sb_env_directive(script: Script) -> Iterator[Report]:
    for d in script.directives:
        if d.name == "--environment":
            yield Report(d.line, "#SBATCH --environment: put it on each srun instead")


@rule(
    "SB-LATE-DIRECTIVE",
    "`sbatch` reads `#SBATCH` options only up to the first command: a line of code above the "
    "header (or an option added below it) silently drops every option after it, e.g. turning "
    "the job into a one-node default job without `--uenv` or `--account`.",
    "job",
)
def sb_late_directive(script: Script) -> Iterator[Report]:
    first = script.first_command_line()
    for number, text in enumerate(script.lines, 1):
        if first is not None and number > first and text.startswith("#SBATCH"):
            yield Report(
                number, f"#SBATCH after the first command (line {first}): sbatch ignores it"
            )


@rule(
    "SB-SRUN-ENV",
    "In a container job (any `srun --environment`, also through an array such as "
    '`srun "${srun_args[@]}"`) only steps started with `--environment` run in the container; a '
    "step without it runs on the bare host (no image, no hooks).",
    "job",
)
def sb_srun_env(script: Script) -> Iterator[Report]:
    if script.container_job:
        for command, has_env in script.sruns:
            if not has_env:
                yield Report(
                    command.start,
                    "srun without --environment in a container job: this step runs on the host",
                    command.end,
                )


SRUN_EDF_RE = re.compile(r"--environment[=\s]+[\"']?([^\s\"']+)")
MPI_PMIX_RE = re.compile(r"--mpi[=\s]+[\"']?pmix\b|\bSLURM_MPI_TYPE=[\"']?pmix\b")
NO_RDZV_GET_RE = re.compile(
    r"--network[=\s]+[\"']?\S*disable_rdzv_get|\bSLURM_NETWORK=[\"']?\S*disable_rdzv_get"
)


def srun_edf(args: str, root: Path) -> Path | None:
    """The repository EDF an srun's --environment names (${PWD}/, ${SLURM_SUBMIT_DIR}/ and ./
    read as the repository root, where the scripts run), or None."""
    match = SRUN_EDF_RE.search(args)
    if not match:
        return None
    target = re.sub(r"^(?:\$\{?(?:PWD|SLURM_SUBMIT_DIR)\}?/|\./)", "", match.group(1))
    if "$" in target or target.startswith("/"):
        return None
    candidate = root / (target if target.endswith(".toml") else target + ".toml")
    return candidate if candidate.is_file() else None


@rule(
    "SB-EXT-PMIX",
    "An Alps Extended Image starts its network stack through PMIx: every `srun` into it needs "
    "`--mpi=pmix --network=disable_rdzv_get` (or `SLURM_MPI_TYPE=pmix` and "
    "`SLURM_NETWORK=disable_rdzv_get`), helper steps such as a venv build included; without "
    "them NCCL has no Slingshot network. Checked in job scripts and `*.sh`.",
    "shell",
)
def sb_ext_pmix(script: Script) -> Iterator[Report]:
    assigned = variable_texts(script.commands)
    environment = " ".join(f"{name}={text.strip()}" for name, text in assigned.items())
    for (command, has_env), args in zip(script.sruns, script.srun_args, strict=True):
        edf_path = srun_edf(args, script.root) if has_env else None
        if edf_path is None or tomllib is None:
            continue
        text = edf_path.read_text(encoding="utf-8", errors="replace")
        try:
            image = tomllib.loads(text).get("image", "")
        except tomllib.TOMLDecodeError:
            continue
        base = detect_base(text, image if isinstance(image, str) else "", edf_path, script.root)
        if base[0] != "alps-extended":
            continue
        missing = [
            option
            for option, pattern in (
                ("--mpi=pmix", MPI_PMIX_RE),
                ("--network=disable_rdzv_get", NO_RDZV_GET_RE),
            )
            if not pattern.search(args) and not pattern.search(environment)
        ]
        if missing:
            yield Report(
                command.start,
                f"srun into an Alps Extended Image ({base[1]}) without {' '.join(missing)}",
                command.end,
            )


@rule(
    "SB-UENV-NCCL",
    "A uenv job (`--uenv`) must set the NCCL/libfabric variables of CSCS's NCCL page itself ("
    + ", ".join(f"`{name}`" for name in UENV_SNIPPET)
    + "), in the script or in a repository file it sources; without them NCCL may use TCP or "
    "hang on Slingshot.",
    "job",
)
def sb_uenv_nccl(script: Script) -> Iterator[Report]:
    if script.uenv_lines:
        names = {name for name, _ in script.assigned}
        names |= sourced_assignments(script.commands, script.root)
        missing = [name for name in UENV_SNIPPET if name not in names]
        if missing:
            yield Report(
                min(script.uenv_lines),
                f"uenv job without the CSCS NCCL/libfabric variables: {', '.join(missing)}",
            )


@rule(
    "SB-UENV-PLUGIN",
    "With a uenv, `NCCL_NET_PLUGIN` takes precedence over `NCCL_NET` and NCCL cannot find the "
    "plugin under that name: `NCCL WARN Error: network AWS Libfabric not found`.",
    "job",
)
def sb_uenv_plugin(script: Script) -> Iterator[Report]:
    if script.uenv_lines:
        for name, line in script.assigned:
            if name == "NCCL_NET_PLUGIN":
                yield Report(line, "NCCL_NET_PLUGIN in a uenv job: remove it")


@rule(
    "SB-CE-NCCL",
    "In a container the `aws_ofi_nccl` hook (or an Alps Extended Image's entrypoint) sets the "
    "NCCL/libfabric variables per CE release; exporting the uenv snippet (`NCCL_NET`, "
    "`FI_CXI_*`, ...) overrides them with other values (e.g. `NCCL_CROSS_NIC=1` where the hook "
    "sets 0).",
    "job",
)
def sb_ce_nccl(script: Script) -> Iterator[Report]:
    if not script.container_job:
        return
    per_line: dict[int, list[str]] = {}
    for name, line in script.assigned:
        if name in UENV_SNIPPET or name.startswith("FI_CXI_"):
            per_line.setdefault(line, []).append(name)
    for line, names in sorted(per_line.items()):
        yield Report(
            line,
            f"container job sets {', '.join(names)}: the CE hook sets these, drop the export",
        )


@rule(
    "SB-CE-TRITON",
    "`TRITON_HOME=/dev/shm` is recommended for uenv jobs only; inside a CE container "
    "`/dev/shm`'s mount settings can make Triton fail. Use a path inside the container.",
    "job",
)
def sb_ce_triton(script: Script) -> Iterator[Report]:
    if script.container_job:
        for command in script.commands:
            for match in TRITON_SHM_RE.finditer(command.code):
                yield Report(
                    command.line_at(match.start()),
                    "TRITON_HOME on /dev/shm in a container job: use a path in the container",
                )


@rule(
    "SB-LOGDIR",
    "Slurm neither creates the directory of `--output`/`--error` nor expands variables in "
    "`#SBATCH` lines; a missing directory makes the job fail without any log. Relative "
    "directories must exist in the repository and hold a file tracked by git "
    "(`logs/.gitkeep`) so that every clone has them; absolute ones are not checked.",
    "job",
)
def sb_logdir(script: Script) -> Iterator[Report]:
    for d in script.directives:
        if d.name in ("--output", "--error"):
            problem = logdir_problem(d.value, script.root)
            if problem:
                yield Report(d.line, f"{d.name} directory {problem}")


@rule(
    "SB-ACCOUNT",
    "Without `--account` the job is charged to your default project (or rejected when you have "
    "none); most Alps users belong to several. Silence it for the file if intended.",
    "job",
    file_level=True,
)
def sb_account(script: Script) -> Iterator[Report]:
    if not any(d.name == "--account" for d in script.directives):
        yield Report(1, "no #SBATCH --account: the job is charged to your default project")


@rule(
    "LUSTRE-STRIPE",
    "`lfs setstripe ... -c -1` stripes over every OST (~160 on Capstor), the stale layout of "
    "older guides; CSCS now recommends a progressive layout that ends at 32 (uenv caps "
    f"striping at 32 too), the one `{STRIPE_SCRIPT}` applies. Checked in job scripts and `*.sh`.",
    "shell",
)
def lustre_stripe(script: Script) -> Iterator[Report]:
    layout = lustre_layout(script.root)
    advice = f"use 'lfs setstripe {layout}' ({STRIPE_SCRIPT})" if layout else f"use {STRIPE_SCRIPT}"
    for command in script.commands:
        if STRIPE_RE.search(command.code) and ALL_OSTS_RE.search(command.code):
            yield Report(command.start, f"'-c -1' stripes over all OSTs: {advice}", command.end)


# ---------------------------------------------------------------------------------------------
# driver

SKIP_DIRS = {"node_modules", "__pycache__", "build", "dist", "site-packages"}
SCANNED_SUFFIXES = (".toml", ".sbatch", ".sh")
SBATCH_LINE_RE = re.compile(r"(?m)^#SBATCH\s")


def repo_files(root: Path) -> list[Path]:
    found = []
    for directory, subdirs, files in os.walk(root):
        subdirs[:] = sorted(
            d
            for d in subdirs
            if not d.startswith(".") and d not in SKIP_DIRS and not d.startswith("venv")
        )
        found += [Path(directory) / f for f in sorted(files) if f.endswith(SCANNED_SUFFIXES)]
    return found


def run_rules(subjects: list[str], target: Edf | Script) -> list[Finding]:
    return [
        Finding(target.display, report.line, r.id, report.message, report.end)
        for r in RULES.values()
        if r.subject in subjects
        for report in r.check(target)
    ]


def lint_file(display: str, path: Path, root: Path) -> list[Finding]:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as err:
        print(f"alps_lint: cannot read {display}: {err}", file=sys.stderr)
        raise SystemExit(2) from err
    if path.suffix == ".toml":
        if not is_edf(path, text):
            return []
        if tomllib is None:
            print("alps_lint: Python < 3.11 needs the tomli package to read EDFs", file=sys.stderr)
            raise SystemExit(2)
        edf = Edf(display, path, text, root)
        findings = run_rules(["edf-text"] if edf.error else ["edf-text", "edf"], edf)
    else:
        job = path.suffix == ".sbatch" or bool(SBATCH_LINE_RE.search(text))
        findings = run_rules(
            ["shell", "job"] if job else ["shell"], Script(display, text, root, job)
        )
    return sorted(unsilenced(findings, text.splitlines()), key=lambda f: f.line)


def explain(ids: list[str]) -> int:
    unknown = [i for i in ids if i not in RULES]
    if unknown:
        print(f"unknown rule id(s): {', '.join(unknown)}", file=sys.stderr)
        return 2
    for r in (RULES[i] for i in ids) if ids else RULES.values():
        scope = " (file-level)" if r.file_level else ""
        print(f"{r.id}{scope}: {r.why}")
    return 0


def rule_table() -> str:
    """The rules as the Markdown table of docs/pre-commit.md (a test compares the two)."""
    rows = ["| id | scope | why |", "|---|---|---|"]
    for r in RULES.values():
        rows.append(f"| `{r.id}` | {'file' if r.file_level else 'line'} | {r.why} |")
    return "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="alps_lint.py",
        description="Check Container Engine EDFs and Slurm job scripts for Alps pitfalls.",
    )
    parser.add_argument("files", nargs="*", type=Path, help="files to check (default: scan)")
    parser.add_argument(
        "--root",
        type=Path,
        default=Path(__file__).resolve().parent.parent,
        help="repository root: scanned without FILES, and where relative --output "
        "directories must exist (default: the repository holding this script)",
    )
    parser.add_argument(
        "--explain", nargs="*", metavar="ID", help="print why the rules (default: all) exist"
    )
    parser.add_argument("--list-rules", action="store_true", help="print the rule ids")
    parser.add_argument(
        "--markdown", action="store_true", help="with --list-rules: the table of docs/pre-commit.md"
    )
    args = parser.parse_args(argv)
    if args.explain is not None:
        return explain(args.explain)
    if args.list_rules:
        print(
            rule_table() if args.markdown else "\n".join(RULES), end="" if args.markdown else "\n"
        )
        return 0

    if args.files:
        targets = [(str(f), f) for f in args.files]
    else:
        targets = [(p.relative_to(args.root).as_posix(), p) for p in repo_files(args.root)]
    findings: list[Finding] = []
    for display, path in targets:
        findings += lint_file(display, path, args.root)
    for finding in findings:
        print(finding)
    if findings:
        print(
            f"alps_lint: {len(findings)} problem(s). Why: python tools/alps_lint.py --explain ID;"
            " silence one with '# alps-lint: disable=ID' on its line.",
            file=sys.stderr,
        )
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
