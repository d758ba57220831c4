"""The `program` bake (workload=program): the job scripts, the doctor and the launcher of your
own program, no training package. It is complete: its own tests and pre-commit pass (its
pre-commit with every bake's, tests/test_precommit.py), every module imports, every command
answers `--help`, its README and docs name nothing it lacks, and a job without `--` says in one
line what this repository runs. The tests every bake shares run here only: the default bake's
suite (tests/test_training_package.py) leaves them out."""

from __future__ import annotations

import re
import shutil
import socket
import sys
from pathlib import Path

import numpy as np
import pytest
from baked_files import generated_files
from conftest import assert_generated_suite_passes, clean_env, package_env, run
from fake_slurm import FAKE_SCONTROL, FAKE_SRUN, fake_env

# The package may hold at most this many lines (issue 56: the environment, the job scripts, the
# doctor and the run lock are about 3,300 lines of the default bake's 16,500)
MAX_PACKAGE_LINES = 4000


@pytest.fixture(scope="module")
def repo(bake) -> Path:
    return bake("program")


@pytest.fixture(scope="module")
def package(repo) -> str:
    return repo.name.replace("-", "_")


def test_the_package_is_the_job_scripts_part_only(repo, package, post_gen_hook):
    src = repo / "src" / package
    lines = sum(len(p.read_text().splitlines()) for p in src.rglob("*.py"))
    assert lines <= MAX_PACKAGE_LINES
    assert not (repo / "configs").exists()
    assert {p.name for p in (src / "commands").glob("*.py")} == {"__init__.py", "doctor.py"}
    # the tests it keeps are those of the modules it keeps; the rest are the hook's table's
    kept_tests = {p.name for p in (repo / "tests").glob("*.py")}
    assert kept_tests == {
        *("conftest.py", "_faults.py", "test_alps_lint.py", "test_distributed.py"),
        *("test_doctor.py", "test_doctor_nodes.py", "test_layout.py", "test_program.py"),
        "test_rundir_lock.py",
    }
    project = (repo / "pyproject.toml").read_text()
    assert "[project.optional-dependencies]\ndev = " in project  # no extra it does not use
    assert '"numpy"' not in project


def test_every_module_imports_and_every_command_answers_help(repo, package):
    """One process imports every module; `python -m <pkg> --help` lists the doctor alone."""
    src = repo / "src" / package
    names = sorted(
        ".".join((package, *p.relative_to(src).with_suffix("").parts)).removesuffix(".__init__")
        for p in src.rglob("*.py")
        if p.name != "__main__.py"
    )
    code = f"import importlib\nfor name in {names!r}:\n    importlib.import_module(name)\n"
    env = package_env(repo)
    run([sys.executable, "-c", code], cwd=repo, env=env)
    listed = run([sys.executable, "-m", package, "--help"], cwd=repo, env=env).stdout
    assert re.search(r"^  \{doctor\}$", listed, re.MULTILINE), listed
    doctor = run([sys.executable, "-m", package, "doctor", "--help"], cwd=repo, env=env).stdout
    assert doctor.startswith(f"usage: python -m {package} doctor") and "--quick" in doctor
    # no default command to fall back to: one line, not a traceback
    bare = run([sys.executable, "-m", package], cwd=repo, env=env, check=False)
    assert bare.returncode == 2 and bare.stdout == ""
    assert bare.stderr == f"python -m {package}: error: name a command: doctor\n"


def test_no_page_names_what_the_bake_lacks(repo, post_gen_hook):
    """README and docs: no removed page, command, config or extra is named."""
    removed_pages = [
        Path(p).name
        for p in post_gen_hook.WORKLOAD_PARTS["training"]
        if p.startswith("docs/") and p.endswith(".md")
    ]
    assert removed_pages
    lacking = [*removed_pages, "configs/", "make-dataset", "train-tokenizer", "[plot]", "[hf"]
    lacking += [f"{c} run_dir=" for c in ("generate", "export", "evaluate", "plot", "compare")]
    lacking += ["CONFIG=", "DATASET=", "max_steps", "GPT", "training package ("]
    pages = ["README.md", *sorted(f for f in generated_files(repo) if f.startswith("docs/"))]
    found = {
        (page, word) for page in pages for word in lacking if word in (repo / page).read_text()
    }
    assert not found, sorted(found)
    jobs = "".join(p.read_text() for p in (repo / "jobs").glob("*.sbatch"))
    assert "CONFIG=" not in jobs and "key=value arguments override" not in jobs


