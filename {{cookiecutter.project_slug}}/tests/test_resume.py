"""Exact resume on 2 CPU ranks (gloo): after kill -9 and after a preemption signal to one rank,
with DDP and with FSDP2; and resharding (a 2-rank checkpoint continued by 1 rank).

Each interrupted run must end with model, optimizer, schedule and RNG state bit-identical to the
uninterrupted reference run (same seeds, same world size; gloo on CPU is deterministic).
"""

import hashlib
import re
import shutil
import signal

import pytest
from conftest import (
    TINY,
    assert_same_training_state,
    checkpoint_steps,
    kill_9_then_resume,
    last_logged_step,
    train_ranks,
)

FINAL = 80


def test_reference_run_finished(reference_run):
    assert checkpoint_steps(reference_run) == [60, 70, 80]  # keep_checkpoints=3
    assert (reference_run / "config.toml").exists()
    assert not (reference_run / "REQUEUE").exists()
    assert not (reference_run / "LOCK").exists()  # released at the end


def test_a_blow_up_on_two_ranks_stops_both_and_keeps_the_last_checkpoint(reference_run, tmp_path):
    """The reference run continued at lr 1000 throughout (force_resume): a NaN or inf within a
    few steps, found at the next log step (every step in TINY); both ranks exit 4, rank 0 says it
    in one line, and the step-80 checkpoint is byte for byte what it was, with none after it."""
    run_dir = tmp_path / "run"
    shutil.copytree(reference_run, run_dir)
    last = run_dir / "checkpoints" / f"step-{FINAL:08d}"

    def digest() -> dict[str, str]:
        files = sorted(p for p in last.rglob("*") if p.is_file())
        return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}

    before = digest()
    extra = ["max_steps=100", "lr=1000", "min_lr=1000", "force_resume=true", "dropout=0"]
    ranks = train_ranks(run_dir, tmp_path / "logs", extra)
    assert ranks.wait() == [4, 4], ranks.log(0)[-3000:]
    (line,) = [line for line in ranks.log(0).splitlines() if " ERROR " in line]
    pattern = r"diverged: (gradient norm|loss) (nan|inf) at step (\d+) \((ranks?) [0-9, ]+\)"
    found = re.search(pattern + r"; stopped at step (\d+) with no checkpoint of it", line)
    assert found and int(found[3]) > FINAL and found[3] == found[5], line
    assert f"its checkpoint of step {FINAL}" in line
    assert " ERROR " not in ranks.log(1) and "Traceback" not in ranks.log(0) + ranks.log(1)
    assert checkpoint_steps(run_dir) == [60, 70, FINAL] and digest() == before
    assert not (run_dir / "REQUEUE").exists()


def kill_mid_run_then_resume(reference, tmp_path, extra=()):
    run_dir = tmp_path / "run"
    argv = [*TINY, f"run_dir={run_dir}", *extra]
    kill_9_then_resume(argv, run_dir, tmp_path / "logs", kill_at=47, final=FINAL)
    assert_same_training_state(reference, run_dir, FINAL)


def test_kill_9_then_same_command_resumes_exactly(reference_run, tmp_path):
    kill_mid_run_then_resume(reference_run, tmp_path)


def test_fsdp_kill_9_then_resumes_exactly(fsdp_reference_run, tmp_path):
    kill_mid_run_then_resume(fsdp_reference_run, tmp_path, ["parallelism=fsdp"])


def test_signal_to_one_rank_stops_all_with_one_checkpoint_and_resumes(reference_run, tmp_path):
    run_dir = tmp_path / "run"
    extra = ["checkpoint_every=0"]  # no periodic checkpoints: the only one is the preemption's
    ranks = train_ranks(run_dir, tmp_path / "logs1", extra)
    ranks.wait_for_step(run_dir, 30)
    assert ranks.running()
    ranks.send(signal.SIGUSR1, ranks=[1])  # USR2, the job scripts' signal: the Slurm tests
    assert ranks.wait() == [3, 3], ranks.log(0)[-3000:]

    steps = checkpoint_steps(run_dir)
    assert len(steps) == 1 and 30 <= steps[0] < FINAL
    marker = (run_dir / "REQUEUE").read_text()
    assert marker.startswith(f"step {steps[0]}:")
    for rank in (0, 1):
        assert f"stopping at step {steps[0]}" in ranks.log(rank)
    assert "received SIGUSR1" in ranks.log(1)
    assert "another rank asked to stop" in ranks.log(0)

    again = train_ranks(run_dir, tmp_path / "logs2", extra)
    assert again.wait() == [0, 0], again.log(0)[-3000:]
    assert not (run_dir / "REQUEUE").exists()
    assert_same_training_state(reference_run, run_dir, FINAL)


@pytest.mark.parametrize("parallelism", ["ddp", "fsdp"])
def test_two_rank_checkpoint_resumes_on_one_rank(parallelism, tmp_path):
    """Resharding: the same command on fewer ranks continues from the checkpoint, no force."""
    run_dir = tmp_path / "run"
    extra = [f"parallelism={parallelism}", "max_steps=40", "eval_every=0", "checkpoint_every=0"]
    first = train_ranks(run_dir, tmp_path / "logs1", extra)
    first.wait_for_step(run_dir, 10)
    first.send(signal.SIGUSR2)
    assert first.wait() == [3, 3], first.log(0)[-3000:]
    (stopped,) = checkpoint_steps(run_dir)

    one = train_ranks(run_dir, tmp_path / "logs2", extra, world=1)
    assert one.wait() == [0], one.log(0)[-3000:]
    log = one.log(0)
    assert f"from checkpoint step {stopped}" in log and "world size 2 -> 1" in log
    assert checkpoint_steps(run_dir) == [stopped, 40] and last_logged_step(run_dir) == 40
