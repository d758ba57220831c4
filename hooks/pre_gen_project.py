"""Validate every answer before cookiecutter writes anything.

Choice and yes/no answers given on the command line are checked earlier, by hooks/pre_prompt.py
(cookiecutter checks them itself, with a traceback, before this hook runs).

cookiecutter renders every answer with Jinja (prompted or given as `key=value` with
--no-input) before any hook runs; the template's Jinja extension (alps_torch_template_guard.py,
loaded through cookiecutter.json's `_extensions`) hands an answer with Jinja syntax over
literally, never evaluated, and this hook refuses it ("no template syntax"). It checks every
answer against the form the generated files need (ASCII patterns, a length limit per field, no
path that would mount or stripe `/`, `/users`, a home directory or a shared file-system root).

On failure it prints one line per bad answer (field, value, accepted form) and exits 1;
cookiecutter then removes the project directory (and, for a slug with '/', a child process
removes the empty parent directories cookiecutter created for it).
"""

from __future__ import annotations

import json
import keyword
import os
import posixpath  # noqa: F401 - used by what the hook includes (templates/alps_home.py.j2)
import re
import shutil
import subprocess
import sys
import tempfile
import unicodedata
from pathlib import Path

ANSWERS: dict = json.loads({{cookiecutter | tojson | tojson}})

# cookiecutter.json's choice lists (its context holds only the answers; the template's Jinja
# extension, alps_torch_template_guard.py, reads them where the template renders)
CHOICES: dict[str, list[str]] = json.loads({{template_choices | tojson | tojson}})
# git_init is a boolean; "yes"/"no" still come from .cruft.json files of older template versions.
BOOLEANS = {"git_init": (True, False, "yes", "no")}

# Free text ends up in TOML strings (rendered with tojson), in comments and in Markdown (escaped
# there, see templates/markdown.j2): it may contain quotes, $, backticks, ; and backslashes, but
# only printable characters, and nothing outside the Basic Multilingual Plane (JSON would escape
# it as a surrogate pair, which TOML rejects).
FREE_TEXT = ("project_name", "description", "author_name")
# Unicode categories that are not printable text: controls (Cc: newline, tab, NEL U+0085, the C1
# controls), format characters (Cf: the bidi embeddings, overrides and isolates U+202A-U+202E and
# U+2066-U+2069, the marks U+200E/U+200F/U+061C, zero-width characters, the BOM U+FEFF), line and
# paragraph separators (Zl U+2028, Zp U+2029: line ends for Python, JavaScript and editors),
# surrogates, private-use and unassigned code points. A bidi control can make a line show text
# in an order other than the one the shell and TOML read.
NOT_PRINTABLE = {
    "Cc": "a control character",
    "Cf": "an invisible format or bidi control character",
    "Zl": "a line separator",
    "Zp": "a paragraph separator",
    "Cs": "a surrogate",
    "Co": "a private-use character",
    "Cn": "an unassigned code point",
}

# Every answer has a length limit; the message states it.
MAX_LENGTH = {
    "project_name": 100,
    "description": 300,
    "author_name": 100,
    "author_email": 254,  # RFC 5321
    "project_slug": 64,  # the Slurm job name and a directory name
    "package_name": 64,
    "account": 64,
    "partition": 64,
    "__ngc_pytorch_tag": 5,
    "__alps_extended_tag": 24,
    "__uenv_image": 128,
    "nodes": 4,
    "time_limit": 16,
    "image_dir": 255,
    "data_dir": 255,
    "checkpoint_dir": 255,
    "_lustre_layout": 200,
}

# ${NAME} references are expanded by bash and by the Container Engine alike; other shell
# syntax ($NAME without braces, $(...), quotes, spaces) is not allowed in a path. Only these
# Alps variables (https://docs.cscs.ch/storage/filesystems/) may appear: one that holds an
# absolute directory may start the path, ${USER} may follow an absolute start
# (/capstor/scratch/cscs/${USER}). Any other variable could hold anything (${IFS} splits words,
# ${PATH} is a list, an unset one is an error in an EDF), and ${USER}/data would be a relative
# path.
PATH_START_VARIABLES = ("SCRATCH", "HOME", "STORE")  # $STORE: only on some clusters (Daint)
PATH_INNER_VARIABLES = ("USER",)
_START = "|".join(PATH_START_VARIABLES)
_INNER = "|".join(PATH_INNER_VARIABLES)
# (built by concatenation: two braces in a row would start a Jinja expression in this file)
PATH_RE = r"(?:/|\$\{(?:" + _START + r")\}(?=/|$))(?:[A-Za-z0-9_.+@/-]|\$\{(?:" + _INNER + r")\})*"
PATH_FORM = (
    "an absolute path, or one starting with ${SCRATCH}, ${HOME} or ${STORE}, e.g. "
    "${SCRATCH}/ce-images; letters, digits, _ . + @ - / and ${USER} after the start only"
)
PATH_FIELDS = ("image_dir", "data_dir", "checkpoint_dir")

