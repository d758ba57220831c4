"""Every named configuration bakes into exactly the files it should, all of them valid."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest
from conftest import CONFIGS, TEMPLATE_DIR, answers, clean_env, load_hook, run


@pytest.fixture(scope="session")
def post_gen_hook(tmp_path_factory):
    """hooks/post_gen_project.py imported: OPTIONAL_FILES and unchosen_files are the one list of
    files that belong to one answer only."""
    return load_hook(tmp_path_factory.mktemp("hook"), "post_gen_project", answers("default"))


def generated_files(root: Path) -> set[str]:
    return {
        p.relative_to(root).as_posix()
        for p in root.rglob("*")
        if p.is_file() and ".git" not in p.relative_to(root).parts and "__pycache__" not in p.parts
    }


def template_files(package: str) -> set[str]:
    """Files of the template directory, names rendered."""
    src = TEMPLATE_DIR / "{{cookiecutter.project_slug}}"
    return {
        p.relative_to(src).as_posix().replace("{{cookiecutter.package_name}}", package)
        for p in src.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }


def under(files: set[str], paths: list[str]) -> set[str]:
    """The files that are one of paths or inside one of them."""
    return {f for f in files if any(f == p or f.startswith(p + "/") for p in paths)}


def test_exact_file_set(baked, post_gen_hook):
    name, path = baked
    package = path.name.replace("-", "_")
    files = generated_files(path)
    everything = template_files(package)
    dropped = under(everything, post_gen_hook.unchosen_files(answers(name)))
    assert files == everything - dropped
    # each optional file is there exactly when its answer chose it
    a = answers(name)
    for key, choices in post_gen_hook.OPTIONAL_FILES.items():
        for choice, paths in choices.items():
            wanted = a[key] in (choice, post_gen_hook.KEEPS_ALL.get(key))
            assert (under(everything, paths) <= files) == wanted, (key, choice)
            assert bool(under(files, paths)) == wanted, (key, choice)
    for always in (
        "README.md",
        "pyproject.toml",
        ".gitignore",
        "docs/answers.md",
        "configs/default.toml",
        "scripts/setup_venv.sh",
        "scripts/stripe_lustre.sh",
        "jobs/common.sh",
        "logs/.gitkeep",
        f"src/{package}/__main__.py",
    ):
        assert always in files


def test_design_lists_the_optional_files(post_gen_hook):
    """docs/DESIGN.md's generated-repository table names each optional file with its answer."""
    rows = [
        line
        for line in (TEMPLATE_DIR / "docs" / "DESIGN.md").read_text().splitlines()
        if line.startswith("| `")
    ]
    for key, choices in post_gen_hook.OPTIONAL_FILES.items():
        for choice, paths in choices.items():
            row = [r for r in rows if f"| {key}={choice} |" in r]
            assert len(row) == 1, f"DESIGN.md needs one row for {key}={choice}"
            listed = set(re.findall(r"`([^`]+)`", row[0].split(" | ")[0]))
            assert {p.rstrip("/") for p in listed} == set(paths), (key, choice)


def test_answers_doc_states_every_answer(baked):
    name, path = baked
    doc = (path / "docs" / "answers.md").read_text()
    listed = re.findall(r"^\| `(\w+)` \| (.*) \|$", doc, re.MULTILINE)
    asked = [k for k in answers(name) if not k.startswith("_")]
    settings = [
        k
        for k in answers(name)
        if k.startswith("__") and not k.startswith(("__derived_", "__prompts"))
    ]
    assert [key for key, _ in listed] == asked + settings  # every answer and setting, in order
    visible = {k: answers(name)[k] for k in asked + settings}
    uenv = answers(name)["env_flavour"] == "uenv"
    for key, shown in listed:
        value = visible[key]
        unused = " (unused: a uenv repository has no container)"
        assert shown.endswith(unused) == (uenv and key in CONTAINER_ONLY_ANSWERS), key
        shown = shown.removesuffix(unused)
        if "{" not in str(value):  # derived defaults (slug, paths) are rendered in the doc
            assert shown == (str(value) or "(empty)"), key


