{%- set cc = cookiecutter -%}
{%- set tag = cc.alps_extended_tag if cc.container_base == "alps-extended" else cc.ngc_pytorch_tag -%}
#!/bin/bash
# Build the container image with podman and import it with enroot as the squashfs file that
# container/edf.toml points to. Both steps run in ONE allocation on a compute node: podman's
# storage lives in /dev/shm, which is wiped when the job ends, and GH200 nodes are aarch64.
#
# Usage (from the repository root, on a login node): scripts/build_image.sh
# DRY_RUN=1 scripts/build_image.sh prints the commands without running them.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

IMAGE_DIR="{{ cc.image_dir }}"
IMAGE="{{ cc.project_slug }}:{{ tag }}"
SQSH="${IMAGE_DIR}/{{ cc.project_slug }}+{{ tag }}.sqsh"

run() {
    echo "+ $*"
    [[ -n "${DRY_RUN:-}" ]] || "$@"
}

if [[ -z "${SLURM_JOB_ID:-}" && -z "${DRY_RUN:-}" ]]; then
    # On a login node: run this same script on a compute node.
    exec srun {% if cc.account %}--account={{ cc.account }} {% endif %}--partition={{ cc.partition }} --nodes=1 --ntasks=1 --time=01:00:00 "${PWD}/scripts/build_image.sh" "$@"
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
