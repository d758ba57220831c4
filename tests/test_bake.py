"""Every named configuration bakes into exactly the files it should, all of them valid."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

from conftest import CONFIGS, TEMPLATE_DIR, run

CONTAINER_FILES = {
    "Dockerfile",
    ".dockerignore",
    "container/edf.toml",
    "scripts/build_image.sh",
    "jobs/train_container.sbatch",
}
UENV_FILES = {"jobs/train_uenv.sbatch"}


def answers(name: str) -> dict:
    """The effective answers of a named configuration (defaults + overrides)."""
    import json

    defaults = json.loads((TEMPLATE_DIR / "cookiecutter.json").read_text())
    merged = {k: (v[0] if isinstance(v, list) else v) for k, v in defaults.items()}
    merged.update(CONFIGS[name])
    return merged


def generated_files(root: Path) -> set[str]:
    return {
        p.relative_to(root).as_posix()
        for p in root.rglob("*")
        if p.is_file() and ".git" not in p.relative_to(root).parts and "__pycache__" not in p.parts
    }


def expected_files(name: str, package: str) -> set[str]:
    """Files of the template directory, names rendered, minus the unchosen flavour's."""
    src = TEMPLATE_DIR / "{{cookiecutter.project_slug}}"
    files = {
        p.relative_to(src).as_posix().replace("{{cookiecutter.package_name}}", package)
        for p in src.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }
    flavour = answers(name)["env_flavour"]
    if flavour == "uenv":
        files -= CONTAINER_FILES
    if flavour == "container":
        files -= UENV_FILES
    return files


def test_exact_file_set(baked):
    name, path = baked
    package = path.name.replace("-", "_")
    flavour = answers(name)["env_flavour"]
    files = generated_files(path)
    assert files == expected_files(name, package)
    # the flavour files are decided here, whatever the template directory holds
    assert (CONTAINER_FILES <= files) == (flavour in ("container", "both"))
    assert (UENV_FILES <= files) == (flavour in ("uenv", "both"))
    for always in (
        "README.md",
        "pyproject.toml",
        ".gitignore",
        "configs/default.toml",
        "scripts/setup_venv.sh",
        "scripts/stripe_lustre.sh",
        "logs/.gitkeep",
        f"src/{package}/__main__.py",
    ):
        assert always in files


# Openers are what an unrendered template leaves behind; closers alone ("%}", "}}") occur in
# ordinary Python such as f"{share:.0%}" and nested dict literals.
JINJA_MARKERS = re.compile(r"\{\{|\{%|\{#|cookiecutter\.")


def test_no_leftover_jinja(baked):
    name, path = baked
    for rel in sorted(generated_files(path)):
        text = (path / rel).read_text(errors="replace")
        found = JINJA_MARKERS.search(text)
        assert not found, f"{name}: {rel} contains {found.group()!r}"


def test_toml_files_parse(baked):
    _, path = baked
    tomls = [p for p in path.rglob("*.toml") if ".git" not in p.parts]
    assert tomls
    for toml in tomls:
        tomllib.loads(toml.read_text())


def shell_scripts(path: Path) -> list[Path]:
    return sorted(
        p for p in path.rglob("*") if p.suffix in {".sh", ".sbatch"} and ".git" not in p.parts
    )


def test_scripts_parse_and_pass_shellcheck(baked):
    _, path = baked
    scripts = shell_scripts(path)
    assert scripts
    for script in scripts:
        run(["bash", "-n", str(script)], cwd=path)
        assert script.read_text().startswith("#!/bin/bash\n"), script
    run(["shellcheck", "--shell=bash", "--severity=style", *map(str, scripts)], cwd=path)


def test_scripts_are_executable(baked):
    _, path = baked
    for script in (path / "scripts").glob("*.sh"):
        assert script.stat().st_mode & 0o111, script


def sbatch_directives(script: Path) -> dict[str, str]:
    directives = {}
    for line in script.read_text().splitlines():
        m = re.match(r"#SBATCH --([a-z-]+)(?:=(\S+))?", line)
        if m:
            directives[m.group(1)] = m.group(2) or ""
    return directives


