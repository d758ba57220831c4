#!/bin/bash
# Create the venv that layers this project on top of the {% if cookiecutter.env_flavour == "both" %}container or uenv{% else %}{{ cookiecutter.env_flavour }}{% endif %}, without reinstalling torch.
#
# Usage (from the repository root):
{%- if cookiecutter.env_flavour != "uenv" %}
#   scripts/setup_venv.sh container         # runs itself inside the container (one short srun)
{%- endif %}
{%- if cookiecutter.env_flavour != "container" %}
#   scripts/setup_venv.sh uenv              # runs itself inside the uenv (uenv run)
{%- endif %}
#   scripts/setup_venv.sh FLAVOUR --here    # already inside that environment (or off Alps: current python3)
#   scripts/setup_venv.sh FLAVOUR --squash  # also pack the venv into a squashfs image (see README)
#   scripts/setup_venv.sh FLAVOUR -- metatrain==2026.4.1   # and what your program needs (pip
#                                           # arguments, with the environment's torch kept)
#
# The venv (.venv-FLAVOUR) uses --system-site-packages so torch, CUDA and NCCL come from the
# environment; it belongs to exactly one image: rebuild it after changing the image. It holds
# the project (editable) with its dev extras (pytest, pre-commit), on Alps and locally alike.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

usage() {
    echo "usage: $0 {% if cookiecutter.env_flavour == 'both' %}container|uenv{% else %}{{ cookiecutter.env_flavour }}{% endif %} [--here] [--squash] [-- PACKAGE...]" >&2
    exit 2
}

flavour="${1:-}"
[[ $# -gt 0 ]] && shift
here=0
squash=0
extra=()  # after --: what your program needs, installed with the project
while [[ $# -gt 0 ]]; do
    case "$1" in
        --here) here=1 ;;
        --squash) squash=1 ;;
        --)
            shift
            extra=("$@")
            break
            ;;
        *) usage ;;
    esac
    shift
done
case "${flavour}" in
{%- if cookiecutter.env_flavour != "uenv" %}
    container) ;;
{%- endif %}
{%- if cookiecutter.env_flavour != "container" %}
    uenv) ;;
{%- endif %}
    *) usage ;;
esac
venv=".venv-${flavour}"

if [[ ${here} -eq 0 ]]; then
    forward=("${flavour}" --here)
    [[ ${squash} -eq 1 ]] && forward+=(--squash)
    forward+=(-- "${extra[@]}")
{%- if cookiecutter.env_flavour != "uenv" %}
    if [[ "${flavour}" == container ]]; then
        # The EDF mounts these; the Container Engine refuses to start if a mount source is missing.
        # shellcheck source=scripts/dirs.sh
        source scripts/dirs.sh
        data="$(data_root)"
        runs="$(runs_root)"
        mkdir -p "${data}" "${runs}"
        # The Container Engine only runs under srun: a one-task job on a compute node, where the
        # training job runs (the account and partition of its #SBATCH lines: change them there).
        mapfile -t where < <(sed -n -E 's/^#SBATCH (--(account|partition)=[^[:space:]]+).*/\1/p' jobs/train_container.sbatch)
        exec srun "${where[@]}" --nodes=1 --ntasks=1 --time=00:30:00 \
            --environment="${PWD}/container/edf.toml"{% if cookiecutter.container_base == "alps-extended" %} --mpi=pmix --network=disable_rdzv_get{% endif %} \
            bash scripts/setup_venv.sh "${forward[@]}"
    fi
{%- endif %}
{%- if cookiecutter.env_flavour != "container" %}
    if [[ "${flavour}" == uenv ]]; then
        exec uenv run "{{ cookiecutter.__uenv_image }}" --view=default -- bash scripts/setup_venv.sh "${forward[@]}"
    fi
{%- endif %}
fi

# --- inside the environment from here on ---
# Inside an active venv, python3 is that venv's, and a venv made from it with
# --system-site-packages sees the base interpreter's packages, not the active venv's torch.
if [[ -n "${VIRTUAL_ENV:-}" ]]; then
    echo "error: a venv is active (VIRTUAL_ENV=${VIRTUAL_ENV}): the new venv would see the base interpreter's torch, not that venv's. Run 'deactivate' first." >&2
    exit 2
fi
# The same when a venv's bin/ comes first on PATH without activating it.
if venv_prefix="$(python3 -c 'import sys; print(sys.prefix) if sys.prefix != sys.base_prefix else sys.exit(1)')"; then
    echo "error: $(command -v python3) belongs to the venv ${venv_prefix}: a venv made from it would see the base interpreter's torch, not that venv's. Put the environment's python3 first on PATH." >&2
    exit 2