# Asked of everyone (cookiecutter 2.x has no conditional prompts), used by container repos only.
CONTAINER_ONLY_ANSWERS = ("container_base", "image_dir")


def test_container_answers_say_a_uenv_repo_ignores_them(bake):
    """Their prompts say so, and a uenv repository indeed holds neither value (outside the
    answers record and the linter's generic fixtures)."""
    prompts = json.loads((TEMPLATE_DIR / "cookiecutter.json").read_text())["__prompts__"]
    for key in CONTAINER_ONLY_ANSWERS:
        prompt = prompts[key]["__prompt__"] if isinstance(prompts[key], dict) else prompts[key]
        assert prompt.endswith("(container and both only: a uenv repo ignores it)"), key
    repo = bake("uenv-torchrun")
    a = answers("uenv-torchrun")
    for rel, text in text_files(repo).items():
        generic = ("docs/answers.md", "docs/pre-commit.md", "tools/alps_lint.py")
        if rel.startswith("tests/") or rel in generic:
            continue
        assert a["image_dir"] not in text and "alps-extended" not in text, rel
        assert f"{a['__ngc_pytorch_tag']}-py3" not in text, rel


def test_secrets_are_ignored_by_git(bake, tmp_path):
    path = bake("uenv-torchrun")  # git_init=false: a copy with its own git
    repo = tmp_path / "repo"
    repo.mkdir()
    shutil.copy(path / ".gitignore", repo / ".gitignore")
    run(["git", "init", "--quiet"], cwd=repo)
    secrets = [
        ".env",
        ".env.local",
        "server.key",
        "certs/site.pem",
        ".netrc",
        "credentials.json",
        "gcp-credentials.json",
        "hf_token",
        "hf_token.txt",
        ".huggingface/token",
        ".cache/huggingface/token",
        ".wandb/settings",
        "wandb/run-20250101_000000-abc/files/config.yaml",
        "id_ed25519",
    ]
    proc = run(["git", "check-ignore", "--no-index", *secrets], cwd=repo, check=False)
    assert proc.stdout.split() == secrets
    kept = ["configs/default.toml", ".env.example", "src/keys.py", "docs/credentials.md"]
    proc = run(["git", "check-ignore", "--no-index", *kept], cwd=repo, check=False)
    assert proc.stdout.split() == []


# Openers are what an unrendered template leaves behind; closers alone ("%}", "}}") occur in
# ordinary Python such as f"{share:.0%}" and nested dict literals.
JINJA_MARKERS = re.compile(r"\{\{|\{%|\{#|cookiecutter\.")


def test_no_leftover_jinja(baked):
    name, path = baked
    for rel in sorted(generated_files(path)):
        text = (path / rel).read_text(errors="replace")
        found = JINJA_MARKERS.search(text)
        assert not found, f"{name}: {rel} contains {found.group()!r}"


