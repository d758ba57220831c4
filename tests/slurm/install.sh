#!/usr/bin/env bash
# Install what the Slurm test harnesses (tests/slurm/harness.py, two_node.py) need from Debian:
# slurmctld, slurmd, the client commands, munge, the SPANK headers and a C compiler, PMIx
# (the Alps Extended Image jobs run `srun --mpi=pmix`; Slurm's plugin dlopens libpmix.so), and
# for the two-node cluster iproute2 (ip: bridge, veth, netns) and util-linux (nsenter, unshare).
# Idempotent and quiet; needs root (or passwordless sudo). Debian/Ubuntu only.
set -euo pipefail

packages=(slurmctld slurmd slurm-client munge libslurm-dev gcc libc6-dev libpmix2 libpmix-dev
    iproute2 util-linux)

missing=()
for pkg in "${packages[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q '^install ok installed$'; then
        missing+=("$pkg")
    fi
done
if [[ ${#missing[@]} -eq 0 ]]; then
    echo "tests/slurm/install.sh: all packages present"
    exit 0
fi

sudo_cmd=()
if [[ $(id -u) -ne 0 ]]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
        sudo_cmd=(sudo -n)
    else
        echo "tests/slurm/install.sh: need root to install: ${missing[*]}" >&2
        exit 1
    fi
fi

export DEBIAN_FRONTEND=noninteractive
echo "tests/slurm/install.sh: installing ${missing[*]}"
log="$(mktemp)"
policy_rc=/usr/sbin/policy-rc.d
created_policy=0
cleanup() {
    if [[ $created_policy -eq 1 ]]; then
        "${sudo_cmd[@]}" rm -f "$policy_rc"
    fi
    rm -f "$log"
}
trap cleanup EXIT
# quiet on success, the whole apt output on failure
quietly() {
    if ! "$@" >"$log" 2>&1; then
        cat "$log" >&2
        echo "tests/slurm/install.sh: failed: $*" >&2
        exit 1
    fi
}
quietly "${sudo_cmd[@]}" apt-get update -qq
# the packages' maintainer scripts try to start the daemons; the harness runs its own instances
# with its own configuration, so keep the distribution's services from starting here
if [[ ! -e $policy_rc ]]; then
    printf '#!/bin/sh\nexit 101\n' | "${sudo_cmd[@]}" tee "$policy_rc" >/dev/null
    "${sudo_cmd[@]}" chmod 755 "$policy_rc"
    created_policy=1
fi
quietly "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends \
    -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold "${missing[@]}"
echo "tests/slurm/install.sh: done"