# (regular expression matched in full, ASCII only; accepted form shown in the message)
PATTERNS: dict[str, tuple[str, str]] = {
    "project_slug": (
        r"[a-z][a-z0-9]*(-[a-z0-9]+)*",
        "lowercase letters and digits in words joined by '-', e.g. my-project",
    ),
    "package_name": (r"[a-z][a-z0-9_]*", "a lowercase Python identifier, e.g. my_project"),
    # What setuptools writes into the metadata as an address (Python's e-mail parser): the
    # local part is dot-atoms (no leading, trailing or double dot), the domain is DNS labels
    # that neither start nor end with '-', joined by single dots, ending in a letter-only TLD.
    "author_email": (
        r"(?=[^@]{1,64}@)[A-Za-z0-9_%+-]+(?:\.[A-Za-z0-9_%+-]+)*"
        r"@(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.)+[A-Za-z]{2,63}",
        "an e-mail address such as ada@example.org: dot-separated words of letters, digits and "
        "_ % + - before the @ (at most 64 characters), a domain name after it",
    ),
    "account": (
        r"([A-Za-z0-9][A-Za-z0-9_-]*)?",
        "empty (your default account) or a Slurm account such as a-g34 or g34",
    ),
    "partition": (r"[A-Za-z0-9][A-Za-z0-9_-]*", "a Slurm partition name such as normal or debug"),
    "__ngc_pytorch_tag": (r"[0-9]{2}\.[0-9]{2}", "an NGC release YY.MM, e.g. 25.06"),
    "__alps_extended_tag": (
        r"[0-9]{2}\.[0-9]{2}-py3-alps[0-9]{1,3}",
        "YY.MM-py3-alpsN, e.g. 26.02-py3-alps6",
    ),
    "__uenv_image": (
        r"[a-z0-9][a-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._+-]*(:[A-Za-z0-9][A-Za-z0-9._-]*)?",
        "a uenv label name/version[:tag], e.g. pytorch/v2.9.1:v1",
    ),
    "nodes": (r"[1-9][0-9]{0,3}", "a whole number of nodes from 1 to 9999"),
    **{field: (PATH_RE, PATH_FORM) for field in PATH_FIELDS},
}
# The Lustre layout (`_lustre_layout`) is pasted unquoted into `LAYOUT=(...)` of
# scripts/stripe_lustre.sh and split into `lfs setstripe` arguments: only option/number pairs.
_LFS_OPTION = r"-[EcS] -?[0-9]{1,6}[KMG]?"
PATTERNS["_lustre_layout"] = (
    rf"{_LFS_OPTION}(?: {_LFS_OPTION})*",  # length: MAX_LENGTH (this file is rendered by Jinja)
    "lfs setstripe options such as -E 4M -c 1 -E -1 -c 32 -S 4M",
)
# Values derived from the answers in cookiecutter.json (`__derived_*`) can be overridden on the
# command line like any `__` key: they must still have the form their derivation gives.
_TAG = rf"(?:{PATTERNS['__ngc_pytorch_tag'][0]}|{PATTERNS['__alps_extended_tag'][0]})"
PATTERNS |= {
    "__derived_image_tag": (_TAG, "derived from __ngc_pytorch_tag or __alps_extended_tag"),
    "__derived_base_image": (
        rf"(?:nvcr\.io/nvidia/pytorch:{_TAG}-py3|ghcr\.io/eth-cscs/alps-extended-images/ngc-pytorch:{_TAG})",
        "derived from container_base and its tag",
    ),
    "__derived_image_sqsh": (
        rf"{PATH_RE}/[a-z0-9-]+\+{_TAG}\.sqsh",
        "derived: <image_dir>/<project_slug>+<tag>.sqsh",
    ),
}

