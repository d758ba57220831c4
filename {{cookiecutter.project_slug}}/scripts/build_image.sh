{%- set cc = cookiecutter -%}
#!/bin/bash
# Build the container image with podman and import it with enroot as the squashfs file that
# container/edf.toml points to. Both steps run in ONE allocation on a compute node: podman's
# storage lives in /dev/shm, which is wiped when the job ends, and GH200 nodes are aarch64.
#
# Usage (from the repository root, on a login node): scripts/build_image.sh
# DRY_RUN=1 scripts/build_image.sh prints the commands without running them.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# The image file is the one container/edf.toml runs (its `image` line, the one place to change
# it). Its ${VAR}s are expanded here from the environment, as the Container Engine does.
SQSH="$(sed -n -E 's/^image = "(.*)"$/\1/p' container/edf.toml)"
if [[ "${SQSH}" != *.sqsh ]]; then
    echo "error: container/edf.toml has no line image = \"<dir>/<name>.sqsh\" to build" >&2
    exit 2
fi
while [[ "${SQSH}" =~ ^(.*)\$\{([A-Za-z_][A-Za-z0-9_]*)\}(.*)$ ]]; do
    var="${BASH_REMATCH[2]}"
    if [[ -z "${!var:-}" ]]; then
        echo "error: container/edf.toml's image uses \${${var}}, which is not set here" >&2
        exit 2
    fi
    SQSH="${BASH_REMATCH[1]}${!var}${BASH_REMATCH[3]}"
done
IMAGE_DIR="$(dirname "${SQSH}")"
name="$(basename "${SQSH}" .sqsh)"  # <project>+<tag>
IMAGE="${name/+/:}"                 # podman's name for it: <project>:<tag>
# The file name carries the tag of the Dockerfile's FROM: a new base image is a new file, so a
# running job never has its image replaced, and the venvs built on the old one stay usable.
from_tag="$(sed -n -E 's/^FROM[[:space:]]+[^[:space:]]+:([^[:space:]]+).*/\1/p' Dockerfile | tail -n 1)"
from_tag="${from_tag%-py3}"  # NGC tags: YY.MM-py3 -> YY.MM
if [[ "${name}" != *"+${from_tag}" ]]; then
    echo "error: the Dockerfile builds FROM ...:${from_tag} but container/edf.toml's image is" \
        "${SQSH}: name it <project>+${from_tag}.sqsh there" >&2
    exit 2
fi

run() {
    echo "+ $*"
    [[ -n "${DRY_RUN:-}" ]] || "$@"
}

if [[ -z "${SLURM_JOB_ID:-}" && -z "${DRY_RUN:-}" ]]; then
    # On a login node: run this same script on a compute node, where the training job runs (the
    # account and partition of its #SBATCH lines: change them there).
    mapfile -t where < <(sed -n -E 's/^#SBATCH (--(account|partition)=[^[:space:]]+).*/\1/p' jobs/train_container.sbatch)
    exec srun "${where[@]}" --nodes=1 --ntasks=1 --time=01:00:00 "${PWD}/scripts/build_image.sh" "$@"
fi

# Podman keeps its storage in node-local memory (/dev/shm): not on Lustre or $HOME, whose file
# locking it cannot use. Written once; an existing storage.conf is left alone.
# No mount_program line: the fuse-overlayfs version on the nodes changes (1.13 -> 1.17 in 2026).
storage_conf="${XDG_CONFIG_HOME:-${HOME}/.config}/containers/storage.conf"
if [[ ! -f "${storage_conf}" ]]; then
    echo "+ writing ${storage_conf}"
    if [[ -z "${DRY_RUN:-}" ]]; then
        mkdir -p "$(dirname "${storage_conf}")"
        cat > "${storage_conf}" <<CONF
[storage]
driver = "overlay"
runroot = "/dev/shm/${USER}/runroot"
graphroot = "/dev/shm/${USER}/root"
CONF
    fi
fi

# Stripe the image directory before the first import: images are 1-20 GB single files.
run mkdir -p "${IMAGE_DIR}"
run scripts/stripe_lustre.sh "${IMAGE_DIR}"
# --network=host: needed on some clusters since 2026-07 for package downloads during the build.
run podman build --network=host -t "${IMAGE}" .
# Import to a temporary name, then rename: a failed import never leaves a half-written image
# where the EDF looks for it.
run rm -f "${SQSH}.partial"
run enroot import -x mount -o "${SQSH}.partial" "podman://${IMAGE}"
run mv -f "${SQSH}.partial" "${SQSH}"
echo "image ready: ${SQSH}"