fi
# find_spec, not import: importing torch takes seconds (more on a login node's file system)
if ! python3 -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('torch') is None)" 2>/dev/null; then
    echo "error: $(command -v python3) has no torch: the venv layers on the environment's torch (off Alps: install torch for this python3 first)" >&2
    exit 2
fi
# A uenv may put its site-packages on PYTHONPATH, which would shadow the venv (CSCS python guide).
unset PYTHONPATH
if [[ "${flavour}" == uenv ]]; then
    PYTHONUSERBASE="$(dirname "$(dirname "$(command -v python3)")")"  # no readlink -f: keep the uenv path
    export PYTHONUSERBASE
fi

python3 -m venv --system-site-packages "${venv}"
# Pin pip to the environment's own torch (NGC builds such as 2.8.0a0+...nv25.06 are not on PyPI)
# and, where the environment has it, its torchvision (built against that torch): pip then cannot
# replace either with a generic wheel from PyPI (`pip install -e '.[{{ {"program": "dev", "language": "hf"}.get(cookiecutter.workload, "vision") }}]'` included).
# The installed distribution's version is what pip compares with (and reading it imports nothing).
"${venv}/bin/python" - > "${venv}/torch-constraint.txt" <<'PY'
import importlib
from importlib import metadata

for name in ("torch", "torchvision"):
    try:
        print(f"{name}=={metadata.version(name)}")
    except metadata.PackageNotFoundError:  # no metadata: its own version, if it is there at all
        try:
            print(f"{name}=={importlib.import_module(name).__version__}")
        except ImportError:
            if name == "torch":
                raise
PY
# The venv's own pip.conf keeps these pins for every later `pip install` in it (an extra such as
# '.[{{ {"program": "dev", "language": "lora"}.get(cookiecutter.workload, "timm") }}]' included), not only this one. As a file: URL, percent-encoded: pip splits a
# config value at whitespace, and the project's path may hold a space.
"${venv}/bin/python" - "${venv}" > "${venv}/pip.conf" <<'PY'
import pathlib
import sys

constraint = (pathlib.Path(sys.argv[1]) / "torch-constraint.txt").resolve().as_uri()
print(f"[global]\nconstraint = {constraint}")
PY
# Your program's packages (after --) in the same pip call: resolved together, under the same pin.
if ! "${venv}/bin/python" -m pip install --quiet -c "${venv}/torch-constraint.txt" \
    --editable '.[dev]' "${extra[@]}"; then
    echo "error: pip could not install the project${extra[*]:+ and ${extra[*]}} beside the environment's $(paste -sd ' ' "${venv}/torch-constraint.txt") (pip's lines above say why)" >&2
    exit 2
fi
"${venv}/bin/python" - <<'PY'
import importlib.util
import re
import sys
from importlib import metadata
from pathlib import Path


def fail(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


# The package must be this repository's: a distribution of the environment that installs a
# module of the same name would be shadowed by it, or shadow it (the template refuses the
# names it knows; an image or uenv may bring others).
name, own = "{{ cookiecutter.package_name }}", "{{ cookiecutter.project_slug }}"
others = {d for d in metadata.packages_distributions().get(name, [])
          if re.sub(r"[-_.]+", "-", d).lower() != own}
if others:
    fail(f"the package name {name!r} is also installed by {', '.join(sorted(others))} in this "
         f"environment: rename the package (src/{name}, pyproject.toml) and run this again")
spec = importlib.util.find_spec(name)
origin = Path(spec.origin).resolve() if spec and spec.origin else None
if origin is None or not origin.is_relative_to(Path("src", name).resolve()):
    fail(f"'import {name}' finds {origin or 'nothing'}, not this repository's src/{name}")
import torch  # noqa: E402
if torch.__file__.startswith(sys.prefix):
    fail(f"torch was installed into the venv ({torch.__file__}); it must come from the environment")
print(f"venv {sys.prefix}: torch {torch.__version__} from {torch.__file__}")
vision = importlib.util.find_spec("torchvision")  # not imported: it would load its C ops
if vision and vision.origin and vision.origin.startswith(sys.prefix):
    fail(f"torchvision was installed into the venv ({vision.origin}); it must come from the "
         "environment, built for its torch")
PY

if [[ ${squash} -eq 1 ]]; then
    # Many small files are slow on Lustre: one squashfs image is one file. A plain venv is not
    # relocatable, so mount the image exactly at ${PWD}/${venv} (see README, "Squash the venv").
    mksquashfs "${venv}" "${venv}.squashfs" -no-recovery -noappend -Xcompression-level 3
    echo "wrote ${venv}.squashfs; mount it at ${PWD}/${venv}"
fi