def test_job_scripts_follow_answers(baked):
    name, path = baked
    a = answers(name)
    jobs = sorted((path / "jobs").glob("*.sbatch"))
    assert jobs
    for job in jobs:
        d = sbatch_directives(job)
        text = job.read_text()
        assert d["job-name"] == path.name
        assert d["partition"] == a["partition"]
        assert d["time"] == a["time_limit"]
        assert d["nodes"] == a["nodes"]
        assert ("account" in d) == bool(a["account"])
        if a["account"]:
            assert d["account"] == a["account"]
        assert d["output"] == "logs/slurm-%x-%j.log"
        assert (path / "logs").is_dir()
        assert d["signal"] == "USR2@180" and "requeue" in d and d["open-mode"] == "append"
        assert "environment" not in d  # never #SBATCH --environment
        assert "ulimit -c 0" in text
        assert 'scontrol requeue "${SLURM_JOB_ID}"' in text
        if a["launcher"] == "srun":
            assert (d["ntasks-per-node"], d["cpus-per-task"]) == ("4", "72")
            assert "torch.distributed.run" not in text
        else:
            assert (d["ntasks-per-node"], d["cpus-per-task"]) == ("1", "288")
            assert "python -m torch.distributed.run" in text
            assert 'PET_SIGNALS_TO_HANDLE="SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR2"' in text
        uenv = job.name == "train_uenv.sbatch"
        assert (d.get("uenv"), d.get("view")) == (
            (a["uenv_image"], "default") if uenv else (None, None)
        )
        # the uenv NCCL/libfabric snippet belongs to uenv jobs only (the CE hook sets its own)
        assert ('export NCCL_NET="AWS Libfabric"' in text) == uenv
        assert ('TRITON_HOME="/dev/shm' in text) == uenv
        assert ("--environment=" in text) == (not uenv)
        extended = a["container_base"] == "alps-extended"
        assert ("--mpi=pmix" in text) == (not uenv and extended)


