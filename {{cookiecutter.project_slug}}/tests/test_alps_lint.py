"""Tests of tools/alps_lint.py: each rule fires on a fixture that breaks it, with the exact report
line, stays quiet on the clean fixtures, and is silenced by its comment.

Standard library and pytest only (no torch): run with `python -m pytest tests/test_alps_lint.py`.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("alps_lint", REPO / "tools" / "alps_lint.py")
alps_lint = importlib.util.module_from_spec(_spec)
sys.modules["alps_lint"] = alps_lint  # dataclasses look their module up while being created
_spec.loader.exec_module(alps_lint)


def dedent(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


# --- clean fixtures: a repository layout like the generated one ---------------------------------

NGC_DOCKERFILE = "FROM nvcr.io/nvidia/pytorch:25.06-py3\nRUN pip install --no-cache-dir numpy\n"
EXTENDED_DOCKERFILE = dedent(
    """
    ARG BASE=ghcr.io/eth-cscs/alps-extended-images/ngc-pytorch:26.02-py3-alps6
    FROM ${BASE}
    """
)
NGC_EDF = dedent(
    """
    # base: ngc
    image = "${SCRATCH}/ce-images/app+25.06.sqsh"
    mounts = [
        "${PWD}",
        "./data:/data:ro",
        "${SCRATCH:-/tmp}/cache:/cache",
        "/users/${USER}/code",
        "${SCRATCH}/venv.sqsh:/venv:sqsh",
    ]
    workdir = "${PWD}"
    writable = true

    [env]
    OPTIONAL = "${MAYBE_UNSET:-}"
    LITERAL = "$${NOT_EXPANDED}"
    TRITON_HOME = "/tmp/triton"

    [annotations]
    com.hooks.aws_ofi_nccl.enabled = "true"
    com.hooks.aws_ofi_nccl.variant = "cuda-dl"
    """
)
EXTENDED_EDF = dedent(
    """
    image = "${SCRATCH}/ce-images/app+26.02-py3-alps6.sqsh"
    mounts = ["${PWD}"]
    workdir = "${PWD}"
    entrypoint = true

    [env]
    PMIX_MCA_psec = "native"

    [annotations.com.hooks.cxi]
    enabled = "false"
    """
)
CONTAINER_JOB = dedent(
    """
    #!/bin/bash
    #SBATCH --job-name=train
    #SBATCH --account=a-g34
    #SBATCH --output=logs/slurm-%x-%j.log   # the directory is in the repository
    #SBATCH --error=/capstor/scratch/cscs/%u/err-%j.log
    #SBATCH --signal=USR2@180 --requeue --open-mode=append

    set -euo pipefail
    export TRITON_HOME=/tmp/triton
    export NCCL_DEBUG=WARN
    srun_args=(--unbuffered --label)
    srun_args+=(--environment="${PWD}/container/edf.toml")
    srun "${srun_args[@]}" bash -c 'exec python -m app "$@"' bash \\
        --config configs/default.toml
    srun "${srun_args[@]}" --ntasks=1 \\
        python -c 'print("done")'
    """
)
UENV_SNIPPET = dedent(
    """
    export NCCL_NET="AWS Libfabric"
    export NCCL_NET_GDR_LEVEL=PHB
    export NCCL_CROSS_NIC=1
    export NCCL_PROTO=^LL128
    export FI_CXI_DEFAULT_CQ_SIZE=131072
    export FI_CXI_DEFAULT_TX_SIZE=16384
    export FI_CXI_DISABLE_HOST_REGISTER=1
    export FI_CXI_RX_MATCH_MODE=software
    export FI_MR_CACHE_MONITOR=userfaultfd
    """
)
UENV_JOB = (
    dedent(
        """
        #!/bin/bash
        #SBATCH -A a-g34
        #SBATCH -o logs/slurm-%j.log
        #SBATCH --uenv=pytorch/v2.9.1:v1
        #SBATCH --view=default

        export TRITON_HOME="/dev/shm/${USER}/triton"
        """
    )
    + UENV_SNIPPET
    + "srun python -m app\n"
)
# an Alps Extended Image's steps start its network stack through PMIx
EXTENDED_JOB = CONTAINER_JOB.replace(
    'srun_args+=(--environment="${PWD}/container/edf.toml")',
    'srun_args+=(--environment="${PWD}/container/edf.toml" --mpi=pmix --network=disable_rdzv_get)',
)
EXTENDED_REPO = {
    "Dockerfile": EXTENDED_DOCKERFILE,
    "container/edf.toml": EXTENDED_EDF,
    "jobs/train_container.sbatch": EXTENDED_JOB,
}
LAYOUT = "-E 4M -c 1 -E 64M -c 4 -E -1 -c 32 -S 4M"  # CSCS storage guide, 2025-11
STRIPE_SCRIPT = dedent(
    """
    #!/bin/bash
    # Older guides used "lfs setstripe -E -1 -c -1": stale, and this comment is not code.
    LAYOUT=(LAYOUT_HERE)
    lfs setstripe "${LAYOUT[@]}" "$1"
    """
).replace("LAYOUT_HERE", LAYOUT)
CLEAN_REPO = {
    "Dockerfile": NGC_DOCKERFILE,
    "container/edf.toml": NGC_EDF,
    "jobs/train_container.sbatch": CONTAINER_JOB,
    "jobs/train_uenv.sbatch": UENV_JOB,
    "scripts/stripe_lustre.sh": STRIPE_SCRIPT,
    "logs/.gitkeep": "",
    # TOML files that are not EDFs are left alone
    "pyproject.toml": '[project]\nname = "app"\n[tool.ruff]\nline-length = 100\n',
    "configs/default.toml": "lr = 0.001\nimage_size = 32\n",
}


@pytest.fixture
def lint(tmp_path, monkeypatch, capsys):
    """lint(files, *paths) -> (exit status, report lines): writes the clean repository with
    `files` on top (None: no such file), then lints `paths` (none: scan the repository)."""

    def run(files: dict[str, str | None], *paths: str) -> tuple[int, list[str]]:
        for name, text in {**CLEAN_REPO, **files}.items():
            path = tmp_path / name
            if text is None:
                path.unlink(missing_ok=True)
                continue
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        monkeypatch.chdir(tmp_path)
        status = alps_lint.main([*paths, "--root", str(tmp_path)])
        return status, capsys.readouterr().out.splitlines()

    return run


def test_clean_repository_passes(lint):
    assert lint({}) == (0, [])


def test_clean_alps_extended_repository_passes(lint):
    assert lint(EXTENDED_REPO) == (0, [])


def test_alps_extended_srun_options_may_come_from_the_environment(lint):
    """SLURM_MPI_TYPE / SLURM_NETWORK stand for the options; an NGC image needs neither."""
    job = EXTENDED_JOB.replace(" --mpi=pmix --network=disable_rdzv_get", "").replace(
        "set -euo pipefail\n",
        "set -euo pipefail\nexport SLURM_MPI_TYPE=pmix SLURM_NETWORK=disable_rdzv_get\n",
    )
    assert lint({**EXTENDED_REPO, "jobs/train_container.sbatch": job}) == (0, [])
    bare = EXTENDED_JOB.replace(" --mpi=pmix --network=disable_rdzv_get", "")
    status, report = lint({**EXTENDED_REPO, "jobs/train_container.sbatch": bare})
    assert status == 1 and len(report) == 2  # both sruns of the job
    assert lint({"jobs/train_container.sbatch": bare}) == (0, [])  # NGC: the hook's job


def test_this_repository_passes():
    """The job scripts, EDF and scripts this repository ships pass their own linter."""
    assert alps_lint.main(["--root", str(REPO)]) == 0


# --- one fixture per rule: (rule, files on top of the clean repo, file to lint, exact report) ---

CASES = [
    (
        "EDF-TOML",
        {"container/edf.toml": '[annotations]\ncom.hooks.x = "1"\n[annotations.com.hooks]\n'},
        "container/edf.toml",
        [
            "container/edf.toml:1: EDF-TOML: not valid TOML: "
            "Cannot declare ('annotations', 'com', 'hooks') twice (at line 3, column 23)"
        ],
    ),
    (
        "EDF-KEY",
        {"container/edf.toml": NGC_EDF.replace("writable = true", "writeable = true")},
        "container/edf.toml",
        [
            "container/edf.toml:11: EDF-KEY: unknown top-level key 'writeable' "
            "(did you mean 'writable'?)"
        ],
    ),
    (
        "EDF-TYPE",
        {"container/edf.toml": NGC_EDF.replace("writable = true", 'writable = "true"')},
        "container/edf.toml",
        ["container/edf.toml:11: EDF-TYPE: 'writable' must be a boolean, not a string"],
    ),
    (
        "EDF-VAR",
        {"container/edf.toml": NGC_EDF.replace('"${PWD}",', '"$PWD",')},
        "container/edf.toml",
        ["container/edf.toml:4: EDF-VAR: '$PWD' in mounts without braces: write '${PWD}'"],
    ),
    (
        "EDF-HOME",
        {"container/edf.toml": NGC_EDF.replace('"/users/${USER}/code"', '"/users/${USER}"')},
        "container/edf.toml",
        ["container/edf.toml:7: EDF-HOME: mounts the whole home directory ('/users/${USER}')"],
    ),
    (
        "EDF-RELPATH",
        {"container/edf.toml": NGC_EDF.replace('"./data:/data:ro"', '"data:/data:ro"')},
        "container/edf.toml",
        ["container/edf.toml:5: EDF-RELPATH: relative mount source 'data' must start with './'"],
    ),
    (
        "EDF-BASE",
        {**EXTENDED_REPO, "container/edf.toml": "# base: ngc\n" + EXTENDED_EDF},
        "container/edf.toml",
        [
            "container/edf.toml:1: EDF-BASE: 'base: ngc' contradicts Dockerfile: "
            "FROM ghcr.io/eth-cscs/alps-extended-images/ngc-pytorch:26.02-py3-alps6 "
            "(alps-extended)"
        ],
    ),
    (
        "EDF-EXT-OFI",
        {
            **EXTENDED_REPO,
            "container/edf.toml": EXTENDED_EDF + "[annotations.com.hooks.aws_ofi_nccl]\n"
            'enabled = "true"\n',
        },
        "container/edf.toml",
        [
            "container/edf.toml:12: EDF-EXT-OFI: com.hooks.aws_ofi_nccl.enabled with an Alps "
            "Extended Image (Dockerfile: FROM "
            "ghcr.io/eth-cscs/alps-extended-images/ngc-pytorch:26.02-py3-alps6): remove it"
        ],
    ),
    (
        "EDF-EXT-CXI",
        {
            "jobs/train_container.sbatch": EXTENDED_JOB,
            "container/edf.toml": EXTENDED_EDF.replace(
                "${SCRATCH}/ce-images/app+26.02-py3-alps6.sqsh",
                "jfrog.svc.cscs.ch/docker-group-csstaff/alps-images/ngc-pytorch:26.02-py3-alps6",
            ).replace('enabled = "false"', 'enabled = "true"'),
        },
        "container/edf.toml",
        [
            "container/edf.toml:10: EDF-EXT-CXI: an Alps Extended Image (image "
            "jfrog.svc.cscs.ch/docker-group-csstaff/alps-images/ngc-pytorch:26.02-py3-alps6) "
            'needs com.hooks.cxi.enabled = "false"'
        ],
    ),
    (
        "EDF-EXT-ENTRYPOINT",
        {
            **EXTENDED_REPO,
            "container/edf.toml": EXTENDED_EDF.replace("entrypoint = true\n", ""),
        },
        "container/edf.toml",
        [
            "container/edf.toml:1: EDF-EXT-ENTRYPOINT: an Alps Extended Image (Dockerfile: FROM "
            "ghcr.io/eth-cscs/alps-extended-images/ngc-pytorch:26.02-py3-alps6) "
            "needs entrypoint = true"
        ],
    ),
    (
        "EDF-OFI",
        {"container/edf.toml": NGC_EDF.replace('aws_ofi_nccl.enabled = "true"', "x = 'y'")},
        "container/edf.toml",
        [
            'container/edf.toml:2: EDF-OFI: com.hooks.aws_ofi_nccl.enabled = "true" is missing '
            "for an NGC image (Dockerfile: FROM nvcr.io/nvidia/pytorch:25.06-py3)"
        ],
    ),
    (
        "SB-ENV-DIRECTIVE",
        {
            "jobs/train_container.sbatch": CONTAINER_JOB.replace(
                "#SBATCH --job-name=train", "#SBATCH --environment=./container/edf.toml"
            )
        },
        "jobs/train_container.sbatch",
        [
            "jobs/train_container.sbatch:2: SB-ENV-DIRECTIVE: #SBATCH --environment: "
            "put it on each srun instead"
        ],
    ),
    (
        "SB-SRUN-ENV",
        {"jobs/train_container.sbatch": CONTAINER_JOB + "srun --ntasks-per-node=1 nvidia-smi\n"},
        "jobs/train_container.sbatch",
        [
            "jobs/train_container.sbatch:17: SB-SRUN-ENV: srun without --environment in a "
            "container job: this step runs on the host"
        ],
    ),
    (
        "SB-UENV-NCCL",
        {
            "jobs/train_uenv.sbatch": UENV_JOB.replace("export NCCL_PROTO=^LL128\n", "").replace(
                "export FI_MR_CACHE_MONITOR=userfaultfd\n", ""
            )
        },
        "jobs/train_uenv.sbatch",
        [
            "jobs/train_uenv.sbatch:4: SB-UENV-NCCL: uenv job without the CSCS NCCL/libfabric "
            "variables: NCCL_PROTO, FI_MR_CACHE_MONITOR"
        ],
    ),
    (
        "SB-UENV-PLUGIN",
        {"jobs/train_uenv.sbatch": UENV_JOB + 'export NCCL_NET_PLUGIN="ofi"\n'},
        "jobs/train_uenv.sbatch",
        ["jobs/train_uenv.sbatch:18: SB-UENV-PLUGIN: NCCL_NET_PLUGIN in a uenv job: remove it"],
    ),
    (
        "SB-CE-NCCL",
        {
            "jobs/train_container.sbatch": CONTAINER_JOB.replace(
                "export NCCL_DEBUG=WARN",
                'export NCCL_NET="AWS Libfabric" FI_CXI_DISABLE_HOST_REGISTER=1',
            )
        },
        "jobs/train_container.sbatch",
        [
            "jobs/train_container.sbatch:10: SB-CE-NCCL: container job sets NCCL_NET, "
            "FI_CXI_DISABLE_HOST_REGISTER: the CE hook sets these, drop the export"
        ],
    ),
    (
        "SB-CE-TRITON",
        {
            "jobs/train_container.sbatch": CONTAINER_JOB.replace(
                "TRITON_HOME=/tmp/triton", 'TRITON_HOME="/dev/shm/${USER}/triton"'
            )
        },
        "jobs/train_container.sbatch",
        [
            "jobs/train_container.sbatch:9: SB-CE-TRITON: TRITON_HOME on /dev/shm in a "
            "container job: use a path in the container"
        ],
    ),
    (
        "SB-LOGDIR",
        {"jobs/train_uenv.sbatch": UENV_JOB.replace("-o logs/", "-o slurm-logs/")},
        "jobs/train_uenv.sbatch",
        [
            "jobs/train_uenv.sbatch:3: SB-LOGDIR: --output directory 'slurm-logs/' does not "
            "exist in the repository"
        ],
    ),
    (
        "SB-ACCOUNT",
        {"jobs/train_uenv.sbatch": UENV_JOB.replace("#SBATCH -A a-g34\n", "")},
        "jobs/train_uenv.sbatch",
        [
            "jobs/train_uenv.sbatch:1: SB-ACCOUNT: no #SBATCH --account: the job is charged to "
            "your default project"
        ],
    ),
    (
        "EDF-ROOT",
        {"container/edf.toml": NGC_EDF.replace('"/users/${USER}/code"', '"/users/${USER}/..//.."')},
        "container/edf.toml",
        [
            "container/edf.toml:7: EDF-ROOT: mounts the host's whole file system "
            "('/users/${USER}/..//..')"
        ],
    ),
    (
        "SB-LATE-DIRECTIVE",
        {
            "jobs/train_uenv.sbatch": UENV_JOB.replace(
                "#SBATCH -A a-g34\n", "#SBATCH -A a-g34\nmodule load cray\n"
            )
        },
        "jobs/train_uenv.sbatch",
        [
            f"jobs/train_uenv.sbatch:{n}: SB-LATE-DIRECTIVE: #SBATCH after the first command "
            "(line 3): sbatch ignores it"
            for n in (4, 5, 6)
        ],
    ),
    (
        "SB-EXT-PMIX",
        {
            **EXTENDED_REPO,
            "scripts/setup_venv.sh": "#!/bin/bash\nexec srun --ntasks=1 --mpi=pmix \\\n"
            '    --environment="${PWD}/container/edf.toml" bash scripts/setup_venv.sh --here\n',
        },
        "scripts/setup_venv.sh",
        [
            "scripts/setup_venv.sh:2: SB-EXT-PMIX: srun into an Alps Extended Image (Dockerfile: "
            "FROM ghcr.io/eth-cscs/alps-extended-images/ngc-pytorch:26.02-py3-alps6) without "
            "--network=disable_rdzv_get"
        ],
    ),
    (
        "LUSTRE-STRIPE",
        {"scripts/stripe_lustre.sh": STRIPE_SCRIPT + 'lfs setstripe -E 4M -E -1 -c -1 "$2"\n'},
        "scripts/stripe_lustre.sh",
        [
            "scripts/stripe_lustre.sh:5: LUSTRE-STRIPE: '-c -1' stripes over all OSTs: use "
            f"'lfs setstripe {LAYOUT}' (scripts/stripe_lustre.sh)"
        ],
    ),
]


def test_the_layout_is_read_from_the_stripe_script(lint):
    """One source: the advice follows an edit of stripe_lustre.sh's LAYOUT line; without the
    script the advice names it instead of a layout of its own."""
    assert alps_lint.lustre_layout(REPO).startswith("-")  # this repository's script has one
    edited = STRIPE_SCRIPT.replace(LAYOUT, "-E 8M -c 1 -E -1 -c 16") + "lfs setstripe -c -1 x\n"
    status, report = lint({"scripts/stripe_lustre.sh": edited})
    advice = "use 'lfs setstripe -E 8M -c 1 -E -1 -c 16' (scripts/stripe_lustre.sh)"
    assert report[0].endswith(advice)
    files = {"scripts/stripe_lustre.sh": None, "jobs/s.sh": "lfs setstripe -c -1 x\n"}
    assert lint(files)[1] == [
        "jobs/s.sh:1: LUSTRE-STRIPE: '-c -1' stripes over all OSTs: use scripts/stripe_lustre.sh"
    ]


def test_every_rule_has_a_case():
    assert sorted(case[0] for case in CASES) == sorted(alps_lint.RULES)


@pytest.mark.parametrize(("rule", "files", "target", "expected"), CASES, ids=[c[0] for c in CASES])
def test_rule_reports(lint, rule, files, target, expected):
    assert lint(files, target) == (1, expected)
    # the scan without arguments finds the same problems
    assert lint(files) == (1, expected)


@pytest.mark.parametrize(("rule", "files", "target", "expected"), CASES, ids=[c[0] for c in CASES])
def test_rule_silenced_by_comment(lint, rule, files, target, expected):
    """`# alps-lint: disable=ID` on the reported line (file-level rules: any line) silences it."""
    lines = {**CLEAN_REPO, **files}[target].splitlines()
    reported = {int(line.split(":")[1]) for line in expected}
    # the comment goes on the reported line, or for file-level rules on the last line
    for number in {len(lines)} if alps_lint.RULES[rule].file_level else reported:
        lines[number - 1] += f"  # alps-lint: disable=OTHER-ID,{rule}"
    assert lint({**files, target: "\n".join(lines) + "\n"}, target) == (0, [])


# --- details ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "source",
    [
        "$HOME",
        "${HOME}",
        "/users",
        "/users/${USER}/",
        "~",
        "~/",
        "${HOME}/.",
        "$HOME/./",
        "/users/${USER}/..",
        "//users",
        "/users/someone",
        "/users/${USER}/code/..",
    ],
)
def test_whole_home_mounts(lint, source):
    edf = NGC_EDF.replace('"/users/${USER}/code"', f'"{source}:/home"')
    status, report = lint({"container/edf.toml": edf}, "container/edf.toml")
    assert f"container/edf.toml:7: EDF-HOME: mounts the whole home directory ('{source}')" in report


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("workdir", "src", "relative workdir 'src' must start with './'"),
        ("image", "images/app.sqsh", "relative image 'images/app.sqsh' must start with './'"),
    ],
)
def test_relative_paths(lint, key, value, message):
    edf = "\n".join(
        f'{key} = "{value}"' if line.startswith(f"{key} =") else line
        for line in NGC_EDF.splitlines()
    )
    status, report = lint({"container/edf.toml": edf + "\n"}, "container/edf.toml")
    number = 2 if key == "image" else 10
    assert f"container/edf.toml:{number}: EDF-RELPATH: {message}" in report


@pytest.mark.parametrize(
    ("image", "base"),
    [
        ("nvcr.io#nvidia/pytorch:25.06-py3", "ngc"),
        ("nvcr.io/nvidia/pytorch:25.11-py3", "ngc"),
        ("ghcr.io/eth-cscs/alps-extended-images/ngc-pytorch:26.02-py3-alps6", "alps-extended"),
        ("jfrog.svc.cscs.ch/csstaff/alps-images/ngc-pytorch:26.02-py3", "alps-extended"),
        ("registry.example.org/me/my-pytorch:26.02-py3-alps6", "alps-extended"),
        ("localhost:5000/alps:latest", "other"),
        ("ubuntu:24.04", "other"),
    ],
)
def test_classify_image(image, base):
    assert alps_lint.classify_image(image) == base


def test_remote_ngc_image_needs_no_dockerfile(lint):
    edf = NGC_EDF.replace("${SCRATCH}/ce-images/app+25.06.sqsh", "nvcr.io#nvidia/pytorch:25.06-py3")
    assert lint({"container/edf.toml": edf, "Dockerfile": None}, "container/edf.toml") == (0, [])


def test_marker_decides_without_dockerfile(lint):
    """Without a Dockerfile the '# base:' marker says which image the local .sqsh holds."""
    files = {"Dockerfile": None, "container/edf.toml": "# base: alps-extended\n" + EXTENDED_EDF}
    assert lint(files, "container/edf.toml") == (0, [])
    files = {"Dockerfile": None, "container/edf.toml": EXTENDED_EDF}
    status, report = lint(files, "container/edf.toml")
    assert report == [
        'container/edf.toml:1: EDF-OFI: com.hooks.aws_ofi_nccl.enabled = "true" is missing '
        "for a non-Extended image (base image unknown)"
    ]


def test_annotations_may_come_from_a_base_environment(lint):
    """Keys missing from an EDF with base_environment may be inherited: not reported; wrong
    values still are."""
    edf = 'base_environment = "alps-base"\nimage = "nvcr.io#nvidia/pytorch:25.06-py3"\n'
    assert lint({"container/edf.toml": edf}, "container/edf.toml") == (0, [])
    edf += '[annotations]\ncom.hooks.aws_ofi_nccl.enabled = "false"\n'
    assert lint({"container/edf.toml": edf}, "container/edf.toml") == (
        1,
        [
            'container/edf.toml:4: EDF-OFI: com.hooks.aws_ofi_nccl.enabled = "true" is missing '
            "for an NGC image (image nvcr.io#nvidia/pytorch:25.06-py3)"
        ],
    )


def test_uenv_snippet_from_a_sourced_file(lint):
    job = UENV_JOB.replace(UENV_SNIPPET, 'source "${SLURM_SUBMIT_DIR}/scripts/nccl_env.sh"\n')
    files = {"jobs/train_uenv.sbatch": job, "scripts/nccl_env.sh": "#!/bin/bash\n" + UENV_SNIPPET}
    assert lint(files, "jobs/train_uenv.sbatch") == (0, [])


def test_steps_of_a_sourced_file_count_for_the_job(lint):
    """A job script that sources a shared file (jobs/common.sh) is checked with that file's
    sruns, which see the job's srun_args; a problem is reported on the `source` line."""
    job = dedent(
        """
        #!/bin/bash
        #SBATCH --account=a-g34
        srun_args=(--label --environment="${PWD}/container/edf.toml")
        source jobs/common.sh
        """
    )
    common = 'srun "${srun_args[@]}" python -m app\n'
    files = {"jobs/train_container.sbatch": job, "jobs/common.sh": common}
    assert lint(files, "jobs/train_container.sbatch") == (0, [])
    files["jobs/common.sh"] = common + "srun hostname\n"
    assert lint(files, "jobs/train_container.sbatch") == (
        1,
        [
            "jobs/train_container.sbatch:4: SB-SRUN-ENV: srun without --environment in a "
            "container job: this step runs on the host"
        ],
    )
    extended = {**EXTENDED_REPO, **files, "jobs/common.sh": common}
    status, report = lint(extended, "jobs/train_container.sbatch")
    assert report == [
        "jobs/train_container.sbatch:4: SB-EXT-PMIX: srun into an Alps Extended Image "
        "(Dockerfile: FROM ghcr.io/eth-cscs/alps-extended-images/ngc-pytorch:26.02-py3-alps6) "
        "without --mpi=pmix --network=disable_rdzv_get"
    ]


