"""`evaluate run_dir=R [dataset=D]`: the newest checkpoint on a validation split, one JSON line,
on one rank or two (resharded), changing nothing in the run directory; the whole split and the
same samples and numbers on any number of ranks (here the classifier's; the language models':
test_evaluate_tokens.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import PACKAGE, REPO, TIMEOUT_S, TINY, clean_env, one_line, two_ranks

from {{ cookiecutter.package_name }}.cli import main
from {{ cookiecutter.package_name }}.config_keys import read_toml

ARGS = ["max_steps=6", "checkpoint_every=6", "eval_every=6", "eval_batches=2", "dropout=0.0"]
VAL_SAMPLES = 201  # on 2 ranks: one rank has one more, the other runs one batch more, uncounted


def run(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", PACKAGE, *args],
        cwd=cwd,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )


def tree(path) -> dict:
    return {p.relative_to(path).as_posix(): p.stat().st_mtime_ns for p in path.rglob("*")}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """TINY on 1,400 synthetic samples written by make-dataset (the last 201 held out), named
    `dataset=data` relative to the directory it was trained in."""
    root = tmp_path_factory.mktemp("evaluate")
    made = run("make-dataset", "--out", str(root / "data"), "--samples", "1400",
               "--features", "8", "--classes", "4")  # fmt: skip
    assert made.returncode == 0, made.stderr[-2000:]
    run_dir = root / "run"
    done = run(*TINY, "dataset=data", f"eval_samples={VAL_SAMPLES}", f"run_dir={run_dir}", *ARGS,
               cwd=root)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return run_dir


def last_eval(run_dir) -> dict:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in records if r.get("kind") == "eval"][-1]


def test_the_newest_checkpoint_on_its_own_validation_split(trained, cli):
    before = tree(trained)
    done = cli("evaluate", f"run_dir={trained}", "eval_batches=2", "device=cpu")
    assert done.returncode == 0, done.stderr[-2000:]
    (line,) = done.stdout.strip().splitlines()
    result = json.loads(line)
    assert result["step"] == 6 and result["ranks"] == 1
    # the same numbers the run logged at its last evaluation (same batches, same weights)
    assert result["eval_loss"] == pytest.approx(last_eval(trained)["eval_loss"], rel=1e-5)
    assert result["eval_acc"] == last_eval(trained)["eval_acc"]
    assert "perplexity" not in result and "eval_bits_per_token" not in result
    assert tree(trained) == before  # nothing written


def test_one_and_two_ranks_score_every_sample_alike(trained, cli):
    """Without eval_batches: the whole validation split, none left out on 2 ranks, the same
    loss and accuracy as on 1 rank; run from another directory than the run's, whose
    config.toml records the dataset's absolute path."""
    recorded = read_toml(trained / "config.toml")["dataset"]
    assert Path(recorded).is_absolute() and Path(recorded) == trained.parent / "data"
    args = ["evaluate", f"run_dir={trained}", "device=cpu", "batch_size=100"]
    a = json.loads(cli(*args).stdout)
    (first, out, err), (second, out1, err1) = two_ranks([args, args])
    assert [first.returncode, second.returncode] == [0, 0], err[-2000:]
    assert "reseeded" not in err + err1  # a 1-rank run's random states: evaluate draws none
    b = json.loads(out)
    assert (a["ranks"], b["ranks"], b["step"], out1) == (1, 2, 6, "")  # rank 0 prints
    assert a["scored_samples"] == b["scored_samples"] == b["scoreable_samples"] == VAL_SAMPLES
    assert a["split"] == "val"
    assert b["eval_acc"] == a["eval_acc"] and b["eval_loss"] == pytest.approx(a["eval_loss"])


@pytest.mark.parametrize(
    "args, expected",
    [
        ([], "evaluate needs run_dir=DIR"),
        (["hidden_dim=4"], "not hidden_dim (the model is the checkpoint's)"),
        (["dataset=synthetic", "num_features=3"], "not num_features"),
    ],
)
def test_wrong_arguments_are_one_line(trained, args, expected, cli):
    run_dir = [f"run_dir={trained}"] if args else []
    done = cli("evaluate", *run_dir, *args)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert expected in done.stderr.strip().splitlines()[-1]


def test_a_directory_without_a_run_is_one_line(tmp_path, cli):
    done = cli("evaluate", f"run_dir={tmp_path}")
    assert done.returncode == 2 and "no config.toml" in done.stderr.strip().splitlines()[-1]


def test_a_split_that_is_not_text_is_one_line(tmp_path, single_process, capsys):
    """The dataset's kind makes the text (DatasetKind.as_text); the arrays kind has none."""
    rng = np.random.default_rng(0)
    np.save(tmp_path / "x.npy", rng.normal(size=(100, 3)).astype(np.float32))
    np.save(tmp_path / "y.npy", rng.integers(0, 2, 100))
    data = tmp_path / "data"
    npy = ["--x", str(tmp_path / "x.npy"), "--y", str(tmp_path / "y.npy")]
    assert main(["make-dataset", "--out", str(data), *npy]) == 0
    capsys.readouterr()
    assert main(["evaluate", f"dataset={data}", "--print-split"]) == 2
    assert f"dataset {data} holds arrays data, which is not text" in one_line(capsys)


def test_a_damaged_checkpoint_is_named_in_one_line(trained, tmp_path, cli):
    """The run's checkpoint lost a file: evaluate names it and stops in one line (it read the
    damaged checkpoint's record first, and DCP's exception escaped as a traceback)."""
    import shutil

    run_dir = tmp_path / "run"
    shutil.copytree(trained, run_dir)
    (newest,) = (run_dir / "checkpoints").glob("step-*")
    next(newest.glob("*.distcp")).unlink()
    done = cli("evaluate", f"run_dir={run_dir}", "eval_batches=1", "device=cpu")
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert f"skipping checkpoint {newest}" in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert "all refused: step-00000006: file __0_0.distcp is missing" in last
