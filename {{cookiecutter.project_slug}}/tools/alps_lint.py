#!/usr/bin/env python3
"""Alps linter: catches CSCS Alps pitfalls in Container Engine EDFs and Slurm job scripts.

    python tools/alps_lint.py               # scan the repository (EDFs, *.sbatch, *.sh)
    python tools/alps_lint.py FILE...       # check these files (what the pre-commit hook does)
    python tools/alps_lint.py --explain [ID...]   # why each rule exists

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
import os
import posixpath
import re
import shlex
import shutil
import subprocess
import sys
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
class Rule:
    id: str
    why: str
    file_level: bool = False


RULES: dict[str, Rule] = {
    r.id: r
    for r in [
        # --- EDF (Container Engine environment definition files)
        Rule(
            "EDF-TOML",
            "The Container Engine cannot read the EDF: every srun --environment using it fails.",
            file_level=True,
        ),
        Rule(
            "EDF-KEY",
            "The EDF knows only base_environment, image, workdir, entrypoint, writable, mounts, "
            "env, annotations (and devices); anything else is a typo or belongs under [env] or "
            "[annotations].",
        ),
        Rule(
            "EDF-TYPE",
            "EDF values are typed: entrypoint/writable are booleans, mounts an array of strings, "
            '[env] and [annotations] values strings (write "true", not true).',
        ),
        Rule(
            "EDF-VAR",
            "The Container Engine expands variables written ${VAR}; write the braces "
            "(${VAR:-} for an optional one, $${VAR} for a literal ${VAR}).",
        ),
        Rule(
            "EDF-HOME",
            "Mounting all of $HOME or /users leaks shell init files and stale caches "
            "(~/.triton, ~/.cache) into the container, exposes personal data and hides the SSH "
            "hook's ~/.ssh: mount only the subdirectories you need.",
        ),
        Rule(
            "EDF-RELPATH",
            "Relative EDF paths are resolved against the directory srun runs in and must be "
            "written ./path; use ./path, an absolute path or ${VAR}/path.",
        ),
        Rule(
            "EDF-BASE",
            "The '# base:' marker tells this linter which base image a local .sqsh was built "
            "from; it must agree with the image reference or the Dockerfile's FROM.",
        ),
        Rule(
            "EDF-EXT-OFI",
            "Alps Extended Images carry their own libfabric and NCCL plugin; the aws_ofi_nccl "
            "hook must not inject a second one.",
        ),
        Rule(
            "EDF-EXT-CXI",
            "The CXI hook replaces the image's libfabric with the host's; Alps Extended Images "
            'need com.hooks.cxi.enabled = "false".',
        ),
        Rule(
            "EDF-EXT-ENTRYPOINT",
            "The entrypoint of an Alps Extended Image sets up its network stack "
            "(/opt/nvidia/entrypoint.d): the EDF needs entrypoint = true.",
        ),
        Rule(
            "EDF-OFI",
            "Without the aws_ofi_nccl hook an NGC (or other) image has no Slingshot plugin and "
            "NCCL falls back to TCP sockets; CSCS: keep it always on, even on one node.",
        ),
        # --- Slurm job scripts
        Rule(
            "SB-ENV-DIRECTIVE",
            "#SBATCH --environment is experimental: the whole batch script runs in the container "
            "without Slurm, hooks or filesystems, srun --environment then enters a container "
            "twice, and Alps Extended Images fail to load switch/hpe_slingshot.",
        ),
        Rule(
            "SB-SRUN-ENV",
            "In a container job only steps started with srun --environment run in the container; "
            "a step without it runs on the bare host (no image, no hooks).",
        ),
        Rule(
            "SB-UENV-NCCL",
            "A uenv job must set the NCCL/libfabric variables of CSCS's NCCL page itself (nothing "
            "injects them as the CE hook does); without them NCCL may use TCP or hang on "
            "Slingshot.",
        ),
        Rule(
            "SB-UENV-PLUGIN",
            "With a uenv, NCCL_NET_PLUGIN takes precedence over NCCL_NET and NCCL cannot find the "
            "plugin under that name: 'NCCL WARN Error: network AWS Libfabric not found'.",
        ),
        Rule(
            "SB-CE-NCCL",
            "In a container the aws_ofi_nccl hook (or an Alps Extended Image's entrypoint) sets "
            "the NCCL/libfabric variables per CE release; exporting the uenv snippet overrides "
            "them with other values (e.g. NCCL_CROSS_NIC=1 where the hook sets 0).",
        ),
        Rule(
            "SB-CE-TRITON",
            "TRITON_HOME=/dev/shm is recommended for uenv jobs only; inside a CE container "
            "/dev/shm's mount settings can make Triton fail. Use a path inside the container.",
        ),
        Rule(
            "SB-LOGDIR",
            "Slurm neither creates the directory of --output/--error nor expands variables in "
            "#SBATCH lines; a missing directory makes the job fail without any log. Keep it in "
            "git (logs/.gitkeep) so that every clone has it.",
        ),
        Rule(
            "SB-ACCOUNT",
            "Without --account the job is charged to your default project (or rejected when you "
            "have none); most Alps users belong to several. Silence it for the file if intended.",
            file_level=True,
        ),
        # --- shell scripts (sbatch and *.sh)
        Rule(
            "LUSTRE-STRIPE",
            "'lfs setstripe ... -c -1' stripes over every OST (~160 on Capstor), the stale layout "
            "of older guides; CSCS now recommends 'lfs setstripe -E 4M -c 1 -E 64M -c 4 -E -1 "
            "-c 32 -S 4M' (uenv caps striping at 32 too).",
        ),
    ]
}


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

EDF_KEYS = (
    "base_environment",
    "image",
    "workdir",
    "entrypoint",
    "writable",
    "mounts",
    "env",
    "annotations",
    "devices",
)
EDF_DIRS = {"container", "containers", "edf", ".edf"}
EDF_HINT_RE = re.compile(r"(?m)^\s*(?:(?:image|mounts|base_environment)\s*=|\[\s*annotations\b)")
KEY_PART = r"""(?:[A-Za-z0-9_-]+|"(?:[^"\\]|\\.)*"|'[^']*')"""
DOTTED_KEY = rf"{KEY_PART}(?:\s*\.\s*{KEY_PART})*"
HEADER_RE = re.compile(rf"\s*\[\[?\s*({DOTTED_KEY})\s*\]")
ASSIGN_RE = re.compile(rf"\s*({DOTTED_KEY})\s*=")
BASE_MARKER_RE = re.compile(
    r"(?m)^\s*#\s*(?:alps-lint:\s*base\s*=|base\s*:)\s*(ngc|alps-extended|other)\b"
)
WHOLE_HOME_RE = re.compile(r"^(?:~|\$\{?HOME\}?|/users(?:/[^/]+)?)$")
OFI = "com.hooks.aws_ofi_nccl.enabled"
CXI = "com.hooks.cxi.enabled"
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


