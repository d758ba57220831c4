"""compare: runs of a local sweep side by side (the loop docs/training.md shows)."""

import json
import math
from pathlib import Path

import pytest
from conftest import TINY

from {{ cookiecutter.package_name }}.cli import main


def test_compare_three_runs_of_a_local_sweep(tmp_path, single_process, capsys):
    pytest.importorskip("matplotlib")
    runs = []
    for lr in ("0.001", "0.003", "0.01"):  # the documented loop, in-process
        runs.append(tmp_path / f"lr-{lr}")
        args = [*TINY, f"run_dir={runs[-1]}", f"lr={lr}", "max_steps=20", "eval_every=10"]
        assert main(args) == 0
    capsys.readouterr()
    out = tmp_path / "sweep.png"
    assert main(["compare", *[f"run_dir={run}" for run in runs], "--out", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == [
        "run",
        "steps",
        "last",
        "loss",
        "best",
        "eval",
        "last",
        "eval",
        "samples/s",
        "wall",
    ]
    for line, run, lr in zip(lines[1:4], runs, ("0.001", "0.003", "0.01"), strict=True):
        cells = line.split()
        assert cells[0] == str(run) and cells[1] == "20" and cells[-1] == f"lr={lr}"
        assert float(cells[3]) <= float(cells[4])  # best eval <= last eval
    assert lines[4] == "settings that differ: lr"
    assert lines[5] == f"wrote {out}" and out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_compare_needs_two_runs_with_records(tmp_path, capsys):
    assert main(["compare", f"run_dir={tmp_path}", "--out", str(tmp_path / "c.png")]) == 2
    assert "compare needs at least two runs" in capsys.readouterr().err
    args = ["compare", f"run_dir={tmp_path}", f"run_dir={tmp_path / 'b'}"]
    assert main([*args, "--out", str(tmp_path / "c.png")]) == 1
    assert f"{tmp_path}: no metrics.jsonl" in capsys.readouterr().err
    assert not (tmp_path / "c.png").exists()


def test_compare_reads_each_tasks_throughput(tmp_path, capsys):
    """The throughput column is the task's own unit: images for model=vision, not tokens."""
    pytest.importorskip("matplotlib")
    runs = [tmp_path / "a", tmp_path / "b"]
    for i, run in enumerate(runs):
        run.mkdir()
        records = [
            {"kind": "train", "step": s, "loss": 1.0 / s, "images_per_s": 100.0 * (i + 1),
             "images_per_s_per_rank": 50.0, "time": float(s)}
            for s in (1, 2, 3)
        ]  # fmt: skip
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    out = tmp_path / "c.png"
    assert main(["compare", *[f"run_dir={run}" for run in runs], "--out", str(out)]) == 0
    header, first, second = capsys.readouterr().out.splitlines()[:3]
    assert "images/s" in header and "100" in first and "200" in second


def fake_run(run, losses, *more):
    run.mkdir()
    records = [
        {"kind": "train", "step": s, "loss": loss, "tokens_per_s": 10.0, "time": float(s)}
        for s, loss in enumerate(losses, 1)
    ]
    lines = [json.dumps(r) + "\n" for r in [*records, *more]]
    (run / "metrics.jsonl").write_text("".join(lines))


def test_compare_writes_into_the_first_run_and_leaves_out_nan_and_inf(
    tmp_path, capsys, monkeypatch
):
    """Without --out, compare.png goes into the first run's directory (not the current one);
    NaN and infinite values (a diverged run; json writes them as NaN, Infinity) are left out
    and counted; a run named twice, in two spellings, is one row."""
    pytest.importorskip("matplotlib")
    monkeypatch.chdir(tmp_path)
    fake_run(tmp_path / "a", [2.0, 1.5, 1.0])
    diverged = {"kind": "train", "step": 5, "loss": 1.1, "tokens_per_s": 10.0, "time": math.inf}
    fake_run(
        tmp_path / "b",
        [2.0, math.nan, math.inf, 1.2],
        diverged,
        {"kind": "eval", "step": 4, "eval_loss": math.inf},
    )
    args = ["compare", "run_dir=a", "run_dir=b", f"run_dir={tmp_path / 'a'}/", "run_dir=./b"]
    assert main(args) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines[1:3]] == ["a", "b"] and len(lines) == 6
    assert lines[2].split()[1:4] == ["4", "1.2000", "-"]  # step 4's loss; no finite eval
    assert lines[3] == "same settings"
    assert lines[4] == "b: 4 record(s) with a NaN or infinite value left out"
    assert lines[5] == f"wrote {Path('a') / 'compare.png'}"
    assert (tmp_path / "a" / "compare.png").read_bytes()[:4] == b"\x89PNG"
    assert not (tmp_path / "compare.png").exists()
    capsys.readouterr()
    assert main(["compare", "run_dir=a", "run_dir=./a/"]) == 2  # one run, twice
    assert "at least two runs (a run named twice counts once)" in capsys.readouterr().err


def test_a_plot_that_cannot_be_written_names_the_file_asked_for(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    fake_run(tmp_path / "a", [2.0, 1.0])
    fake_run(tmp_path / "b", [2.0, 1.5])
    out = tmp_path / "no" / "such" / "dir" / "c.png"
    args = ["compare", f"run_dir={tmp_path / 'a'}", f"run_dir={tmp_path / 'b'}", "--out", str(out)]
    assert main(args) == 1
    err = capsys.readouterr().err.strip()
    assert f"cannot write {out}: No such file or directory" in err
    assert ".tmp" not in err and len(err.splitlines()) == 1