def test_every_citation_is_one_a_user_can_follow(baked):
    """Platform facts cite the CSCS page (https://docs.cscs.ch/...) or the uenv recipe, never the
    template's own notes, which a generated repository does not have."""
    name, path = baked
    for rel in sorted(generated_files(path)):
        text = (path / rel).read_text(errors="replace")
        assert "alps-facts" not in text, f"{name}: {rel} cites alps-facts"


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
    common = (path / "jobs" / "common.sh").read_text()  # what every job script sources
    for job in jobs:
        d = sbatch_directives(job)
        own = job.read_text()
        assert own.rstrip().endswith("\nsource jobs/common.sh")
        text = own + common
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
        assert 'scontrol requeue "${job_ref}"' in text  # the job, or the array task
        # one place for both flavours: the job script, not the EDF (it holds for uenv jobs too)
        assert text.count("export TORCH_NCCL_ASYNC_ERROR_HANDLING=1") == 1
        assert "srun_args=(--label --kill-on-bad-exit=1)" in text
        if a["launcher"] == "srun":
            assert (d["ntasks-per-node"], d["cpus-per-task"]) == ("4", "72")
            assert ".run.torchrun" not in text
        else:
            assert (d["ntasks-per-node"], d["cpus-per-task"]) == ("1", "288")
            assert f"python -m {path.name.replace('-', '_')}.run.torchrun" in text  # one line
            assert 'PET_SIGNALS_TO_HANDLE="SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR2,SIGUSR1"' in text
        uenv = job.name == "train_uenv.sbatch"
        assert (d.get("uenv"), d.get("view")) == (
            (a["__uenv_image"], "default") if uenv else (None, None)
        )
        # the uenv NCCL/libfabric snippet belongs to uenv jobs only (the CE hook sets its own)
        assert ('export NCCL_NET="AWS Libfabric"' in text) == uenv
        assert ('TRITON_HOME="/dev/shm' in text) == uenv
        assert ("--environment=" in text) == (not uenv)
        extended = a["container_base"] == "alps-extended"
        assert ("--mpi=pmix" in text) == (not uenv and extended)
        # the pinned uenv's view sets hybrid, tested with its libfabric; the job keeps it
        assert ("export FI_CXI_RX_MATCH_MODE=hybrid  #" in text) == uenv
        assert "FI_CXI_RX_MATCH_MODE=software" not in text
        # the flavour's own part is in the job script, the shared part in common.sh only
        assert "NCCL_NET" not in common and "--environment" not in common
        code = [line for line in own.splitlines() if not line.lstrip().startswith("#")]
        assert not [line for line in code if re.match(r"\s*(srun|scontrol) ", line)]


def test_edf_matches_base_image(baked):
    name, path = baked
    a = answers(name)
    edf_path = path / "container/edf.toml"
    if a["env_flavour"] == "uenv":
        assert not edf_path.exists()
        return
    edf = tomllib.loads(edf_path.read_text())
    extended = a["container_base"] == "alps-extended"
    tag = a["__alps_extended_tag"] if extended else a["__ngc_pytorch_tag"]
    assert edf["image"] == f"{a['image_dir']}/{path.name}+{tag}.sqsh"
    assert edf["workdir"] == "${PWD}"
    assert "${PWD}" in edf["mounts"]
    assert not any(m.rstrip("/") in ("${HOME}", "/users", "$HOME") for m in edf["mounts"])
    assert "TORCH_NCCL_ASYNC_ERROR_HANDLING" not in edf["env"]  # the job script exports it
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


def test_image_holds_the_dependencies_but_no_copy_of_the_project(bake, tmp_path):
    """The Dockerfile's RUN, run in a venv on this python (torch from outside, as in the image):
    the dependencies stay installed, the project does not (the venv's editable install is the
    one copy of the code a job runs; a copy in the image would shadow nothing but go stale)."""
    repo = bake("default")
    work = tmp_path / "opt" / repo.name
    shutil.copytree(repo, work, ignore=shutil.ignore_patterns(".git"))
    text = re.sub(r"\\\n", " ", (repo / "Dockerfile").read_text())
    command = next(line[4:] for line in text.splitlines() if line.startswith("RUN "))
    command = command.replace("/tmp/", f"{tmp_path}/").replace(f"/opt/{repo.name}", str(work))
    venv = tmp_path / "image-python"
    run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], cwd=tmp_path)
    # offline and quick: build with this python's setuptools (the venv's seeded one is older)
    run([str(venv / "bin/pip"), "uninstall", "--quiet", "--yes", "setuptools"], cwd=tmp_path)
    env = clean_env() | {
        "PATH": f"{venv}/bin:{clean_env()['PATH']}",
        "PIP_NO_INDEX": "1",
        "PIP_NO_BUILD_ISOLATION": "0",  # sic: pip reads "0" as "no build isolation"
    }
    run(["bash", "-c", command], cwd=work, env=env, timeout=600)
    package = repo.name.replace("-", "_")
    probe = run([str(venv / "bin/python"), "-c", f"import {package}"], cwd=tmp_path, check=False)
    assert "ModuleNotFoundError" in probe.stderr
    assert not (work / "src").exists()
    run([str(venv / "bin/python"), "-c", "import numpy, torch"], cwd=tmp_path)