# Installing the project must not shadow or overwrite a module the job needs (pip install -e
# puts the package on sys.path next to them): the standard library; every module that torch and
# the package's dependencies and extras install (derived, not typed: the block below is written
# by tests/shadowed_names.py, and tests/test_answers_refused.py fails when it misses one); what the
# NGC PyTorch image and the PyTorch uenv bring beyond that, which no test here can list (typed);
# and the generated repository's own top-level directories.
# BEGIN derived by tests/shadowed_names.py --write (torch + every extra)
# fmt: off
DEPENDENCY_MODULES = frozenset({
    "_distutils_hack", "_multiprocess", "_pytest", "_xxhash", "_yaml", "absl", "accelerate",
    "annotated_doc", "annotated_types", "anyio", "certifi", "cfgv", "charset_normalizer", "click",
    "contourpy", "coreweave_evaluations", "cycler", "datasets", "dateutil", "dill", "distlib",
    "distro", "filelock", "fontTools", "fsspec", "functorch", "google", "grpc", "h11", "hf_xet",
    "httpcore", "httpcore2", "httpx", "httpx2", "huggingface_hub", "identify", "idna",
    "iniconfig", "isympy", "jinja2", "kiwisolver", "markdown", "markdown_it", "markupsafe",
    "matplotlib", "mdurl", "mpl_toolkits", "mpmath", "multiprocess", "networkx", "nodeenv",
    "numpy", "opentelemetry", "packaging", "pandas", "peft", "PIL", "platformdirs", "pluggy",
    "pre_commit", "psutil", "py", "pyarrow", "pydantic", "pydantic_core", "pygments", "pylab",
    "pyparsing", "pytest", "python_discovery", "regex", "requests", "rich", "safetensors",
    "setuptools", "shellingham", "six", "sniffio", "sympy", "tensorboard",
    "tensorboard_data_server", "timm", "tokenizers", "torch", "torchgen", "torchvision", "tqdm",
    "transformers", "truststore", "typer", "typing_extensions", "typing_inspection", "urllib3",
    "virtualenv", "wandb", "werkzeug", "xxhash", "yaml",
})
# fmt: on
# END derived
SHADOWED_MODULES = frozenset(
    {
        *getattr(sys, "stdlib_module_names", ()),
        *DEPENDENCY_MODULES,
        *("test", "tests", "conftest", "src", "tools", "scripts", "docs", "configs", "jobs"),
        *("pip", "setuptools", "pkg_resources", "wheel", "distutils", "_distutils_hack"),
        *("pytest", "_pytest", "pluggy", "pre_commit", "ruff", "cruft", "cookiecutter"),
        *("torch", "torchvision", "torchaudio", "torchdata", "torchtext", "functorch"),
        *("triton", "nvidia", "apex", "transformer_engine", "flash_attn", "nvfuser", "cupy"),
        *("tensorrt", "torch_tensorrt", "onnx", "numba", "dali", "nvtx", "cudf", "cuda"),
        *("numpy", "scipy", "pandas", "matplotlib", "sympy", "networkx", "jinja2", "yaml"),
        *("transformers", "datasets", "tokenizers", "huggingface_hub", "safetensors"),
        *("accelerate", "lightning", "pytorch_lightning", "tensorboard", "wandb", "mpi4py"),
        *("packaging", "typing_extensions", "filelock", "fsspec", "requests", "tqdm", "tomli"),
        *("h5py", "psutil", "six", "attr", "attrs", "click", "rich", "google", "ipython"),
        # imported by every interpreter start (site.py) where they are on sys.path
        *("sitecustomize", "usercustomize"),
    }
)

TIME_FORM = (
    "a Slurm time limit from 1 minute to 7 days: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or "
    "D-HH:MM:SS (Alps partitions allow at most 24 hours)"
)
MAX_TIME_S = 7 * 24 * 3600
_TIME_RE = re.compile(
    r"(?:(?P<d>[0-9]{1,2})-(?P<dh>[0-9]{1,2})(?::(?P<dm>[0-9]{1,2})(?::(?P<ds>[0-9]{1,2}))?)?"
    r"|(?P<a>[0-9]{1,5})(?::(?P<b>[0-9]{1,2})(?::(?P<c>[0-9]{1,2}))?)?)",
    re.ASCII,
)

