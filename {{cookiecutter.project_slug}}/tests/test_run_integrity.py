"""Every rank runs the same run, metrics.jsonl survives a cut last line, and a full disk is named
(issue: ranks given different arguments trained on silently; a cut record swallowed the next
run's first one; a full disk read "unexpected pos 704 vs 598" or a safetensors traceback)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

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


# Rank 1 hangs in tearing down its process group after an error (as it could with its peers
# gone, or at exit in a thread or an exit handler).
HUNG_TEARDOWN = f"""
import os, sys, time
import torch.distributed as dist
from {PACKAGE}.cli import main
if os.environ["RANK"] == "1":
    dist.destroy_process_group = lambda *args: time.sleep(600)
sys.exit(main(sys.argv[1:]))
"""


def test_a_failing_rank_that_hangs_on_its_way_out_ends_after_dist_timeout_s(tmp_path):
    # A rank leaving on an error (here: the ranks' arguments differ) that then hung held its
    # nodes until the job's time limit; it now ends after dist_timeout_s, with its stacks.
    # 15 s: rank 0 waits that long for rank 1's configuration too, and on a loaded machine one
    # rank may start its run 5 s after the other (rank 0 then timed out: exit 1, not 2)
    base = [*TINY, *SHORT, f"run_dir={tmp_path / 'run'}", "dist_timeout_s=15"]
    (first, _, said), (second, _, err) = two_ranks(
        [base, [*base, "lr=0.02"]], program=("-c", HUNG_TEARDOWN)
    )
    assert (first.returncode, second.returncode) == (2, 1), err[-2000:]
    assert "rank 1's configuration differs from rank 0's" in said
    # faulthandler's dump: the time it waited, then each thread's stack, the hung call first
    assert "Timeout (0:00:15)!" in err and "in <lambda>" in err, err[-2000:]


# The command stops itself with STOP_WITH once its writer has started (an array written,
# torch.save done), as scancel or Ctrl-C would.
STOP_WHILE_WRITING = f"""
import os, signal, sys
import torch
from {PACKAGE}.cli import main
from {PACKAGE}.make_dataset import arrays
sig = getattr(signal, os.environ["STOP_WITH"])
signal.signal(signal.SIGINT, signal.default_int_handler)  # xdist's workers pass on SIG_IGN
digest, save = arrays.file_sha256, torch.save
def write_then_stop(path):  # x.npy is written, y.npy not yet
    found = digest(path)
    os.kill(os.getpid(), sig)
    return found
def save_then_stop(*args, **kwargs):
    save(*args, **kwargs)
    os.kill(os.getpid(), sig)