def test_pyproject_keeps_torch_loose(baked):
    _, path = baked
    project = tomllib.loads((path / "pyproject.toml").read_text())["project"]
    assert project["name"] == path.name
    assert project["requires-python"] == ">=3.10"
    torch_req = [d for d in project["dependencies"] if d.startswith("torch")]
    assert torch_req == ["torch>=2.4"]


def test_git_init(baked):
    name, path = baked
    if answers(name)["git_init"]:
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


LUSTRE_LAYOUT = answers("default")["_lustre_layout"]  # the one source: cookiecutter.json


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
    r"(?<![\w/.-])(?:jobs|scripts|container|docs|configs|tools|tests)/[\w.-]+\.(?:sbatch|sh|toml|md|py)\b"
)
CONTAINER_NAMES = re.compile(r"`(Dockerfile|\.dockerignore)`")


def test_no_dangling_references(baked):
    """README, docs and scripts only mention repository files that were generated."""
    name, path = baked
    texts = [
        path / "README.md",
        *path.glob("docs/*.md"),
        *path.glob("scripts/*.sh"),
        *path.glob("jobs/*"),
    ]
    for text_file in texts:
        text = text_file.read_text()
        refs = set(REPO_PATH.findall(text))
        if text_file.name == "README.md":  # the docs may speak of Dockerfiles in general
            refs |= set(CONTAINER_NAMES.findall(text))
        for ref in refs:
            assert (path / ref).exists(), f"{name}: {text_file.name} mentions missing {ref}"


# each call's arguments, NUL-separated, in calls/<n> (an argument may hold newlines)
RECORD = 'printf "%s\\0" "${0##*/}" "$@" > "${FAKE_CALLS}/$(ls "${FAKE_CALLS}" | wc -l)"\n'
# FAKE_MARKER: a file the step writes, as rank 0 writes <run_dir>/REQUEUE before it exits
FAKE_SRUN = (
    "#!/bin/bash\n"
    + RECORD
    + 'if [[ -n "${FAKE_MARKER:-}" ]]; then sleep 1; echo stop > "${FAKE_MARKER}"; fi\n'
    + 'exit "${FAKE_SRUN_STATUS:-0}"\n'
)
FAKE_SCONTROL = "#!/bin/bash\n" + "if [[ $1 == show ]]; then echo node1; exit; fi\n" + RECORD


def fake_env(home: Path, fake_bin: Path, calls: Path) -> dict[str, str]:
    """A minimal login environment whose srun/scontrol are the fakes in `fake_bin` (each call's
    argv lands in `calls`)."""
    return {
        "PATH": f"{fake_bin}:/usr/bin:/bin",
        "HOME": str(home),
        "USER": "u",
        "SCRATCH": str(home / "scratch"),
        "FAKE_CALLS": str(calls),
    }