def test_sh_file_with_sbatch_lines_is_a_job(lint):
    job = CONTAINER_JOB.replace("#SBATCH --account=a-g34\n", "")
    assert lint({"jobs/train.sh": job}, "jobs/train.sh") == (
        1,
        [
            "jobs/train.sh:1: SB-ACCOUNT: no #SBATCH --account: the job is charged to your default "
            "project"
        ],
    )


def test_sbatch_lines_after_the_first_command_are_ignored(lint):
    """sbatch stops reading #SBATCH options at the first command: the linter reports such a
    line as ignored, and does not read it as an option (no SB-ENV-DIRECTIVE)."""
    job = CONTAINER_JOB + "#SBATCH --environment=./container/edf.toml\n"
    assert lint({"jobs/train_container.sbatch": job}, "jobs/train_container.sbatch") == (
        1,
        [
            "jobs/train_container.sbatch:17: SB-LATE-DIRECTIVE: #SBATCH after the first command "
            "(line 8): sbatch ignores it"
        ],
    )


@pytest.mark.parametrize(
    ("mount", "message"),
    [
        ("/:/host", "mounts the host's whole file system ('/')"),
        ("//:/host:ro", "mounts the host's whole file system ('//')"),
        ("${SCRATCH}/usr:/usr", "mounts over the image's /usr"),
        ("/opt", "mounts over the image's /opt"),
        ("${SCRATCH}/x:/etc/../", "mounts over the image's /"),
    ],
)
def test_root_and_system_mounts(lint, mount, message):
    edf = NGC_EDF.replace('"/users/${USER}/code"', f'"{mount}"')
    status, report = lint({"container/edf.toml": edf}, "container/edf.toml")
    assert report == [f"container/edf.toml:7: EDF-ROOT: {message}"]