# Directories the project writes to (and the EDF mounts) must not be any of these: a mount of
# $HOME or /users leaks shell init files and caches into the container and exposes personal
# data (https://docs.cscs.ch/software/ml/pytorch/: mount only subdirectories of $HOME);
# striping or filling a shared root affects everyone. Compared after normalisation (see
# normalised_path, below).
SHARED_ROOTS = frozenset(
    {
        "/",
        "/users",
        "/home",
        *("/capstor", "/capstor/scratch", "/capstor/scratch/cscs", "/capstor/store"),
        *("/capstor/store/cscs", "/iopsstor", "/iopsstor/scratch", "/iopsstor/scratch/cscs"),
        *("/iopsstor/store", "/ritom", "/ritom/scratch", "/ritom/scratch/cscs", "/vast"),
        *("/scratch", "/store", "/project", "/appl", "/apps", "/opt", "/usr", "/etc", "/var"),
        *("/tmp", "/dev", "/proc", "/sys", "/run", "/boot", "/root", "/bin", "/sbin", "/lib"),
        *("/lib64", "/mnt", "/srv", "/media"),
    }
)
# Jinja openers, written split: this file is itself rendered by Jinja.
TEMPLATE_SYNTAX = ("{" + "{", "{" + "%", "{" + "#")


# How Alps spells a home directory (HOME) and normalised_path(): templates/alps_home.py.j2,
# written once and included here and into the generated repository's tools/alps_lint.py. It
# starts with a comment line, so that behind '# ' this file is Python before rendering too.
# {% include "alps_home.py.j2" %}


def path_error(value: str) -> str | None:
    """Why a data/run/image directory is unsafe, or None."""
    if any(part == ".." for part in value.split("/")):
        return "a path without '..' components"
    path = normalised_path(value)
    if path in SHARED_ROOTS:
        return f"a directory of your own, not {path} (a shared or system root)"
    if path == "${STORE}":
        return "a subdirectory of ${STORE}, not all of it (the project's store is shared)"
    if path == HOME or re.fullmatch(r"/(users|home)/[^/]+", path):
        return "a subdirectory, not a whole home directory (the EDF would mount it)"
    # /<fs>/scratch/<site> and /capstor/store/<tenant>[/<customer>] hold everyone's directories
    if re.fullmatch(
        r"/(capstor|iopsstor|ritom)/(scratch|store)/[^/]+|/capstor/store/[^/]+/[^/]+", path
    ):
        return f"a directory of your own, not {path} (a shared root)"
    return None


def time_limit_error(value: str) -> str | None:
    """None if value is a valid Slurm time limit from 1 minute to 7 days, else the form."""
    m = _TIME_RE.fullmatch(value)
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
    return None if 60 <= total <= MAX_TIME_S else TIME_FORM


def text_error(field: str, value: str) -> str | None:
    """Problems every text answer is checked for, in this order."""
    if any(0xD800 <= ord(ch) <= 0xDFFF for ch in value):
        return "valid UTF-8 text (a byte of another encoding, e.g. Latin-1, was given)"
    if any(marker in value for marker in TEMPLATE_SYNTAX):
        shown = ", ".join(TEMPLATE_SYNTAX)
        return f"no template syntax ({shown}): answers are data, not templates"
    limit = MAX_LENGTH.get(field)
    if limit is not None and len(value) > limit:
        form = PATTERNS[field][1] + ", " if field in PATTERNS else ""
        return f"{form}at most {limit} characters (got {len(value)})"
    return None


def edge_space_error(value: str) -> str | None:
    """Leading or trailing white space (a trailing space fails the generated repo's own
    trailing-whitespace check; a leading one changes what Markdown makes of a line)."""
    if value and value != value.strip():
        return "no leading or trailing spaces (remove them)"
    return None


def free_text_error(value: str) -> str | None:
    if not value.strip():
        return "one line of printable text, not empty"
    for ch in value:
        kind = NOT_PRINTABLE.get(unicodedata.category(ch))
        if kind or ord(ch) > 0xFFFF:
            kind = kind or "a character outside the Basic Multilingual Plane"
            return (
                "one line of printable characters (no newlines, tabs or other control "
                f"characters): {kind} U+{ord(ch):04X} was given"
            )
    return edge_space_error(value)