@pytest.fixture
def fake_job(bake, tmp_path):
    """fake_job(**env) runs the uenv job script of uenv-torchrun (daint: runs under ${SCRATCH})
    as Slurm would start it, with srun and scontrol replaced by recorders; returns the process
    and the recorded calls. The real-Slurm version of these cases is in test_slurm_e2e.py."""
    baked = bake("uenv-torchrun")
    repo = tmp_path / "work" / baked.name  # the job name is the repository's name
    shutil.copytree(baked, repo)
    venv_python = repo / ".venv-uenv" / "bin" / "python"
    venv_python.parent.mkdir(parents=True)
    venv_python.write_text("#!/bin/sh\n")
    venv_python.chmod(0o755)
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    for name, text in (("srun", FAKE_SRUN), ("scontrol", FAKE_SCONTROL)):
        (fake_bin / name).write_text(text)
        (fake_bin / name).chmod(0o755)
    calls = tmp_path / "calls"

    def _run(**extra: str | None) -> tuple[subprocess.CompletedProcess, list[list[str]]]:
        shutil.rmtree(calls, ignore_errors=True)
        calls.mkdir()
        env = fake_env(tmp_path, fake_bin, calls) | {
            "SLURM_SUBMIT_DIR": str(repo),
            "SLURM_JOB_NAME": repo.name,
            "SLURM_JOB_ID": "42",
            "SLURM_JOB_NODELIST": "node1",
            "SLURM_CPUS_PER_TASK": "288",
            "DATASET": "synthetic",
            "DOCTOR": "0",
            **extra,
        }
        env = {key: value for key, value in env.items() if value is not None}  # None: unset
        proc = run(
            ["bash", "jobs/train_uenv.sbatch", "max_steps=7"], cwd=repo, env=env, check=False
        )
        recorded = sorted(calls.iterdir(), key=lambda p: int(p.name))
        return proc, [p.read_text().split("\0")[:-1] for p in recorded]

    return _run


def test_job_script_runs_array_tasks_as_runs_of_their_own(fake_job, tmp_path):
    """Array task 1 (whose job id is the array's, as Slurm gives the last task) trains
    <job name>-1 with its SWEEP line after the command line's overrides, and a stop for requeue
    requeues 40_1, not the array 40; a plain job requeues itself; failures are not requeued."""
    runs = tmp_path / "scratch" / "alps-torch-project" / "runs"
    sweep = tmp_path / "sweep.txt"
    sweep.write_text("lr=1e-3 seed=1\nlr=3e-4 seed=2\n")
    array_task = {"SLURM_ARRAY_JOB_ID": "40", "SLURM_ARRAY_TASK_ID": "1", "SLURM_JOB_ID": "40"}
    proc, calls = fake_job(**array_task, SWEEP=str(sweep), FAKE_SRUN_STATUS="3")
    assert proc.returncode == 0, proc.stderr
    train = calls[0]
    assert train[0] == "srun" and f"run_dir={runs}/alps-torch-project-1" in train
    assert train[-3:] == ["max_steps=7", "lr=3e-4", "seed=2"]  # the task's line wins
    assert calls[1:] == [["scontrol", "requeue", "40_1"]]
    assert "requeueing job 40_1" in proc.stdout

    proc, calls = fake_job(FAKE_SRUN_STATUS="3")  # not an array: the job itself
    assert proc.returncode == 0 and f"run_dir={runs}/alps-torch-project" in calls[0]
    assert calls[1:] == [["scontrol", "requeue", "42"]]

    proc, calls = fake_job(**array_task, FAKE_SRUN_STATUS="1")  # a failure: no requeue
    assert proc.returncode == 1 and len(calls) == 1
    assert f"run_dir={runs}/alps-torch-project-1" in calls[0]
    assert "error: training failed (exit status 1;" in proc.stderr


def test_job_script_passes_dataset_only_when_the_user_set_it(fake_job, tmp_path):
    """DATASET set: `dataset=` after the config (it overrides the file's). Unset: the default
    stdlib-bytes goes in as `--job-default`, below every config file, so a config's own dataset
    trains (the script used to pass dataset=<default> over it, silently)."""
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "index.json").write_text("{}")
    proc, calls = fake_job(DATASET=str(mine))
    assert proc.returncode == 0, proc.stderr
    (train,) = calls
    assert f"dataset={mine}" in train and "--job-default" not in train
    assert f"dataset={mine}: from DATASET in the job's environment" in proc.stdout

    proc, calls = fake_job(DATASET=None)
    assert proc.returncode == 0, proc.stderr
    default = tmp_path / "scratch" / "alps-torch-project" / "data" / "stdlib-bytes"
    make, train = calls  # the default dataset does not exist yet: made first
    assert make[-3:] == ["--stdlib", "--out", str(default)]
    at = train.index("--job-default")
    assert train[at + 1] == f"dataset={default}"
    assert [i for i, item in enumerate(train) if item.startswith("dataset=")] == [at + 1]