def test_shared_roots_with_a_user_part_are_fine(lint):
    """CSCS's own examples mount /capstor and /iopsstor: not reported."""
    edf = NGC_EDF.replace('"/users/${USER}/code"', '"/capstor", "/iopsstor", "${HOME}/code"')
    assert lint({"container/edf.toml": edf}, "container/edf.toml") == (0, [])


@pytest.mark.parametrize(
    ("output", "message"),
    [
        (
            "$SCRATCH/logs/%j.log",
            "--output directory '$SCRATCH/logs': #SBATCH lines expand no variables",
        ),
        ("logs/%x/%j.log", "--output directory 'logs/%x' has a %-pattern: Slurm cannot create it"),
    ],
)
def test_log_directory_patterns(lint, output, message):
    job = UENV_JOB.replace("-o logs/slurm-%j.log", f"--output={output}")
    status, report = lint({"jobs/train_uenv.sbatch": job}, "jobs/train_uenv.sbatch")
    assert report == [f"jobs/train_uenv.sbatch:3: SB-LOGDIR: {message}"]


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_log_directory_must_be_tracked_in_git(lint, tmp_path):
    lint({})
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    status, report = lint({}, "jobs/train_uenv.sbatch")
    assert report == [
        "jobs/train_uenv.sbatch:3: SB-LOGDIR: --output directory 'logs/' has no file in git: "
        "add .gitkeep"
    ]
    subprocess.run(["git", "-C", str(tmp_path), "add", "logs/.gitkeep"], check=True)
    assert lint({}, "jobs/train_uenv.sbatch") == (0, [])


