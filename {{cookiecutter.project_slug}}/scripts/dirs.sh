#!/bin/bash
# The directories this project writes to (your cookiecutter answers), written once: edit them
# here. Sourced by jobs/common.sh, scripts/setup_venv.sh and scripts/stripe_lustre.sh; run, it
# prints them. Functions, so that ${SCRATCH} and ${USER} are read when a directory is used, not
# when this file is sourced.
{%- if cookiecutter.env_flavour != "uenv" %}
# container/edf.toml mounts the data and runs directories into the container: change its
# `mounts` with them (a job's DATA_DIR or RUN_DIR outside them is not visible inside).
{%- endif %}
data_root() { printf '%s\n' "{{ cookiecutter.data_dir }}"; }     # datasets (DATA_DIR)
runs_root() { printf '%s\n' "{{ cookiecutter.checkpoint_dir }}"; }     # run directories (RUN_DIR)
{%- if cookiecutter.env_flavour != "uenv" %}
image_root() { printf '%s\n' "{{ cookiecutter.image_dir }}"; }    # container images (.sqsh)
{%- endif %}

# A caller assigns a directory before using it (dir="$(data_root)"): then an unset SCRATCH or
# USER stops it under set -eu, where inside a command's arguments it would go unnoticed.
if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then  # run, not sourced
    set -euo pipefail
    data="$(data_root)"
    runs="$(runs_root)"
    printf 'data: %s\nruns: %s\n' "${data}" "${runs}"
{%- if cookiecutter.env_flavour != "uenv" %}
    images="$(image_root)"
    printf 'images: %s\n' "${images}"
{%- endif %}
fi