def test_job_script_requeues_on_its_own_requeue_marker_only(fake_job, tmp_path):
    """torchrun turns the workers' exit 3 into 1: the REQUEUE marker written during the step
    requeues the job; a marker that was there before (another job's, on a run directory whose
    LOCK refused this one) does not."""
    marker = tmp_path / "scratch" / "alps-torch-project" / "runs" / "alps-torch-project" / "REQUEUE"
    proc, calls = fake_job(FAKE_SRUN_STATUS="1", FAKE_MARKER=str(marker))
    assert proc.returncode == 0 and calls[1:] == [["scontrol", "requeue", "42"]], proc.stderr
    os.utime(marker, (time.time() - 60,) * 2)  # now it predates the next job's step
    proc, calls = fake_job(FAKE_SRUN_STATUS="1")
    assert proc.returncode == 1 and len(calls) == 1 and marker.exists()


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"SLURM_ARRAY_JOB_ID": "40", "SLURM_ARRAY_TASK_ID": "0", "RUN_DIR": "/x/run"},
            "error: RUN_DIR=/x/run would be shared by every task of the array; set RUN_NAME",
        ),
        (
            {"SLURM_ARRAY_JOB_ID": "40", "SLURM_ARRAY_TASK_ID": "2", "SWEEP": "{sweep}"},
            "error: SWEEP={sweep} has no line 3 for array task 2",
        ),
        (
            {"SLURM_ARRAY_JOB_ID": "40", "SLURM_ARRAY_TASK_ID": "0", "SWEEP": "{sweep}.missing"},
            "error: SWEEP={sweep}.missing does not exist",
        ),
        ({"SWEEP": "{sweep}"}, "error: SWEEP={sweep} needs a job array: sbatch --array=0-N"),
    ],
    ids=["shared-run-dir", "short-sweep", "missing-sweep", "sweep-without-array"],
)
def test_job_script_refuses_bad_array_settings(fake_job, tmp_path, env, message):
    """Each mistake ends the job at once with exit 2 and one line naming the variable."""
    sweep = tmp_path / "sweep.txt"
    sweep.write_text("lr=1e-3\n\n")  # task 1's line is empty: no line for it either
    env = {key: value.format(sweep=sweep) for key, value in env.items()}
    proc, calls = fake_job(**env)
    assert proc.returncode == 2 and calls == []
    assert message.format(sweep=sweep) in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def run_task(command: list[str], repo: Path, tmp_path: Path, **env: str) -> list[str]:
    """Run one recorded `srun ... bash -c CMD bash ARGS` task as Slurm would on a node (the venv
    and nsys are recorders); returns the program it ran, with its arguments."""
    bash = command.index("bash")
    fake = tmp_path / "task-bin"
    fake.mkdir(exist_ok=True)
    log = tmp_path / "task-argv"
    for name in ("python", "nsys"):
        (fake / name).write_text(f'#!/bin/bash\nprintf "%s\\n" {name} "$@" > "{log}"\n')
        (fake / name).chmod(0o755)
    venv = repo / ".venv-uenv" / "bin"
    (venv / "activate").write_text(f'export PATH="{fake}:$PATH"\n')
    task_env = {"PATH": f"{fake}:/usr/bin:/bin", "VENV": str(venv.parent), "SLURM_JOB_ID": "42"}
    subprocess.run(
        command[bash:], cwd=repo, env=task_env | env, check=True, capture_output=True, text=True
    )
    return log.read_text().splitlines()