arrays.file_sha256, torch.save = write_then_stop, save_then_stop
sys.exit(main(sys.argv[1:]))
"""


def run_package(args: list[str], **env: str) -> subprocess.CompletedProcess:
    program = [sys.executable, "-c", STOP_WHILE_WRITING, *args]
    environ = {**os.environ, "PYTHONPATH": str(REPO / "src"), **env}
    return subprocess.run(program, cwd=REPO, env=environ, capture_output=True, text=True)


@pytest.mark.parametrize(
    ("command", "signal_name", "status"),
    [("make-dataset", "SIGTERM", 143), ("make-dataset", "SIGINT", 130), ("export", "SIGTERM", 143)],
)
def test_a_stop_signal_while_writing_removes_the_temporary_files(
    tmp_path, single_process, command, signal_name, status
):
    # SIGTERM killed make-dataset at once, leaving a hidden temporary directory (597 MB in the
    # report) and saying nothing; Ctrl-C printed a 20-line traceback
    if command == "export":
        assert main([*TINY, *SHORT, f"run_dir={tmp_path / 'run'}"]) == 0
        args, out = ["export", f"run_dir={tmp_path / 'run'}", "--out"], tmp_path / "m.pt"
    else:
        args, out = ["make-dataset", "--out"], tmp_path / "ds"  # synthetic arrays
    before = set(tmp_path.iterdir())
    done = run_package([*args, str(out)], STOP_WITH=signal_name)
    assert done.returncode == status, done.stderr[-2000:]
    assert done.stderr == (
        f"python -m {PACKAGE} {command}: stopped ({signal_name}); its temporary files were "
        "removed and nothing was written\n"
    )
    assert set(tmp_path.iterdir()) == before  # no temporary file, no output


def test_a_killed_writes_leftover_is_removed_or_named_by_the_next(tmp_path):
    from {{ cookiecutter.package_name }}.data.directory import HOST

    make = ["make-dataset", "--out", str(tmp_path / "ds")]  # synthetic arrays
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    gone = tmp_path / f".ds.tmp-{HOST}-{dead.pid}-0123abcd"  # SIGKILLed here: its pid is gone
    busy = tmp_path / f".ds.tmp-other-node-{os.getpid()}-4567cdef"  # may be writing elsewhere
    for leftover in (gone, busy):
        leftover.mkdir()
        (leftover / "x.npy").write_bytes(b"\0\0")
    done = run_package(make, STOP_WITH="SIGCONT")  # SIGCONT: ignored, nothing stops
    assert done.returncode == 0, done.stderr[-2000:]
    assert (
        not gone.exists()
        and f"removed {gone}, left by a make-dataset that was killed" in done.stderr
    )
    assert (
        busy.exists()
        and f"{busy}: a make-dataset of {tmp_path / 'ds'} may be writing" in done.stderr
    )
    hour_ago = time.time() - 3700  # unchanged for an hour: no writer is left
    for path in (busy / "x.npy", busy):
        os.utime(path, (hour_ago, hour_ago))
    shutil.rmtree(tmp_path / "ds")
    done = run_package(make, STOP_WITH="SIGCONT")
    assert done.returncode == 0 and not busy.exists(), done.stderr[-2000:]


def stopped_after_step_4(run_dir) -> list[str]:
    """A run to step 4 (checkpoints at 2 and 4) whose step-4 checkpoint is gone, as if killed
    during it: the same command resumes at step 2. Returns its arguments."""
    args = [*TINY, "max_steps=4", "checkpoint_every=2", "eval_every=0", "log_every=1"]
    args.append(f"run_dir={run_dir}")
    assert main(args) == 0
    shutil.rmtree(run_dir / "checkpoints" / "step-00000004")
    return args


def test_a_cut_last_line_is_closed_off_before_the_next_record(tmp_path, single_process, capsys):
    run_dir = tmp_path / "run"
    args = stopped_after_step_4(run_dir)
    path = run_dir / "metrics.jsonl"
    cut = '{"kind": "train", "step": 7, "lo'  # a write cut by a full disk or a kill
    path.write_text(path.read_text() + cut)
    assert main(args) == 0
    lines = path.read_text().splitlines()
    assert cut in lines  # left as it was, ended
    assert "its last line was cut off" in capsys.readouterr().err
    steps = [r["step"] for r in read_records(run_dir) if r.get("kind") == "train"]
    assert steps == [1, 2, 3, 4]  # the next records are whole, none swallowed


def test_a_resume_is_a_new_segment_and_readers_keep_its_records(tmp_path, single_process):
    run_dir = tmp_path / "run"
    assert main(stopped_after_step_4(run_dir)) == 0  # resumes at 2: steps 3 and 4 again
    raw = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [(r["kind"], r["step"]) for r in raw if r["kind"] in ("start", "train")] == [
        ("start", 0), ("train", 1), ("train", 2), ("train", 3), ("train", 4),
        ("start", 2), ("train", 3), ("train", 4),
    ]  # fmt: skip
    kept = read_records(run_dir)
    assert [r["step"] for r in kept if r["kind"] == "train"] == [1, 2, 3, 4]
    assert kept[-1] == raw[-1]  # step 4 of the latest segment (its timings, its checkpoint)
    assert [r["step"] for r in kept if r["kind"] == "start"] == [0, 2]


def test_a_new_run_keeps_a_dead_runs_records_beside_its_own(tmp_path, single_process, capsys):
    # an earlier run in this directory died before its first checkpoint: its records are not
    # this run's, so they move aside instead of being drawn with this run's
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    earlier = '{"kind": "train", "step": 1, "loss": 9.0}\n'
    (run_dir / "metrics.jsonl").write_text(earlier)
    assert main([*TINY, *SHORT, f"run_dir={run_dir}"]) == 0
    (kept,) = run_dir.glob("metrics.before-*.jsonl")
    assert kept.read_text() == earlier
    assert f"kept as {kept.name}" in capsys.readouterr().err
    records = read_records(run_dir)
    assert records[0]["kind"] == "start" and [r["loss"] for r in records[1:2]] != [9.0]
    assert [r["step"] for r in records if r["kind"] == "train"] == [1, 2]


def test_a_full_disk_is_named_by_every_writer(small_disk, tmp_path, single_process, capsys):
    """torch.save's writer says "unexpected pos 704 vs 598" and safetensors' raises a traceback
    on a full disk: each writer names the cause and the place, and leaves nothing behind."""
    run_dir = tmp_path / "run"
    wide = [*TINY, *SHORT, "hidden_dim=256"]  # 270 kB of weights
    assert main([*wide, f"run_dir={run_dir}"]) == 0
    capsys.readouterr()
    disk = small_disk(64)  # less than the model
    for out in ("m.pt", "m.safetensors"):  # the Hugging Face format's: test_language_runs.py
        assert main(["export", f"run_dir={run_dir}", "--out", str(disk / out)])
        assert f"No space left on device: {disk}" in one_line(capsys), out
    # training: its config and metrics fit, the checkpoint (with AdamW's moments) does not
    disk = small_disk(300)
    assert main([*wide, f"run_dir={disk / 'run'}"]) != 0
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"{disk}/run/checkpoints/step-00000002 failed: rank 0: " in last
    assert f"No space left on device: {disk}/run/checkpoints" in last, last
    assert [p for d in tmp_path.glob("small*") for p in d.rglob(".*")] == []  # no temp files
    assert not (disk / "run" / "checkpoints" / "step-00000002").exists()