def fake_job(repo: Path, tmp_path: Path, *args: str):
    """The container job script as Slurm would start it, srun and scontrol recorders."""
    work = tmp_path / "work" / repo.name
    shutil.copytree(repo, work)
    venv_python = work / ".venv-container" / "bin" / "python"
    venv_python.parent.mkdir(parents=True)
    venv_python.write_text("#!/bin/sh\n")
    venv_python.chmod(0o755)
    fake_bin, calls = tmp_path / "bin", tmp_path / "calls"
    for directory in (fake_bin, calls):
        directory.mkdir(exist_ok=True)
    for name, text in (("srun", FAKE_SRUN), ("scontrol", FAKE_SCONTROL)):
        (fake_bin / name).write_text(text)
        (fake_bin / name).chmod(0o755)
    env = fake_env(tmp_path, fake_bin, calls) | {
        "SLURM_SUBMIT_DIR": str(work),
        "SLURM_JOB_NAME": repo.name,
        "SLURM_JOB_ID": "42",
        "SLURM_JOB_NODELIST": "node1",
        "SLURM_CPUS_PER_TASK": "72",
        "DOCTOR": "0",
    }
    proc = run(["bash", "jobs/train_container.sbatch", *args], cwd=work, env=env, check=False)
    recorded = sorted(calls.iterdir(), key=lambda p: int(p.name))
    return proc, [p.read_text().split("\0")[:-1] for p in recorded]


def test_a_job_without_a_command_says_what_this_repository_runs(repo, package, tmp_path):
    proc, calls = fake_job(repo, tmp_path, "max_steps=7")
    assert proc.returncode == 2 and calls == [], proc.stderr
    assert proc.stderr == (
        "error: this repository runs your own program: sbatch jobs/train_container.sbatch -- "
        "COMMAND [ARGS...] (docs/your-program.md)\n"
    )
    proc, calls = fake_job(repo, tmp_path / "own", "--", "hello_ddp.py", "--seed", "1")
    assert proc.returncode == 0, proc.stderr
    assert "your command: hello_ddp.py --seed 1" in proc.stdout
    assert f"python -m {package}.run.program" in calls[0][-5] and calls[0][-3:] == [
        "hello_ddp.py",
        "--seed",
        "1",
    ]


@pytest.mark.timeout(900)
def test_generated_test_suite_passes(repo):
    """The whole suite of the program bake (about a minute on 2 workers)."""
    assert_generated_suite_passes(repo, timeout=800)


# docs/your-program.md's train_images.py, with SIGUSR2 arriving just after the all-reduce of the
# first step's stop flag (as it may: Python runs the handler between two bytecodes). DDP's own
# reductions do not go through dist.all_reduce: each call is one step's flag.
SIGNAL_AFTER_THE_FIRST_AGREEMENT = """\
import os, runpy, signal, sys
import torch.distributed as dist

reduce = dist.all_reduce
calls = 0

def all_reduce(tensor, *args, **kwargs):
    global calls
    reduce(tensor, *args, **kwargs)
    calls += 1
    if calls == 1:
        os.kill(os.getpid(), signal.SIGUSR2)

dist.all_reduce = all_reduce
sys.argv = ["train_images.py", *sys.argv[1:]]
runpy.run_path("train_images.py", run_name="__main__")
"""


def test_the_pages_trainer_acts_on_the_reduced_stop_flag(repo, tmp_path):
    """A signal that lands after the ranks' agreement on a step counts at the next step: the
    value every rank acts on is the all-reduced one. (Reading `stop` itself, which `.to()`
    returns on the CPU, a rank stopped alone: its peers' next collective failed, once, in the
    Slurm test of this program on 2 ranks.)"""
    from PIL import Image
    from slurm.jobs import page_files

    (tmp_path / "train_images.py").write_text(page_files(repo)["train_images.py"])
    (tmp_path / "signal_after.py").write_text(SIGNAL_AFTER_THE_FIRST_AGREEMENT)
    for label in range(2):  # 2 classes x 48 images: 3 steps of 32 an epoch on one rank
        (tmp_path / "images" / str(label)).mkdir(parents=True)
        for i in range(48):
            pixels = np.full((8, 8, 3), 200 * label, dtype=np.uint8)
            Image.fromarray(pixels).save(tmp_path / "images" / str(label) / f"{i}.png")
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    env = clean_env() | {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "OMP_NUM_THREADS": "1"}
    env |= {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RUN_DIR": str(tmp_path)}
    proc = run(
        [sys.executable, "signal_after.py", str(tmp_path / "images"), "2"],
        cwd=tmp_path,
        env=env,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 3, proc.stderr[-3000:]  # saved, asks to be requeued
    assert re.fullmatch(r"epoch 0 step 2: loss \S+, saved\n", proc.stdout), proc.stdout