def field_error(field: str, value: object) -> str | None:
    """The accepted form when value is not acceptable for field, else None."""
    if field in CHOICES:
        return None if value in CHOICES[field] else "one of " + ", ".join(CHOICES[field])
    if field in BOOLEANS:
        return None if value in BOOLEANS[field] else "true or false (yes or no)"
    if not isinstance(value, str):
        return "a string"
    problem = text_error(field, value)
    if problem:
        return problem
    if field in FREE_TEXT:
        return free_text_error(value)
    if field in PATTERNS:
        pattern, form = PATTERNS[field]
        if not re.fullmatch(pattern, value, re.ASCII):
            return form
    if field in PATH_FIELDS:
        return path_error(value)
    if field == "package_name" and (keyword.iskeyword(value) or value in SHADOWED_MODULES):
        return (
            "a name that does not shadow a Python keyword, a standard-library module, a module "
            "the interpreter imports at start-up (sitecustomize, usercustomize) or a module of "
            "the NGC image or uenv (torch, numpy, pip, setuptools, pytest, triton, ...)"
        )
    if field == "time_limit":
        return time_limit_error(value)
    return None


def slugified(text: str) -> str:
    """The project_slug cookiecutter.json derives from a project name (its `slugify` filter)."""
    try:
        from slugify import slugify  # python-slugify, which cookiecutter itself imports
    except ImportError:  # pragma: no cover - cookiecutter always has it
        return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    return slugify(text)


# What cookiecutter.json derives project_slug to when the name slugifies to nothing: not empty,
# since cookiecutter would then generate into the output directory itself and stop, before this
# hook, with "... directory already exists".
EMPTY_SLUG = "-"


def empty_slug_error(answers: dict) -> str | None:
    """A project name that slugifies to nothing (e.g. '!!!') leaves the repository, package and
    image names empty: explained once, at the answer that caused it."""
    slug, name = answers.get("project_slug"), answers.get("project_name")
    if slug not in ("", EMPTY_SLUG) or not isinstance(name, str) or not name.strip():
        return None
    if field_error("project_name", name) or slugified(name) != "":
        return None  # a bad name is reported as such; project_slug='' was given explicitly
    return (
        "a name with at least one letter or digit: the repository name project_slug is "
        "derived from it and came out empty (or give project_slug=my-project too)"
    )


# Derived from project_slug in cookiecutter.json; not reported again when the slug came out empty.
SLUG_DERIVED = ("project_slug", "package_name", "__derived_image_sqsh")
_TAGS = ("__ngc_pytorch_tag", "__alps_extended_tag")
# What cookiecutter.json derives each value from: a bad answer is reported once, at itself, not
# again at every value derived from it.
DERIVED_FROM = {
    "project_slug": ("project_name",),
    "package_name": ("project_slug",),
    "__derived_image_tag": _TAGS,
    "__derived_base_image": _TAGS,
    "__derived_image_sqsh": ("image_dir", "project_slug", "__derived_image_tag", *_TAGS),
}


def derived_from_a_bad_answer(field: str, value: object, answers: dict) -> bool:
    """Whether value is (or, for a path, contains) an answer that is itself refused."""
    bad = [s for s in DERIVED_FROM.get(field, ()) if field_error(s, answers.get(s))]
    if field in PATH_FIELDS and field_error("project_slug", answers.get("project_slug")):
        slug = str(answers.get("project_slug"))
        bad += ["project_slug"] if slug and slug in str(value) else []  # the default paths
    return bool(bad)


def validate(answers: dict) -> list[str]:
    """One message per invalid answer (empty list: all valid). Settings that are not asked
    (`__key`, given as `__key=value`) are checked too, and `_key` values that reach a file."""
    errors = []
    no_slug = empty_slug_error(answers)
    for field, value in answers.items():
        if field.startswith("_") and not field.startswith("__") and field not in PATTERNS:
            continue  # the template's own values (_template, _output_dir, ...)
        if no_slug and field in SLUG_DERIVED:
            continue
        if derived_from_a_bad_answer(field, value, answers):
            continue  # reported at the answer it comes from
        form = no_slug if no_slug and field == "project_name" else field_error(field, value)
        if form:
            shown = value
            if isinstance(value, str):  # a lone surrogate cannot be printed as it is
                shown = value.encode("utf-8", "backslashreplace").decode()
            if isinstance(shown, str) and len(shown) > 80:
                shown = shown[:60] + f"... ({len(shown)} characters)"
            errors.append(f"{field} = {shown!r} is invalid: expected {form}")
    return errors


