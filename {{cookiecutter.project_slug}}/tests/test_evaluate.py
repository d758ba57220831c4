"""`evaluate run_dir=R [dataset=D]`: the newest checkpoint on a validation split, one JSON line,
on one rank or two (resharded), changing nothing in the run directory."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
from conftest import PACKAGE, REPO, TIMEOUT_S, TINY, TINY_MLP, clean_env, two_ranks

ARGS = ["max_steps=6", "checkpoint_every=6", "eval_every=6", "eval_batches=2", "dropout=0.0"]


def run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", PACKAGE, *args],
        cwd=REPO,
        env=env or clean_env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )


def tree(path) -> dict:
    return {p.relative_to(path).as_posix(): p.stat().st_mtime_ns for p in path.rglob("*")}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("evaluate") / "run"
    done = run(*TINY, f"run_dir={run_dir}", *ARGS)
    assert done.returncode == 0, done.stderr[-2000:]
    return run_dir


def last_eval(run_dir) -> dict:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in records if r.get("kind") == "eval"][-1]


def test_the_newest_checkpoint_on_its_own_validation_split(trained):
    before = tree(trained)
    done = run("evaluate", f"run_dir={trained}", "eval_batches=2", "device=cpu")
    assert done.returncode == 0, done.stderr[-2000:]
    (line,) = done.stdout.strip().splitlines()
    result = json.loads(line)
    assert result["step"] == 6 and result["ranks"] == 1
    # the same number the run logged at its last evaluation (same batches, same weights)
    assert result["eval_loss"] == pytest.approx(last_eval(trained)["eval_loss"], rel=1e-5)
    assert result["eval_bits_per_token"] == pytest.approx(result["eval_loss"] / math.log(2))
    assert result["perplexity"] == pytest.approx(math.exp(result["eval_loss"]))
    assert tree(trained) == before  # nothing written


def test_two_ranks_evaluate_a_one_rank_checkpoint(trained):
    args = ["evaluate", f"run_dir={trained}", "eval_batches=1", "device=cpu"]
    (first, out, err), (second, out1, _) = two_ranks([args, args])
    assert [first.returncode, second.returncode] == [0, 0], err[-2000:]
    result = json.loads(out)
    assert result["ranks"] == 2 and result["step"] == 6 and out1 == ""  # rank 0 prints


@pytest.mark.parametrize(
    "args, expected",
    [
        ([], "evaluate needs run_dir=DIR"),
        (["n_layer=4"], "not n_layer (the model is the checkpoint's)"),
        (["dataset=synthetic", "vocab_size=512"], "not vocab_size"),
    ],
)
def test_wrong_arguments_are_one_line(trained, args, expected):
    run_dir = [f"run_dir={trained}"] if args else []
    done = run("evaluate", *run_dir, *args)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert expected in done.stderr.strip().splitlines()[-1]


def test_a_directory_without_a_run_is_one_line(tmp_path):
    done = run("evaluate", f"run_dir={tmp_path}")
    assert done.returncode == 2 and "no config.toml" in done.stderr.strip().splitlines()[-1]


def test_a_classifier_reports_loss_and_accuracy(tmp_path):
    run_dir = tmp_path / "mlp"
    assert run(*TINY_MLP, f"run_dir={run_dir}", *ARGS).returncode == 0
    done = run("evaluate", f"run_dir={run_dir}", "device=cpu")
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    assert {"eval_loss", "eval_acc"} <= result.keys() and "perplexity" not in result


def test_a_damaged_checkpoint_is_named_in_one_line(trained, tmp_path):
    """The run's checkpoint lost a file: evaluate names it and stops in one line (it read the
    damaged checkpoint's record first, and DCP's exception escaped as a traceback)."""
    import shutil

    run_dir = tmp_path / "run"
    shutil.copytree(trained, run_dir)
    (newest,) = (run_dir / "checkpoints").glob("step-*")
    next(newest.glob("*.distcp")).unlink()
    done = run("evaluate", f"run_dir={run_dir}", "eval_batches=1", "device=cpu")
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert f"skipping checkpoint {newest}" in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert "all refused: step-00000006: file __0_0.distcp is missing" in last