def test_nsys_profiles_the_training_step_of_the_chosen_ranks(fake_job, tmp_path):
    """NSYS=1: rank 0 (with torchrun: node 0's torchrun) trains under `nsys profile`, its report
    in <RUN_DIR>/nsys/; NSYS=all: every one; unset: none; the doctor never; a typo: exit 2."""
    repo = tmp_path / "work" / "alps-torch-project"
    run_dir = tmp_path / "scratch" / "alps-torch-project" / "runs" / "alps-torch-project"
    for nsys, node, profiled in (("1", "0", True), ("1", "1", False), ("all", "1", True)):
        proc, calls = fake_job(NSYS=nsys, DOCTOR="1")
        assert proc.returncode == 0, proc.stderr
        doctor, train = calls
        env = {"NSYS": nsys, "NSYS_DIR": str(run_dir / "nsys"), "SLURM_NODEID": node}
        argv = run_task(train, repo, tmp_path, **env)
        if profiled:
            output = f"--output={run_dir}/nsys/42-node{node}"
            assert argv[:4] == ["nsys", "profile", "--trace=cuda,nvtx,osrt", output]
            assert argv[4:7] == ["python", "-m", "alps_torch_project.run.torchrun"]
        else:
            assert argv[:3] == ["python", "-m", "alps_torch_project.run.torchrun"]
        assert (run_dir / "nsys").is_dir()
        assert run_task(doctor, repo, tmp_path, **env)[0] == "python"
    proc, calls = fake_job()
    assert run_task(calls[0], repo, tmp_path, NSYS="0", SLURM_NODEID="0")[0] == "python"
    proc, calls = fake_job(NSYS="yes")
    assert proc.returncode == 2 and calls == []
    assert proc.stderr.startswith("error: NSYS=yes: use NSYS=1 (node 0) or NSYS=all")


def text_files(root: Path) -> dict[str, str]:
    files = {}
    for rel in generated_files(root):
        try:
            files[rel] = (root / rel).read_text()
        except UnicodeDecodeError:
            continue
    return files


def rendered_answers(name: str) -> dict:
    """The answers of a configuration as the bake used them: cookiecutter's Jinja rendered."""
    from cookiecutter.generate import generate_context
    from cookiecutter.prompt import prompt_for_config

    context = generate_context(TEMPLATE_DIR / "cookiecutter.json", extra_context=CONFIGS[name])
    return prompt_for_config(context, no_input=True)


def test_each_fact_is_written_once(baked):
    """The image file, the base image, the Lustre layout, TORCH_NCCL_ASYNC_ERROR_HANDLING and
    the partition each live in one place of the generated repo; the rest reads them from there."""
    name, path = baked
    a = answers(name)
    # the generated repo's own tests hold fixtures (test tables), not facts of this repo
    files = {rel: text for rel, text in text_files(path).items() if not rel.startswith("tests/")}

    def holders(fact: str, among=None) -> dict[str, int]:
        return {
            rel: text.count(fact)
            for rel, text in files.items()
            if fact in text and (among is None or rel.startswith(among))
        }

    if a["env_flavour"] != "uenv":
        extended = a["container_base"] == "alps-extended"
        tag = a["__alps_extended_tag"] if extended else a["__ngc_pytorch_tag"]
        sqsh = f"{a['image_dir']}/{path.name}+{tag}.sqsh"
        base = (
            f"ghcr.io/eth-cscs/alps-extended-images/ngc-pytorch:{tag}"
            if extended
            else f"nvcr.io/nvidia/pytorch:{tag}-py3"
        )
        assert holders(sqsh) == {"container/edf.toml": 1}
        assert holders(f"{path.name}+{tag}") == {"container/edf.toml": 1}
        assert holders(base) == {"Dockerfile": 1}
    # the linter's advice and the doctor's read it from there (tests hold fixtures of it)
    assert holders(LUSTRE_LAYOUT) == {"scripts/stripe_lustre.sh": 1}
    jobs = {rel for rel in files if rel.endswith(".sbatch")}
    # the part both job scripts share is written once (jobs/common.sh, sourced by each)
    assert holders("TORCH_NCCL_ASYNC_ERROR_HANDLING=") == {"jobs/common.sh": 1}
    assert holders('scontrol requeue "${job_ref}"') == {"jobs/common.sh": 1}
    assert holders('RUN_NAME="${RUN_NAME:-${SLURM_JOB_NAME}}"') == {"jobs/common.sh": 1}
    assert holders(f"--partition={a['partition']}") == dict.fromkeys(jobs, 1)
    if a["account"]:
        assert holders(f"--account={a['account']}") == dict.fromkeys(jobs, 1)
    # the directories: scripts/dirs.sh for the scripts, the EDF's mounts (TOML cannot source
    # it); docs show them to copy (answers.md records the answers)
    docs = {rel for rel in files if rel.endswith(".md")}
    container = a["env_flavour"] != "uenv"
    rendered = rendered_answers(name)
    for answer in ("data_dir", "checkpoint_dir", "image_dir"):
        held = holders(f'"{rendered[answer]}"')
        held = {rel: n for rel, n in held.items() if rel not in docs}
        expected = {"scripts/dirs.sh": 1}
        if container and answer != "image_dir":
            expected["container/edf.toml"] = 1
        if answer == "image_dir" and not container:
            expected = {}
        assert held == expected, (answer, held)
        code = {rel for rel in files if rendered[answer] in files[rel]} - docs
        assert code == set(expected) | ({"container/edf.toml"} if container else set()), code


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