_CLEANER = """
import os, sys, time
project, parents = sys.argv[1], sys.argv[2:]
deadline = time.monotonic() + 30
while os.path.exists(project) and time.monotonic() < deadline:
    time.sleep(0.05)
for directory in parents:
    try:
        os.rmdir(directory)
    except OSError:
        break
"""


def clean_slug_parents(answers: dict) -> None:
    """A slug with '/' made cookiecutter create every directory on the way (mkdir parents=True);
    on a failed hook it removes only the project directory, after this hook has exited. A
    detached child waits for that, then removes the parents it created if they are empty."""
    slug, output_dir = str(answers.get("project_slug", "")), answers.get("_output_dir")
    if "/" not in slug or not output_dir:
        return
    parents, base = [], Path(output_dir)
    for part in Path(slug).parts[:-1]:
        if part in ("..", ".", "/"):
            break
        base = base / part
        parents.append(str(base))
    if parents:
        subprocess.Popen(
            [sys.executable, "-c", _CLEANER, os.getcwd(), *reversed(parents)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )


def template_copy(answers: dict) -> Path | None:
    """The copy of the template cookiecutter runs from (`_repo_dir`, made because the template
    has a pre_prompt hook: /tmp/cookiecutterXXXX/<template>), or None if it is not one."""
    repo_dir = answers.get("_repo_dir")
    if not isinstance(repo_dir, str) or not repo_dir:
        return None
    copy = Path(repo_dir).resolve()
    holder = copy.parent
    template = str(answers.get("_template", ""))
    if template and Path(template).expanduser().resolve() == copy:
        return None  # the template itself
    if (
        holder.parent == Path(tempfile.gettempdir()).resolve()
        and holder.name.startswith("cookiecutter")
        and [p.name for p in holder.iterdir()] == [copy.name]
        and (copy / "hooks" / "pre_prompt.py").is_file()
        and (copy / "cookiecutter.json").is_file()
    ):
        return copy
    return None


def remove_template_copy(answers: dict) -> None:
    """cookiecutter removes its template copy only after a successful generation: after a failed
    hook it would stay behind. Removed here, with the directory that holds it."""
    copy = template_copy(answers)
    if copy:
        shutil.rmtree(copy.parent, ignore_errors=True)


_HOLDER_CLEANER = """
import os, sys, time
copy, holder = sys.argv[1], sys.argv[2]
deadline = time.monotonic() + 600
while os.path.exists(copy) and time.monotonic() < deadline:
    time.sleep(0.2)
try:
    os.rmdir(holder)
except OSError:
    pass
"""


def remove_copy_holder_later(answers: dict) -> None:
    """After a successful generation cookiecutter removes its template copy but not the
    directory it made to hold it (/tmp/cookiecutterXXXX): a detached child waits for the copy to
    go, then removes that directory if it is empty."""
    copy = template_copy(answers)
    if copy:
        subprocess.Popen(
            [sys.executable, "-c", _HOLDER_CLEANER, str(copy), str(copy.parent)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )


def remove_this_script() -> None:
    """cookiecutter runs this hook from a rendered copy in the temporary directory
    (tmpXXXX.py, holding every answer) and never removes it; Python has read it already."""
    script = Path(__file__).resolve()
    if script.parent == Path(tempfile.gettempdir()).resolve() and script.name.startswith("tmp"):
        script.unlink(missing_ok=True)


def main() -> int:
    remove_this_script()
    errors = validate(ANSWERS)
    for message in errors:
        print(f"error: {message}", file=sys.stderr)
    if errors:
        print(
            "Nothing was generated. Run cookiecutter again with corrected answers.",
            file=sys.stderr,
        )
        clean_slug_parents(ANSWERS)
        remove_template_copy(ANSWERS)
        return 1
    remove_copy_holder_later(ANSWERS)
    return 0


if __name__ == "__main__":
    sys.exit(main())
