"""compare: runs of a local sweep side by side (the loop docs/training.md shows)."""

import json

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
        "tokens/s",
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
