#!/bin/bash
# Apply CSCS's Lustre layout to the directories this project writes large files to.
# Usage: scripts/stripe_lustre.sh [DIR ...]   (default: the data, run{% if cookiecutter.env_flavour != "uenv" %} and image{% endif %} directories)
# Striping only affects files created afterwards: run it before writing data, images or checkpoints.
set -euo pipefail

# Progressive layout (CSCS storage guide, 2025-11): files up to 4 MB on 1 OST, up to 64 MB on 4,
# the rest over 32 OSTs in 4 MB stripes. Older guides stripe over all OSTs (count -1: ~160 on
# Capstor), which CSCS no longer recommends; uenv itself caps striping at 32.
LAYOUT=({{ cookiecutter._lustre_layout }})

if [[ $# -gt 0 ]]; then
    dirs=("$@")
else
    # shellcheck source=scripts/dirs.sh
    source "$(dirname "${BASH_SOURCE[0]}")/dirs.sh"
    data="$(data_root)"
    runs="$(runs_root)"
    dirs=("${data}" "${runs}")
{%- if cookiecutter.env_flavour != "uenv" %}
    images="$(image_root)"
    dirs+=("${images}")
{%- endif %}
fi

if ! command -v lfs >/dev/null 2>&1; then
    echo "lfs not found (not on Alps?). On Alps run:" >&2
    for dir in "${dirs[@]}"; do
        echo "  mkdir -p '${dir}' && lfs setstripe ${LAYOUT[*]} '${dir}'" >&2
    done
    exit 0
fi

for dir in "${dirs[@]}"; do
    mkdir -p "${dir}"
    if lfs setstripe "${LAYOUT[@]}" "${dir}"; then
        echo "striped ${dir}: $(lfs getstripe -d "${dir}" | tr -s '[:space:]' ' ')"
    else
        echo "warning: could not stripe ${dir} (not on Lustre?)" >&2
    fi
done
