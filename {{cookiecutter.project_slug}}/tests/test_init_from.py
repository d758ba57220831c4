"""`init_from=`: a new run starts from another run's weights (a Hugging Face GPT-2's and another
tokenizer's: test_hf_gpt2.py, test_language_runs.py).

A learning rate of 1e-12 moves a weight by about 1e-12 per Adam step, so a short run's
checkpoint shows the weights it started from (to 1e-9; the weights are about 0.02)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from conftest import (
    PACKAGE,
    REPO,
    TIMEOUT_S,
    TINY,
    clean_env,
    load_checkpoint,
    train_ranks,
)

UNCHANGED = ["lr=1e-12", "min_lr=1e-12", "weight_decay=0", "warmup_steps=0", "eval_every=0"]
SHORT = ["max_steps=2", "checkpoint_every=2"]


def run(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", PACKAGE, *args]
    return subprocess.run(
        cmd, cwd=REPO, env=clean_env(), capture_output=True, text=True, timeout=TIMEOUT_S
    )


def model_state(run_dir, step: int) -> dict:
    return load_checkpoint(run_dir, step)["model"]["model"]


@pytest.fixture(scope="module")
def source_run(tmp_path_factory):
    """A finished tiny run: the weights other runs start from."""
    run_dir = tmp_path_factory.mktemp("source") / "run"
    done = run(*TINY, f"run_dir={run_dir}", "max_steps=4", "checkpoint_every=4", "eval_every=0")
    assert done.returncode == 0, done.stderr[-2000:]
    return run_dir


def test_a_run_directory_gives_its_weights_to_a_new_run(source_run, tmp_path, cli):
    new = tmp_path / "new"
    done = cli(*TINY, f"run_dir={new}", *SHORT, *UNCHANGED, f"init_from={source_run}")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "starting a new run" in done.stderr and "from the weights of" in done.stderr
    assert "RESUMING" not in done.stderr  # step 0: optimizer, schedule and data start fresh
    start, source = model_state(new, 2), model_state(source_run, 4)
    assert start.keys() == source.keys()
    for name in source:
        torch.testing.assert_close(start[name], source[name], rtol=0, atol=1e-9, msg=name)
    train = load_checkpoint(new, 2)["train"]
    assert "init_from" in str(train)  # recorded in the run's checkpoints


def test_fsdp_on_two_ranks_loads_its_shards_from_a_single_process_run(source_run, tmp_path):
    new = tmp_path / "fsdp"
    ranks = train_ranks(
        new,
        tmp_path / "logs",
        [*SHORT, *UNCHANGED, "parallelism=fsdp", f"init_from={source_run}"],
    )
    assert ranks.wait() == [0, 0], ranks.log(0)[-3000:]
    start, source = model_state(new, 2), model_state(source_run, 4)
    for name in source:
        torch.testing.assert_close(start[name], source[name], rtol=0, atol=1e-9, msg=name)


def test_resuming_the_new_run_needs_no_source(source_run, tmp_path, cli):
    """Once the new run has checkpoints it resumes from its own: the source may be gone."""
    new = tmp_path / "again"
    args = [*TINY, f"run_dir={new}", *SHORT, *UNCHANGED]
    assert cli(*args, f"init_from={source_run}").returncode == 0
    again = cli(*args, f"init_from={tmp_path / 'moved-away'}")
    assert again.returncode == 0 and "RESUMING" in again.stderr, again.stderr[-2000:]


@pytest.mark.parametrize("case", ["missing", "file", "empty", "itself", "other_size"])
def test_a_wrong_source_is_one_line_and_writes_nothing(source_run, tmp_path, case, cli):
    run_dir = tmp_path / "run"
    sources = {
        "missing": (tmp_path / "nowhere", "does not exist"),
        "file": (tmp_path / "weights.pt", "a file"),
        # (with the language workload: "neither a Hugging Face model directory nor ...")
        "empty": (tmp_path / "empty", "a run directory with a complete checkpoint"),
        "itself": (run_dir, "this run's own run_dir"),
        "other_size": (source_run, "tensor net.0.weight is [16, 8], the model's is [32, 8]"),
    }
    source, expected = sources[case]
    (tmp_path / "weights.pt").write_bytes(b"x")
    (tmp_path / "empty").mkdir()
    if case == "itself":
        run_dir.mkdir()
    extra = ["hidden_dim=32"] if case == "other_size" else []  # another model: the GPT's test
    done = cli(*TINY, f"run_dir={run_dir}", *extra, f"init_from={source}")
    assert done.returncode == 2, done.stderr[-2000:]
    last = done.stderr.strip().splitlines()[-1]
    assert "Traceback" not in done.stderr and expected in last, last
    if case == "itself":
        assert not list(run_dir.glob("checkpoints/step-*"))
    else:  # refused before the run directory is made, or the new one removed
        assert not run_dir.exists()