def check_edf(display: str, path: Path, text: str, root: Path) -> list[Finding]:
    lines = text.splitlines()
    if tomllib is None:
        print("alps_lint: Python < 3.11 needs the tomli package to read EDFs", file=sys.stderr)
        raise SystemExit(2)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        return [Finding(display, 1, "EDF-TOML", f"not valid TOML: {err}")]

    index = key_lines(lines)
    findings: list[Finding] = []

    def line_of(key: str, needle: str | None = None) -> int:
        start = index.get(key) or index.get(key.partition(".")[0]) or 1
        # an array element: the first line from the key on that holds it (quoted if possible)
        for probe in (f'"{needle}"', f"'{needle}'", needle) if needle else ():
            for number in range(start, len(lines) + 1):
                if probe in lines[number - 1]:
                    return number
        return start

    def report(line: int, rule: str, message: str) -> None:
        findings.append(Finding(display, line, rule, message))

    for key, value in data.items():
        if key not in EDF_KEYS:
            close = difflib.get_close_matches(key, EDF_KEYS, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            report(line_of(key), "EDF-KEY", f"unknown top-level key '{key}'{hint}")
            continue
        kinds, wanted = EDF_TYPES[key]
        if not isinstance(value, kinds) or (
            isinstance(value, list) and not all(isinstance(v, str) for v in value)
        ):
            report(line_of(key), "EDF-TYPE", f"'{key}' must be {wanted}, not {type_name(value)}")
    for table in ("env", "annotations"):
        if not isinstance(data.get(table), dict):
            continue
        for name, value in flatten(data[table]).items():
            if not isinstance(value, str):
                report(
                    line_of(f"{table}.{name}"),
                    "EDF-TYPE",
                    f"[{table}] {name} must be a string, not {type_name(value)}",
                )

    # every string value, with the line it is written on
    strings: list[tuple[str, str, int]] = []  # (key, value, line)
    for key, value in data.items():
        if isinstance(value, str):
            strings.append((key, value, line_of(key)))
        elif isinstance(value, list):
            strings += [(key, v, line_of(key, v)) for v in value if isinstance(v, str)]
        elif isinstance(value, dict):
            for name, item in flatten(value).items():
                if isinstance(item, str):
                    strings.append((f"{key}.{name}", item, line_of(f"{key}.{name}")))
    for key, value, line in strings:
        for name in dict.fromkeys(unbraced_vars(value)):
            braced = "${" + name + "}"
            report(line, "EDF-VAR", f"'${name}' in {key} without braces: write '{braced}'")

    image = data.get("image") if isinstance(data.get("image"), str) else ""
    paths: list[tuple[str, str, int]] = []  # (what, path, line)
    if image and is_local_image(image):
        paths.append(("image", image, line_of("image")))
    if isinstance(data.get("workdir"), str):
        paths.append(("workdir", data["workdir"], line_of("workdir")))
    for key, mount, line in strings:
        if key != "mounts":
            continue
        source = split_mount(mount)[0]
        normal = source.rstrip("/") or "/"
        if WHOLE_HOME_RE.match(normal):
            report(line, "EDF-HOME", f"mounts the whole home directory ('{source}')")
        paths.append(("mount source", source, line))
    for what, value, line in paths:
        if value and is_relative(value):
            report(line, "EDF-RELPATH", f"relative {what} '{value}' must start with './'")

    base, how, conflict = detect_base(text, image, path, root)
    marker = BASE_MARKER_RE.search(text)
    if conflict and marker:
        report(text.count("\n", 0, marker.start(1)) + 1, "EDF-BASE", conflict)
    annotations = data.get("annotations") if isinstance(data.get("annotations"), dict) else {}
    annotations = flatten(annotations)
    ofi = str(annotations.get(OFI, "")).lower() == "true"
    image_line = line_of("image") if "image" in data else 1

    def wrong(key: str, table: dict, good: object) -> bool:
        """key set to another value than good, or missing (unless a base_environment may set it)."""
        if key in table:
            return str(table[key]).lower() != str(good).lower()
        return "base_environment" not in data

    if base == "alps-extended":
        if ofi:
            report(
                line_of(f"annotations.{OFI}"),
                "EDF-EXT-OFI",
                f"{OFI} with an Alps Extended Image ({how}): remove it",
            )
        if wrong(CXI, annotations, "false"):
            line = line_of(f"annotations.{CXI}") if CXI in annotations else image_line
            report(
                line,
                "EDF-EXT-CXI",
                f'an Alps Extended Image ({how}) needs {CXI} = "false"',
            )
        if wrong("entrypoint", data, True):
            line = line_of("entrypoint") if "entrypoint" in data else image_line
            report(
                line,
                "EDF-EXT-ENTRYPOINT",
                f"an Alps Extended Image ({how}) needs entrypoint = true",
            )
    elif wrong(OFI, annotations, "true"):
        line = line_of(f"annotations.{OFI}") if OFI in annotations else image_line
        report(
            line,
            "EDF-OFI",
            f'{OFI} = "true" is missing for {BASE_NAMES[base]} ({how})',
        )
    return findings


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


def sourced_assignments(commands: list[Command], root: Path) -> set[str]:
    """Variables assigned in repository files the script sources (e.g. a shared NCCL snippet)."""
    names: set[str] = set()
    for command in commands:
        for match in SOURCE_RE.finditer(command.code):
            target = match.group(1).strip("\"'")
            target = re.sub(r"^\$\{?(?:SLURM_SUBMIT_DIR|PWD)\}?/", "", target)
            if "$" in target:
                continue
            candidate = root / target
            if candidate.is_file():
                text = candidate.read_text(encoding="utf-8", errors="replace")
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


def check_logdir(display: str, directive: Directive, root: Path) -> Finding | None:
    directory = posixpath.dirname(directive.value)
    option = directive.name

    def finding(message: str) -> Finding:
        return Finding(display, directive.line, "SB-LOGDIR", message)

    if not directory or directory.startswith("/"):
        return None
    if "$" in directory:
        return finding(f"{option} directory '{directory}': #SBATCH lines expand no variables")
    if "%" in directory:
        return finding(f"{option} directory '{directory}' has a %-pattern: Slurm cannot create it")
    if not (root / directory).is_dir():
        return finding(f"{option} directory '{directory}/' does not exist in the repository")
    if git_tracks_something(root, directory) is False:
        return finding(f"{option} directory '{directory}/' has no file in git: add .gitkeep")
    return None


def check_script(display: str, text: str, root: Path, job: bool) -> list[Finding]:
    lines = text.splitlines()
    commands = shell_commands(text)
    findings: list[Finding] = []

    def report(line: int, rule: str, message: str, end: int = 0) -> None:
        findings.append(Finding(display, line, rule, message, end))

    for command in commands:
        if STRIPE_RE.search(command.code) and ALL_OSTS_RE.search(command.code):
            report(
                command.start,
                "LUSTRE-STRIPE",
                "'-c -1' stripes over all OSTs: use 'lfs setstripe -E 4M -c 1 -E 64M -c 4 "
                "-E -1 -c 32 -S 4M'",
                command.end,
            )
    if not job:
        return findings

    directives = sbatch_directives(lines)
    for d in directives:
        if d.name == "--environment":
            report(d.line, "SB-ENV-DIRECTIVE", "#SBATCH --environment: put it on each srun instead")
        elif d.name in ("--output", "--error"):
            problem = check_logdir(display, d, root)
            if problem:
                findings.append(problem)
    if not any(d.name == "--account" for d in directives):
        report(1, "SB-ACCOUNT", "no #SBATCH --account: the job is charged to your default project")

    variables = variable_texts(commands)
    sruns: list[tuple[Command, bool]] = []
    for command in commands:
        match = SRUN_RE.search(command.code)
        if not match:
            continue
        args = command.code[match.end() :]
        for name in ARRAY_REF_RE.findall(args):  # srun "${srun_args[@]}" ...
            args += variables.get(name, "")
        sruns.append((command, "--environment" in args))
    container_job = any(has_env for _, has_env in sruns)
    uenv_lines = [d.line for d in directives if d.name == "--uenv"]
    uenv_lines += [c.start for c, _ in sruns if re.search(r"--uenv[=\s]", c.code)]
    assigned = assignments(commands)

    if container_job:
        for command, has_env in sruns:
            if not has_env:
                report(
                    command.start,
                    "SB-SRUN-ENV",
                    "srun without --environment in a container job: this step runs on the host",
                    command.end,
                )
        per_line: dict[int, list[str]] = {}
        for name, line in assigned:
            if name in UENV_SNIPPET or name.startswith("FI_CXI_"):
                per_line.setdefault(line, []).append(name)
        for line, names in sorted(per_line.items()):
            report(
                line,
                "SB-CE-NCCL",
                f"container job sets {', '.join(names)}: the CE hook sets these, drop the export",
            )
        for command in commands:
            for match in TRITON_SHM_RE.finditer(command.code):
                report(
                    command.line_at(match.start()),
                    "SB-CE-TRITON",
                    "TRITON_HOME on /dev/shm in a container job: use a path in the container",
                )
    if uenv_lines:
        names = {name for name, _ in assigned} | sourced_assignments(commands, root)
        missing = [name for name in UENV_SNIPPET if name not in names]
        if missing:
            report(
                min(uenv_lines),
                "SB-UENV-NCCL",
                f"uenv job without the CSCS NCCL/libfabric variables: {', '.join(missing)}",
            )
        for name, line in assigned:
            if name == "NCCL_NET_PLUGIN":
                report(line, "SB-UENV-PLUGIN", "NCCL_NET_PLUGIN in a uenv job: remove it")
    return findings


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


def lint_file(display: str, path: Path, root: Path) -> list[Finding]:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as err:
        print(f"alps_lint: cannot read {display}: {err}", file=sys.stderr)
        raise SystemExit(2) from err
    if path.suffix == ".toml":
        findings = check_edf(display, path, text, root) if is_edf(path, text) else []
    else:
        job = path.suffix == ".sbatch" or bool(SBATCH_LINE_RE.search(text))
        findings = check_script(display, text, root, job)
    return sorted(unsilenced(findings, text.splitlines()), key=lambda f: f.line)


def explain(ids: list[str]) -> int:
    unknown = [i for i in ids if i not in RULES]
    if unknown:
        print(f"unknown rule id(s): {', '.join(unknown)}", file=sys.stderr)
        return 2
    for rule in (RULES[i] for i in ids) if ids else RULES.values():
        scope = " (file-level)" if rule.file_level else ""
        print(f"{rule.id}{scope}: {rule.why}")
    return 0


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
    args = parser.parse_args(argv)
    if args.explain is not None:
        return explain(args.explain)

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
