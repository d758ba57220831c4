"""Every rank runs the same run, metrics.jsonl survives a cut last line, and a full disk is named
(issue: ranks given different arguments trained on silently; a cut record swallowed the next
run's first one; a full disk read "unexpected pos 704 vs 598" or a safetensors traceback)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
from conftest import PACKAGE, REPO, TINY, free_port, one_line, rank_env, two_ranks

from {{ cookiecutter.package_name }}.cli import main
from {{ cookiecutter.package_name }}.telemetry.metrics import read_records

SHORT = ["max_steps=2", "checkpoint_every=2", "eval_every=0", "log_every=1"]


def test_ranks_given_different_arguments_all_stop_before_writing(tmp_path):
    run_dir = tmp_path / "run"
    base = [*TINY, *SHORT, f"run_dir={run_dir}"]
    results = two_ranks([base, [*base, "lr=0.02", "batch_size=2"]])
    for proc, _, err in results:
        assert proc.returncode == 2, err[-2000:]
        last = err.strip().splitlines()[-1]
        assert "rank 1's configuration differs from rank 0's" in last, last
        assert "batch_size: 4 vs 2; lr: 0.01 vs 0.02" in last and "Traceback" not in err
    assert not run_dir.exists()  # refused before the run directory was made


def test_one_directory_spelled_two_ways_is_one_run(tmp_path):
    run_dir = tmp_path / "run"
    relative = os.path.relpath(run_dir, REPO)  # the ranks run in REPO
    results = two_ranks(
        [[*TINY, *SHORT, f"run_dir={run_dir}"], [*TINY, *SHORT, f"run_dir={relative}/"]]
    )
    assert [proc.returncode for proc, _, _ in results] == [0, 0], results[0][2][-2000:]


# Rank 1 stalls inside its checkpoint write (as if its node had vanished): the other rank's
# wait in the checkpoint's collectives ends after dist_timeout_s, like any other collective.
STALLED_WRITE = f"""
import os, sys, time
import torch.distributed.checkpoint.filesystem as fs
from {PACKAGE}.cli import main
if os.environ["RANK"] == "1":
    fs.FileSystemWriter.write_data = lambda *args: time.sleep(600)
sys.exit(main(sys.argv[1:]))
"""


def test_a_rank_lost_during_a_checkpoint_fails_the_others_within_dist_timeout_s(tmp_path):
    # The checkpoint's own gloo group waited 600 s whatever dist_timeout_s said; the survivors
    # then held the nodes until Slurm noticed the lost one, and never named the cause.
    args = [*TINY, *SHORT, f"run_dir={tmp_path / 'run'}", "dist_timeout_s=20"]
    port = free_port()
    ranks = [
        subprocess.Popen(
            [sys.executable, "-c", STALLED_WRITE, *args],
            cwd=REPO,
            env=rank_env(rank, 2, port),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]
    try:
        _, err = ranks[0].communicate(timeout=240)  # start-up on a loaded machine, then 20 s
    finally:
        for proc in ranks:
            proc.kill()
            proc.communicate()
    assert ranks[0].returncode == 1, err[-2000:]
    last = err.strip().splitlines()[-1]
    assert "ERROR a collective did not complete within dist_timeout_s" in last, err[-2000:]
    assert "Traceback" not in err


def test_a_cut_last_line_is_closed_off_before_the_next_record(tmp_path, single_process, caplog):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    cut = '{"kind": "train", "step": 7, "lo'  # a write cut by a full disk or a kill
    (run_dir / "metrics.jsonl").write_text(cut)
    assert main([*TINY, *SHORT, f"run_dir={run_dir}"]) == 0
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    assert lines[0] == cut  # left as it was, ended
    steps = [r["step"] for r in read_records(run_dir) if r.get("kind") == "train"]
    assert steps == [1, 2]  # the next records are whole, none swallowed


@pytest.fixture
def small_disk(tmp_path):
    """small_disk(kib): a tmpfs of that size, which what is written to it fills (root only)."""
    mounts = []

    def mount(kib: int):
        path = tmp_path / f"small{len(mounts)}"
        path.mkdir()
        command = ["mount", "-t", "tmpfs", "-o", f"size={kib}k", "tmpfs", str(path)]
        if not shutil.which("mount") or subprocess.run(command, capture_output=True).returncode:
            pytest.skip("mounting a small tmpfs needs root and mount(8) (CI runs as root)")
        mounts.append(path)
        return path

    yield mount
    for path in mounts:
        subprocess.run(["umount", "-l", str(path)], check=False)


def test_a_full_disk_is_named_by_every_writer(small_disk, tmp_path, single_process, capsys):
    """torch.save's writer says "unexpected pos 704 vs 598" and safetensors' raises a traceback
    on a full disk: each writer names the cause and the place, and leaves nothing behind."""
    run_dir = tmp_path / "run"
    assert main([*TINY, *SHORT, f"run_dir={run_dir}"]) == 0
    capsys.readouterr()
    disk = small_disk(64)  # less than the model
    for out, extra in (("m.pt", []), ("m.safetensors", []), ("hf", ["--format", "hf"])):
        assert main(["export", f"run_dir={run_dir}", *extra, "--out", str(disk / out)])
        assert f"No space left on device: {disk}" in one_line(capsys), out
    # training: its config and metrics fit, the checkpoint (with AdamW's moments) does not
    disk = small_disk(300)
    assert main([*TINY, *SHORT, f"run_dir={disk / 'run'}"]) != 0
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"{disk}/run/checkpoints/step-00000002 failed: rank 0: " in last
    assert f"No space left on device: {disk}/run/checkpoints" in last, last
    assert [p for d in tmp_path.glob("small*") for p in d.rglob(".*")] == []  # no temp files
    assert not (disk / "run" / "checkpoints" / "step-00000002").exists()