def test_docs_index_links_every_page(baked):
    """docs/index.md links each page of docs/ (answers.md was reachable from nowhere), the README
    links the index, and every link of the index resolves."""
    _, path = baked
    index = (path / "docs" / "index.md").read_text()
    links = set(re.findall(r"\]\(([^)#]+)", index))
    pages = {p.name for p in (path / "docs").glob("*.md")} - {"index.md"}
    assert pages <= links, f"not in docs/index.md: {sorted(pages - links)}"
    assert all((path / "docs" / link).resolve().is_file() for link in links), links
    assert "(docs/index.md)" in (path / "README.md").read_text()


def test_readme_local_section_is_one_path(baked):
    """The README's local set-up is setup_venv.sh --here (dev extras, the venv the demo and the
    E2E tests build) and the dataset goes where docs/training.md puts it."""
    _, path = baked
    readme = (path / "README.md").read_text()
    local = readme.split("## Run it locally", 1)[1].split("\n## ", 1)[0]
    assert re.search(r"scripts/setup_venv\.sh \w+ --here && \. \.venv-\w+/bin/activate", local)
    assert local.count("pip install") == 1  # torch itself, where python3 has none
    assert "python -m venv" not in local
    training = (path / "docs" / "training.md").read_text()
    assert "--out data/stdlib-bytes" in local and "--out data/stdlib-bytes" in training
    assert "runs/stdlib-bytes" not in readme
    assert "fast subset" in local and "full suite" in local


def test_readme_says_where_to_clone_and_how_to_try_the_debug_partition(baked):
    name, path = baked
    readme = (path / "README.md").read_text()
    assert "**Where to clone**: in `$HOME`" in readme and "/capstor/store" in readme
    assert "14 days" in readme
    debug_run = (
        "sbatch --nodes=1" if answers(name)["partition"] == "debug" else "sbatch --partition=debug"
    )
    assert debug_run in readme
    limits = {"clariden": "at most 4 nodes and 1.5 node-hours", "daint": "at most 2 nodes and 30"}
    limits["santis"] = limits["daint"]
    assert limits[answers(name)["cluster"]] in readme


def test_readme_speaks_of_the_chosen_flavour_only(baked):
    """The flavour sections are included per flavour (templates/readme_*.md.j2): a one-flavour
    README says nothing of the other environment."""
    name, path = baked
    readme = (path / "README.md").read_text()
    flavour = answers(name)["env_flavour"]
    assert ("uenv" in readme.lower()) == (flavour != "container")
    assert ("Container Engine" in readme) == (flavour != "uenv")
    assert ("Dockerfile" in readme) == (flavour != "uenv")


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
