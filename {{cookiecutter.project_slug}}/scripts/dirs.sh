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

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then  # run, not sourced
    set -euo pipefail
    printf 'data: %s\nruns: %s\n' "$(data_root)" "$(runs_root)"
{%- if cookiecutter.env_flavour != "uenv" %}
    printf 'images: %s\n' "$(image_root)"
{%- endif %}
fi