def test_srun_only_in_command_position(lint):
    job = CONTAINER_JOB + dedent(
        """
        echo "submit with sbatch, not srun: srun runs one step"
        if srun --ntasks=1 true; then timeout 60 srun hostname; fi
        """
    )
    status, report = lint({"jobs/train_container.sbatch": job}, "jobs/train_container.sbatch")
    assert report == [
        "jobs/train_container.sbatch:18: SB-SRUN-ENV: srun without --environment in a container "
        "job: this step runs on the host"
    ]


def test_silencing_a_continued_command_on_its_last_line(lint):
    job = CONTAINER_JOB + "srun --ntasks=1 \\\n    nvidia-smi  # alps-lint: disable=SB-SRUN-ENV\n"
    assert lint({"jobs/train_container.sbatch": job}, "jobs/train_container.sbatch") == (0, [])


def test_rule_table_in_docs_is_the_registry():
    """docs/pre-commit.md's rule table is `alps_lint.py --list-rules --markdown`, row for row."""
    docs = (REPO / "docs" / "pre-commit.md").read_text()
    rules = docs.split("### Rules\n\n", 1)[1].split("\n\n", 1)[0].rstrip("\n")
    table = rules + "\n"
    proc = subprocess.run(
        [sys.executable, str(REPO / "tools" / "alps_lint.py"), "--list-rules", "--markdown"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert table == proc.stdout, "regenerate: python tools/alps_lint.py --list-rules --markdown"


def test_rules_are_registered_once_with_their_check():
    assert len(alps_lint.RULES) == len({r.check for r in alps_lint.RULES.values()})
    assert all(r.subject in {"edf-text", "edf", "shell", "job"} for r in alps_lint.RULES.values())
    source = (REPO / "tools" / "alps_lint.py").read_text()
    for rule_id in alps_lint.RULES:  # each id is written once: where it is registered
        assert source.count(f'"{rule_id}"') == 1, rule_id


def test_explain(capsys):
    assert alps_lint.main(["--explain", "EDF-HOME"]) == 0
    assert capsys.readouterr().out.startswith("EDF-HOME: Mounting all of `$HOME` or `/users`")
    assert alps_lint.main(["--explain"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == len(alps_lint.RULES)
    assert alps_lint.main(["--explain", "NO-SUCH-RULE"]) == 2


def test_command_line(tmp_path):
    """Runs as a script (what the pre-commit hook does) and exits 1 with the report."""
    job = tmp_path / "job.sbatch"
    job.write_text("#!/bin/bash\n#SBATCH --environment=x\n")
    proc = subprocess.run(
        [sys.executable, str(REPO / "tools" / "alps_lint.py"), "job.sbatch", "--root", "."],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 1
    assert proc.stdout.splitlines() == [
        "job.sbatch:1: SB-ACCOUNT: no #SBATCH --account: the job is charged to your default "
        "project",
        "job.sbatch:2: SB-ENV-DIRECTIVE: #SBATCH --environment: put it on each srun instead",
    ]
