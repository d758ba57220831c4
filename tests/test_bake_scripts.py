"""The generated scripts/ (and every shell script): they parse and pass shellcheck; the venv,
image-build, Lustre-striping and directory scripts do what the docs say, and refuse what would
break a job."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
from importlib import metadata
from pathlib import Path

from conftest import LUSTRE_LAYOUT, answers, clean_env, run
from fake_slurm import FAKE_SRUN, fake_env


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


def test_setup_venv_layers_on_the_environment(bake, tmp_path):
    """--here builds .venv-<flavour> on the current python: torch comes from outside the venv.
    Run as docs/your-program.md adds a program's packages (metatrain, ase; `uenv run` replaced
    by a recorder that runs the command): torch stays the environment's."""
    path = bake("uenv-torchrun")
    work = tmp_path / "repo"
    shutil.copytree(path, work)
    page = (work / "docs" / "your-program.md").read_text()
    (line,) = [line for line in page.splitlines() if line.startswith("scripts/setup_venv.sh")]
    assert line == "scripts/setup_venv.sh uenv -- metatrain==2026.4.1 ase==3.29.0"
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    (fake_bin / "uenv").write_text(  # uenv run IMAGE --view=default -- COMMAND...
        '#!/bin/bash\nprintf "%s\\n" "$@" > "${0}.args"\n'
        'while [[ $1 != -- ]]; do shift; done\nshift\nexec "$@"\n'
    )
    (fake_bin / "uenv").chmod(0o755)
    with_uenv = clean_env() | {"PATH": f"{fake_bin}:{clean_env()['PATH']}"}
    proc = run(["bash", "-c", line], cwd=work, env=with_uenv, timeout=600)
    uenv_args = (fake_bin / "uenv.args").read_text().splitlines()
    image = answers("uenv-torchrun")["__uenv_image"]
    assert uenv_args[:4] == ["run", image, "--view=default", "--"], uenv_args
    assert uenv_args[-3:] == ["--", "metatrain==2026.4.1", "ase==3.29.0"]
    venv = work / ".venv-uenv"
    imported = [str(venv / "bin/python"), "-c", "import metatrain, ase; print(metatrain.__file__)"]
    run(imported, cwd=work)
    failed = run(
        ["bash", "scripts/setup_venv.sh", "uenv", "--here", "--", "./nothing-here"],
        cwd=work,
        check=False,
    )
    assert failed.returncode == 2, failed.stdout + failed.stderr
    assert failed.stderr.splitlines()[-1].startswith(  # pip's own lines above it
        "error: pip could not install the project and ./nothing-here beside the environment's "
        "torch=="
    )
    assert "torch" in proc.stdout and str(venv) not in proc.stdout.split("from", 1)[1]
    constraint = (venv / "torch-constraint.txt").read_text().strip()
    assert constraint.startswith("torch==")
    if importlib.util.find_spec("torchvision"):  # the environment's torchvision is pinned too
        assert f"torchvision=={metadata.version('torchvision')}" in constraint.splitlines()
    # for every later pip install in the venv too (`pip install -e '.[timm]'`): its own pip.conf
    pip = [str(venv / "bin/python"), "-m", "pip"]
    pinned = run([*pip, "config", "get", "global.constraint"], cwd=work)
    assert pinned.stdout.strip() == (venv / "torch-constraint.txt").resolve().as_uri()
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
    # with its dev extras: the README's one local path runs the tests from this venv (here
    # pytest may come from the base interpreter too, hence the look at the install line)
    run([str(venv / "bin/python"), "-c", "import pytest, pre_commit"], cwd=work)
    assert "--editable '.[dev]'" in (work / "scripts/setup_venv.sh").read_text()
    # inside an active venv the new venv would see the base interpreter's torch: refused
    active = clean_env() | {"VIRTUAL_ENV": str(venv)}
    inside = run(
        ["bash", "scripts/setup_venv.sh", "uenv", "--here"], cwd=work, env=active, check=False
    )
    assert inside.returncode == 2 and inside.stderr.startswith("error: a venv is active")
    assert len(inside.stderr.splitlines()) == 1
    # the same venv's bin/ first on PATH, not activated: python3 is the venv's (this checked
    # the venv's torch, then made a venv that imports the base interpreter's, silently)
    first = clean_env() | {"PATH": f"{venv / 'bin'}:{clean_env()['PATH']}"}
    inside = run(
        ["bash", "scripts/setup_venv.sh", "uenv", "--here"], cwd=work, env=first, check=False
    )
    assert inside.returncode == 2, inside.stdout
    assert inside.stderr == (
        f"error: {venv / 'bin' / 'python3'} belongs to the venv {venv}: a venv made from it "
        "would see the base interpreter's torch, not that venv's. Put the environment's python3 "
        "first on PATH.\n"
    )
    # a flavour that this repo does not have is refused
    bad = run(["bash", "scripts/setup_venv.sh", "container", "--here"], cwd=work, check=False)
    assert bad.returncode == 2 and "usage" in bad.stderr
    # another distribution of the environment that installs a module of the package's name
    # (an image's package the template could not know of) is named, in one line
    site = next(venv.glob("lib/python*/site-packages"))
    record = site / "imposter-1.0.dist-info"
    record.mkdir()
    (record / "METADATA").write_text("Metadata-Version: 2.1\nName: imposter\nVersion: 1.0\n")
    (record / "RECORD").write_text("alps_torch_project/__init__.py,,\n")
    shadowed = run(["bash", "scripts/setup_venv.sh", "uenv", "--here"], cwd=work, check=False)
    assert shadowed.returncode == 2, shadowed.stdout + shadowed.stderr
    assert shadowed.stderr.splitlines() == [
        "error: the package name 'alps_torch_project' is also installed by imposter in this "
        "environment: rename the package (src/alps_torch_project, pyproject.toml) and run this "
        "again"
    ]


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


