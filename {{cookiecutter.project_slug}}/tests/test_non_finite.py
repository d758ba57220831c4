"""A NaN or inf stops a run (telemetry/health.py): a diverged run exits with status 4 in one line
naming the step and rank, writes no checkpoint of the bad state, and initial weights holding a
NaN are refused naming the tensor. The 2-rank case is in test_resume.py (it continues the
reference run)."""

from __future__ import annotations

import math
import re

import torch
from conftest import TINY, checkpoint_steps, load_checkpoint

from {{ cookiecutter.package_name }}.cli import main

# Adam at lr 1000 from the first step (no warmup): the gradient norm is NaN within a few steps.
BLOW_UP = ["lr=1000", "min_lr=1", "warmup_steps=0", "eval_every=0", "dropout=0"]


def errors(capfd) -> list[str]:
    err = capfd.readouterr().err
    assert "Traceback" not in err, err[-3000:]
    return [line for line in err.splitlines() if " ERROR " in line or "error:" in line]


def test_a_blow_up_stops_before_any_checkpoint_of_it(tmp_path, single_process, capfd):
    """Checked before each save (log_every is past the end): the steps before the one whose
    norm is NaN or inf are saved, it is not, nor any after it; the line names it and rank 0."""
    run_dir = tmp_path / "run"
    argv = [*TINY, *BLOW_UP, f"run_dir={run_dir}", "max_steps=10", "checkpoint_every=1"]
    assert main([*argv, "log_every=100"]) == 4
    (line,) = errors(capfd)
    found = re.search(
        r"training diverged: (gradient norm|loss) (nan|inf) at step (\d+) "
        r"\(rank 0\); stopped at step (\d+) with no checkpoint of it",
        line,
    )
    assert found and found[3] == found[4], line  # a save step: found where it happened
    bad = int(found[3])
    assert f"its checkpoint of step {bad - 1} in {run_dir / 'checkpoints'}" in line
    assert checkpoint_steps(run_dir)[-1] == bad - 1 > 0
    weights = load_checkpoint(run_dir, bad - 1)["model"]["model"]
    assert all(bool(torch.isfinite(t).all()) for t in weights.values())
    assert not (run_dir / "REQUEUE").exists()  # the job script does not requeue it


def test_weights_holding_a_nan_are_refused_naming_the_tensor(tmp_path, single_process, capfd):
    source = tmp_path / "source"
    assert main([*TINY, f"run_dir={source}", "max_steps=1", "checkpoint_every=1"]) == 0
    weights = load_checkpoint(source, 1)["model"]["model"]
    weights["net.3.weight"][3, 5] = math.nan  # the hidden layer
    torch.save(weights, tmp_path / "nan.pt")
    capfd.readouterr()
    run_dir = tmp_path / "run"
    assert main([*TINY, f"run_dir={run_dir}", f"init_from={tmp_path / 'nan.pt'}"]) == 2
    (line,) = errors(capfd)
    assert f"init_from={tmp_path / 'nan.pt'}: tensor net.3.weight holds NaN" in line
    assert not run_dir.exists()  # nothing written
