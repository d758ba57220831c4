"""A user's own dataset kind in one file and one line, and the model that reads it
(docs/your-data.md of the generated repo: point clouds of varying size, a collate of their own,
a random rotation as augmentation, a regression); and a command of their own in one module and
one table entry (docs/training.md, "Commands").

The modules and the registry lines are copied out of the docs pages themselves into a copy of a
baked repository; no other file of the package is touched. The model then trains with DDP and
with FSDP on two CPU ranks with two loader processes each, and learns (its evaluated mean
absolute error falls far below the first); the command runs; the repo's own layout and config
tests still pass.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from conftest import package_env, run
from user_code import add_from_docs, python, torchrun

ARGS = [  # as docs/your-data.md trains it, in small
    "--config",
    "configs/default.toml",
    "device=cpu",
    "model=point_net",
    "point_net_width=32",
    "cloud_points=48",  # the kind's own key: declared in its module alone
    "dataset=synthetic",
    "synthetic_samples=512",
    "eval_samples=64",
    "batch_size=16",
    "max_steps=30",
    "warmup_steps=2",
    "lr=0.003",
    "min_lr=0.0003",
    "log_every=10",
    "eval_every=3",  # the first after 3 steps: still far from what 30 steps learn
    "eval_batches=2",
    "checkpoint_every=0",
    "async_checkpoint=false",
    "num_workers=2",
    "dist_timeout_s=60",
]


@pytest.fixture(scope="module")
def user_repo(bake, tmp_path_factory) -> tuple[Path, str]:
    """A copy of the default bake with the docs' three modules and three registry lines added."""
    repo = tmp_path_factory.mktemp("own-data") / "repo"
    package = add_from_docs(
        bake("default"), repo, "your-data.md",
        "data/point_clouds.py", "data/kinds.py", '"arrays",',
        ("models/point_net.py", "models/__init__.py", '"mlp",'),
        ("training.md", "commands/hello.py", "commands/__init__.py", 'Command("compare",'),
    )  # fmt: skip
    return repo, package


def eval_errors(run_dir: Path) -> list[float]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["eval_mae"] for r in records if r.get("kind") == "eval"]


@pytest.mark.parametrize("parallelism", ["ddp", "fsdp"])
def test_a_dataset_kind_in_one_file_trains_with_workers(user_repo, tmp_path, parallelism):
    repo, package = user_repo
    run_dir = tmp_path / "run"
    trained = torchrun(repo, package, *ARGS, f"run_dir={run_dir}", f"parallelism={parallelism}")
    assert "training the regression point_net" in trained.stderr
    assert "training finished at step 30" in trained.stderr
    assert "(mae " in trained.stderr  # the task's own figure on the evaluation line
    first, *_, last = eval_errors(run_dir)
    assert last < 0.7 * first, f"the regression did not learn: eval_mae {first} -> {last}"


def test_a_command_of_your_own_is_one_module_and_one_entry(user_repo, tmp_path):
    repo, package = user_repo
    assert "hello" in python(repo, package, "--help").stdout
    said = python(repo, package, "hello", f"run_dir={tmp_path}").stdout
    assert said == f"hello from {tmp_path}\n"
    bad = python(repo, package, "hello", str(tmp_path), check=False)
    assert bad.returncode == 2 and "expected run_dir=DIR" in bad.stderr


def test_the_repo_still_holds_its_layout_and_config(user_repo):
    """The new kind, model and command are one module and one line each, their own keys
    included: no map row, no table row, no line in configs/default.toml."""
    repo, package = user_repo
    listed = python(repo, package, "keys").stdout
    assert "| `cloud_points` | `64` | [4, 65536] | yes | point-clouds only: " in listed
    own = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0"]
    checks = ["tests/test_layout.py", "tests/test_config.py"]
    run([*own, *checks], cwd=repo, env=package_env(repo), timeout=300)