def test_edf_matches_base_image(baked):
    name, path = baked
    a = answers(name)
    edf_path = path / "container/edf.toml"
    if a["env_flavour"] == "uenv":
        assert not edf_path.exists()
        return
    edf = tomllib.loads(edf_path.read_text())
    extended = a["container_base"] == "alps-extended"
    tag = a["alps_extended_tag"] if extended else a["ngc_pytorch_tag"]
    assert edf["image"] == f"{a['image_dir']}/{path.name}+{tag}.sqsh"
    assert edf["workdir"] == "${PWD}"
    assert "${PWD}" in edf["mounts"]
    assert not any(m.rstrip("/") in ("${HOME}", "/users", "$HOME") for m in edf["mounts"])
    assert edf["env"]["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"
    assert edf["env"]["MPICH_GPU_SUPPORT_ENABLED"] == "0"
    assert not any(k.startswith(("NCCL_NET", "FI_CXI")) for k in edf["env"])
    ann = edf["annotations"]
    if extended:
        assert edf["entrypoint"] is True
        assert ann["com"]["hooks"]["cxi"]["enabled"] == "false"
        assert "aws_ofi_nccl" not in ann["com"]["hooks"]
        assert edf["env"]["PMIX_MCA_psec"] == "native"
    else:
        assert edf.get("entrypoint", False) is False
        assert ann["com"]["hooks"]["aws_ofi_nccl"] == {
            "enabled": "true",
            "variant": "cuda-dl",
        }
    dockerfile = (path / "Dockerfile").read_text()
    expected_from = (
        f"FROM ghcr.io/eth-cscs/alps-extended-images/ngc-pytorch:{tag}"
        if extended
        else f"FROM nvcr.io/nvidia/pytorch:{tag}-py3"
    )
    assert expected_from in dockerfile.splitlines()
    assert "-c /tmp/torch-constraint.txt" in dockerfile


def test_pyproject_keeps_torch_loose(baked):
    _, path = baked
    project = tomllib.loads((path / "pyproject.toml").read_text())["project"]
    assert project["name"] == path.name
    assert project["requires-python"] == ">=3.10"
    torch_req = [d for d in project["dependencies"] if d.startswith("torch")]
    assert torch_req == ["torch>=2.4"]


def test_git_init(baked):
    name, path = baked
    if answers(name)["git_init"] == "yes":
        log = run(["git", "log", "--oneline"], cwd=path).stdout.splitlines()
        assert len(log) == 1
        assert run(["git", "status", "--porcelain"], cwd=path).stdout == ""
        assert run(["git", "branch", "--show-current"], cwd=path).stdout.strip() == "main"
    else:
        assert not (path / ".git").exists()


def test_build_image_dry_run_prints_the_pipeline(bake):
    path = bake("both-extended-srun")
    env_home = path.parent / "home-dry-run"
    proc = run(
        ["bash", "scripts/build_image.sh"],
        cwd=path,
        env={
            "PATH": "/usr/bin:/bin",
            "DRY_RUN": "1",
            "SCRATCH": "/scratch/u",
            "HOME": str(env_home),
            "USER": "u",
        },
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("+ ")]
    sqsh = "/scratch/u/ce-images/alps-torch-project+26.02-py3-alps6.sqsh"
    assert lines == [
        f"+ writing {env_home}/.config/containers/storage.conf",
        "+ mkdir -p /scratch/u/ce-images",
        "+ scripts/stripe_lustre.sh /scratch/u/ce-images",
        "+ podman build --network=host -t alps-torch-project:26.02-py3-alps6 .",
        f"+ rm -f {sqsh}.partial",
        f"+ enroot import -x mount -o {sqsh}.partial podman://alps-torch-project:26.02-py3-alps6",
        f"+ mv -f {sqsh}.partial {sqsh}",
    ]
    assert not env_home.exists()  # a dry run writes nothing


def test_striping_layout_is_current_and_consistent(bake, tmp_path):
    path = bake("default")
    script = (path / "scripts/stripe_lustre.sh").read_text()
    hook = (TEMPLATE_DIR / "hooks/post_gen_project.py").read_text()
    layout = "-E 4M -c 1 -E 64M -c 4 -E -1 -c 32 -S 4M"
    assert f"LAYOUT=({layout})" in script
    assert f'LUSTRE_LAYOUT = "{layout}"' in hook
    assert "-c -1" not in script.replace("-E -1 -c 32", "")
    # off Alps (no lfs) the script prints the exact commands and fails nothing
    proc = run(
        ["bash", "scripts/stripe_lustre.sh", str(tmp_path / "a b")],
        cwd=path,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert f"lfs setstripe {layout} '{tmp_path}/a b'" in proc.stderr


def test_striping_applied_with_lfs(bake, tmp_path):
    """With lfs on PATH the script creates each directory and calls lfs setstripe on it."""
    path = bake("default")
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    calls = tmp_path / "calls"
    (fake_bin / "lfs").write_text(f'#!/bin/bash\necho "$*" >> "{calls}"\n')
    (fake_bin / "lfs").chmod(0o755)
    target = tmp_path / "data"
    run(
        ["bash", "scripts/stripe_lustre.sh", str(target)],
        cwd=path,
        env={"PATH": f"{fake_bin}:/usr/bin:/bin"},
    )
    assert target.is_dir()
    assert calls.read_text().splitlines()[0] == (
        f"setstripe -E 4M -c 1 -E 64M -c 4 -E -1 -c 32 -S 4M {target}"
    )


def test_setup_venv_layers_on_the_environment(bake, tmp_path):
    """--here builds .venv-<flavour> on the current python: torch comes from outside the venv."""
    path = bake("uenv-torchrun")
    work = tmp_path / "repo"
    shutil.copytree(path, work)
    proc = run(["bash", "scripts/setup_venv.sh", "uenv", "--here"], cwd=work, timeout=600)
    venv = work / ".venv-uenv"
    assert "torch" in proc.stdout and str(venv) not in proc.stdout.split("from", 1)[1]
    constraint = (venv / "torch-constraint.txt").read_text().strip()
    assert constraint.startswith("torch==")
    out = subprocess.run(
        [
            str(venv / "bin/python"),
            "-c",
            "import torch, sys, alps_torch_project as p; print(torch.__file__); print(p.__file__)",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    assert not out[0].startswith(str(venv))  # torch not reinstalled into the venv
    assert out[1].startswith(str(work / "src"))  # the project is installed editable
    # a flavour that this repo does not have is refused
    bad = run(["bash", "scripts/setup_venv.sh", "container", "--here"], cwd=work, check=False)
    assert bad.returncode == 2 and "usage" in bad.stderr


def test_regenerating_over_a_repo_adds_no_commit(bake, tmp_path):
    """cookiecutter -f over an existing generated repo re-runs the hooks: no second git init
    or commit, and the regenerated files equal the committed ones."""
    original = bake("default")
    out = tmp_path / "out"
    shutil.copytree(original, out / original.name, symlinks=True)
    head = run(["git", "rev-parse", "HEAD"], cwd=out / original.name).stdout
    run(
        [
            sys.executable,
            "-m",
            "cookiecutter",
            "--no-input",
            "-f",
            "-o",
            str(out),
            str(TEMPLATE_DIR),
        ],
        cwd=tmp_path,
    )
    repo = out / original.name
    assert run(["git", "rev-parse", "HEAD"], cwd=repo).stdout == head
    assert run(["git", "rev-list", "--count", "HEAD"], cwd=repo).stdout.strip() == "1"
    assert run(["git", "status", "--porcelain"], cwd=repo).stdout == ""


REPO_PATH = re.compile(
    r"(?<![\w/.-])(?:jobs|scripts|container|docs|configs|tools)/[\w.-]+\.(?:sbatch|sh|toml|md|py)\b"
)
CONTAINER_NAMES = re.compile(r"`(Dockerfile|\.dockerignore)`")


def test_no_dangling_references(baked):
    """README, docs and scripts only mention repository files that were generated."""
    name, path = baked
    texts = [
        path / "README.md",
        *path.glob("docs/*.md"),
        *path.glob("scripts/*.sh"),
        *path.glob("jobs/*.sbatch"),
    ]
    for text_file in texts:
        text = text_file.read_text()
        refs = set(REPO_PATH.findall(text))
        if text_file.name == "README.md":  # the docs may speak of Dockerfiles in general
            refs |= set(CONTAINER_NAMES.findall(text))
        for ref in refs:
            assert (path / ref).exists(), f"{name}: {text_file.name} mentions missing {ref}"