def test_build_image_refuses_an_image_name_that_does_not_match(bake, tmp_path):
    """A new FROM without a new image name in the EDF (a running job's image would be replaced
    and the old venvs broken), or an image path with an unset variable: exit 2, one line."""
    repo = tmp_path / "repo"
    shutil.copytree(bake("default"), repo)  # NGC 25.06
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "USER": "u", "DRY_RUN": "1"}
    dockerfile = repo / "Dockerfile"
    original = dockerfile.read_text()
    dockerfile.write_text(original.replace("pytorch:25.06-py3", "pytorch:25.11-py3"))
    proc = run(
        ["bash", "scripts/build_image.sh"], cwd=repo, env=env | {"SCRATCH": "/s"}, check=False
    )
    assert proc.returncode == 2 and proc.stdout == ""
    assert "builds FROM ...:25.11 but container/edf.toml's image is" in proc.stderr
    assert "name it <project>+25.11.sqsh there" in proc.stderr
    dockerfile.write_text(original)
    proc = run(["bash", "scripts/build_image.sh"], cwd=repo, env=env, check=False)  # no SCRATCH
    assert proc.returncode == 2 and proc.stdout == ""
    assert "container/edf.toml's image uses ${SCRATCH}, which is not set here" in proc.stderr


def test_helper_jobs_go_where_the_training_job_goes(bake, tmp_path):
    """build_image.sh and setup_venv.sh (from a login node) run their one-task srun with the
    account and partition of jobs/train_container.sbatch: edited there, they follow."""
    repo = tmp_path / "repo"
    shutil.copytree(bake("both-extended-srun"), repo)  # account a-g34, partition normal
    job = repo / "jobs" / "train_container.sbatch"
    job.write_text(job.read_text().replace("#SBATCH --partition=normal", "#SBATCH --partition=x1"))
    fake_bin, calls = tmp_path / "bin", tmp_path / "calls"
    fake_bin.mkdir()
    calls.mkdir()
    (fake_bin / "srun").write_text(FAKE_SRUN)
    (fake_bin / "srun").chmod(0o755)
    env = fake_env(tmp_path, fake_bin, calls)
    run(["bash", "scripts/build_image.sh"], cwd=repo, env=env)
    run(["bash", "scripts/setup_venv.sh", "container"], cwd=repo, env=env)
    build, setup = (
        (calls / n).read_text().split("\0")[:-1] for n in sorted(os.listdir(calls), key=int)
    )
    assert build[:6] == [
        "srun",
        "--account=a-g34",
        "--partition=x1",
        "--nodes=1",
        "--ntasks=1",
        "--time=01:00:00",
    ]
    assert build[6:] == [str(repo / "scripts/build_image.sh")]
    assert setup[:6] == [
        "srun",
        "--account=a-g34",
        "--partition=x1",
        "--nodes=1",
        "--ntasks=1",
        "--time=00:30:00",
    ]
    # an Alps Extended Image starts its network stack through PMIx, in helper steps too
    assert setup[6:10] == [
        f"--environment={repo}/container/edf.toml",
        "--mpi=pmix",
        "--network=disable_rdzv_get",
        "bash",
    ]


def test_striping_layout_is_current_and_consistent(bake, tmp_path, post_gen_hook):
    path = bake("default")
    script = (path / "scripts/stripe_lustre.sh").read_text()
    assert LUSTRE_LAYOUT == "-E 4M -c 1 -E 64M -c 4 -E -1 -c 32 -S 4M"  # CSCS, 2025-11
    assert f"LAYOUT=({LUSTRE_LAYOUT})" in script
    assert post_gen_hook.LUSTRE_LAYOUT == LUSTRE_LAYOUT
    assert "-c -1" not in script.replace("-E -1 -c 32", "")
    # off Alps (no lfs) the script prints the exact commands and fails nothing
    proc = run(
        ["bash", "scripts/stripe_lustre.sh", str(tmp_path / "a b")],
        cwd=path,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert f"lfs setstripe {LUSTRE_LAYOUT} '{tmp_path}/a b'" in proc.stderr


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
    assert calls.read_text().splitlines()[0] == f"setstripe {LUSTRE_LAYOUT} {target}"


def test_dirs_sh_prints_the_directories_and_stops_on_an_unset_variable(bake):
    """scripts/dirs.sh, run, prints the directories; a script using it stops, naming the
    variable, when SCRATCH or USER is unset (not a directory built from an empty string)."""
    path = bake("default")
    env = {"PATH": "/usr/bin:/bin", "SCRATCH": "/s", "USER": "u"}
    assert run(["bash", "scripts/dirs.sh"], cwd=path, env=env).stdout == (
        "data: /s/alps-torch-project/data\n"
        "runs: /capstor/scratch/cscs/u/alps-torch-project/runs\n"
        "images: /s/ce-images\n"
    )
    for script, unset in [
        ("dirs.sh", "USER"),
        ("dirs.sh", "SCRATCH"),
        ("stripe_lustre.sh", "USER"),
    ]:
        given = {k: v for k, v in env.items() if k != unset}
        proc = run(["bash", f"scripts/{script}"], cwd=path, env=given, check=False)
        assert proc.returncode != 0, (script, unset, proc.stdout)
        assert f"{unset}: unbound variable" in proc.stderr, proc.stderr
        assert "lfs" not in proc.stderr and "data:" not in proc.stdout
