"""Checkpoints in one process (no process group): round trip of every part, async snapshots,
fallback past incomplete and corrupt checkpoints, retention, export, and the save interval.
Multi-rank checkpoints: test_checkpoint_dcp.py.

`python tests/test_checkpoint.py` prints the stall of a synchronous and an asynchronous save."""

from __future__ import annotations

import copy
import json
import logging
import random
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed.checkpoint as dcp
from _faults import fail_writes
from conftest import assert_identical

from {{ cookiecutter.package_name }} import checkpoint
from {{ cookiecutter.package_name }}.checkpoint import (
    CheckpointError,
    CheckpointManager,
    ModelAndOptimizer,
    RNGState,
    TrainState,
)


class Run:
    """A small model with dropout, its optimizer and scheduler, registered as checkpoint parts."""

    def __init__(self, directory, keep=3, async_save=False, seed=0, hidden=16):
        torch.manual_seed(seed)
        self.model = torch.nn.Sequential(
            torch.nn.Linear(8, hidden),
            torch.nn.ReLU(),
            torch.nn.Dropout(0.2),
            torch.nn.Linear(hidden, 4),
        )
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=0.01)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda s: 1 / (1 + s))
        self.np_rng = np.random.default_rng(seed + 1)
        self.train = TrainState()
        self.rng = RNGState(self.np_rng, seed=seed)
        parts = {
            "app": ModelAndOptimizer(self.model, self.optimizer),
            "scheduler": self.scheduler,
            "train": self.train,
            "rng": self.rng,
        }
        self.manager = CheckpointManager(directory, parts, keep=keep, async_save=async_save)

    def step(self, n=1):
        for _ in range(n):
            self.model(torch.randn(8, 8)).square().mean().backward()
            self.optimizer.step()
            self.scheduler.step()
            self.optimizer.zero_grad(set_to_none=True)
            self.train.step += 1

    def save(self):
        return self.manager.save(self.train.step)

    def snapshot(self) -> dict:
        return copy.deepcopy(
            {
                "model": self.model.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(),
                "train": (self.train.step, self.train.extra),
            }
        )

    def draws(self) -> list:
        return [torch.rand(3), random.random(), self.np_rng.random()]


@pytest.fixture
def warnings_log(caplog, monkeypatch):
    """The package's warnings, also where its logger does not propagate (configure_logging)."""
    log = logging.getLogger("{{ cookiecutter.package_name }}")
    monkeypatch.setattr(log, "propagate", True)
    caplog.set_level(logging.WARNING, logger=log.name)
    return caplog


def flip_tensor_bytes(path, tensor: torch.Tensor) -> None:
    """256 bytes of 0xFF over `tensor`'s data inside a DCP file (a NaN for torch.load)."""
    data = bytearray(path.read_bytes())
    where = data.find(tensor.detach().numpy().tobytes())
    assert where >= 0 and tensor.nbytes >= 256
    data[where : where + 256] = b"\xff" * 256
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("async_save", [False, True], ids=["sync", "async"])
def test_round_trip_restores_every_part(tmp_path, async_save):
    run = Run(tmp_path, async_save=async_save)
    run.step(3)
    run.train.extra = {"config": {"lr": 0.01}, "dataset": "abc123"}
    saved = run.snapshot()
    stats = run.save()
    expected = run.draws()  # what a resumed run must draw next
    with torch.no_grad():  # training goes on while an async write is in flight
        for p in run.model.parameters():
            p.add_(1.0)
    done = run.manager.wait()
    assert [s.step for s in done] == [3] and done[0].write_s >= done[0].stall_s > 0
    if not async_save:  # the loop waited for the whole write
        assert stats.stall_s == stats.write_s == done[0].write_s
    assert done[0].bytes > 0 and stats.asynchronous == async_save

    other = Run(tmp_path, seed=1)  # different weights and random states
    assert other.manager.load_latest() == 3
    assert_identical(saved, other.snapshot())
    assert_identical(expected, other.draws(), "random draws")


def test_poll_reports_each_completed_save_once(tmp_path):
    run = Run(tmp_path, async_save=True)
    run.step()
    assert run.save().write_s is None
    run.step()
    run.save()  # waits for the first write
    assert [s.step for s in run.manager.poll()] == [1]
    deadline = time.monotonic() + 30
    while not (done := run.manager.poll()) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert [s.step for s in done] == [2] and run.manager.wait() == []
    assert run.manager.save(2).write_s == 0.0  # already on disk: not written again


def two_checkpoints(directory):
    """Checkpoints of steps 1 and 2 in `directory`: the run, and its state at step 1 (what a
    fallback past step 2 must load)."""
    run = Run(directory)
    run.step()
    run.save()
    saved = run.snapshot()
    run.step()
    run.save()
    return run, saved


def test_incomplete_checkpoint_is_skipped(tmp_path, warnings_log):
    _, saved = two_checkpoints(tmp_path)
    killed = tmp_path / "step-00000002"
    (killed / checkpoint.MARKER).unlink()  # as if killed mid-write: the note is still there
    killed.with_name(killed.name + ".writing").write_text("")
    other = Run(tmp_path, seed=1)
    assert other.manager.load_latest() == 1
    assert "skipping incomplete checkpoint" in warnings_log.text
    assert "step-00000002" in warnings_log.text
    assert_identical(saved, other.snapshot())


def test_only_incomplete_checkpoints_start_a_new_run(tmp_path, warnings_log):
    (tmp_path / "step-00000005").mkdir()
    assert Run(tmp_path).manager.load_latest() is None
    assert "step-00000005" in warnings_log.text


def test_bit_flips_in_tensor_data_are_detected(tmp_path, warnings_log):
    run, saved = two_checkpoints(tmp_path)
    shard = tmp_path / "step-00000002" / "__0_0.distcp"
    flip_tensor_bytes(shard, run.model[0].weight)

    # Without the checksums the damage would load silently, as NaN weights.
    raw = {"app.model.0.weight": torch.empty(16, 8)}
    dcp.load(raw, checkpoint_id=tmp_path / "step-00000002", no_dist=True)  # no checks
    assert raw["app.model.0.weight"].isnan().any()

    other = Run(tmp_path, seed=1)
    assert other.manager.load_latest() == 1
    assert "__0_0.distcp does not match its sha256" in warnings_log.text
    assert "step-00000002" in warnings_log.text
    assert_identical(saved, other.snapshot())


@pytest.mark.parametrize("damage", ["truncate", "delete"])
def test_damaged_files_are_named(tmp_path, warnings_log, damage):
    run = Run(tmp_path)
    run.step()
    run.save()
    run.step()
    run.save()
    shard = tmp_path / "step-00000002" / "__0_0.distcp"
    if damage == "truncate":
        shard.write_bytes(shard.read_bytes()[:100])
        message = "__0_0.distcp has 100 bytes"
    else:
        shard.unlink()
        message = "__0_0.distcp is missing"
    assert Run(tmp_path, seed=1).manager.load_latest() == 1
    assert message in warnings_log.text


def test_no_loadable_checkpoint_is_an_error_not_a_fresh_start(tmp_path):
    run = Run(tmp_path)
    for _ in range(3):
        run.step()
        run.save()
        flip_tensor_bytes(
            tmp_path / f"step-{run.train.step:08d}" / "__0_0.distcp", run.model[0].weight
        )
    with pytest.raises(
        CheckpointError, match=r"no checkpoint .* can be loaded \(3 complete, all refused"
    ) as err:
        Run(tmp_path, seed=1).manager.load_latest()
    assert all(f"step-0000000{s}: file __0_0.distcp" in str(err.value) for s in (1, 2, 3))


def test_a_checkpoint_of_another_model_is_refused(tmp_path):
    run = Run(tmp_path)
    run.step()
    run.save()
    with pytest.raises(CheckpointError, match="step-00000001: rank 0: ValueError: Size mismatch"):
        Run(tmp_path, hidden=32).manager.load_latest()


def test_keeps_the_newest_and_removes_stale_directories(tmp_path):
    run = Run(tmp_path, keep=3)
    for _ in range(5):
        run.step()
        run.save()
    assert run.manager.steps() == [3, 4, 5]
    # A write of step 6 killed earlier (its note says so), and step 9 of a branch abandoned
    # by a fallback, killed before it wrote anything.
    (tmp_path / "step-00000006").mkdir()
    (tmp_path / "step-00000006" / "__7_0.distcp").write_bytes(b"stale")
    (tmp_path / "step-00000006.writing").write_text("")
    (tmp_path / "step-00000009").mkdir()
    run.step()
    run.save()
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "step-00000004",
        "step-00000005",
        "step-00000006",
    ]
    assert not (tmp_path / "step-00000006" / "__7_0.distcp").exists()
    assert Run(tmp_path, seed=1).manager.load_latest() == 6


def test_failed_write_is_reported_and_leaves_no_checkpoint(tmp_path, monkeypatch):
    def broken(path):
        raise OSError("disk quota exceeded")

    for async_save in (False, True):
        directory = tmp_path / str(async_save)
        run = Run(directory, async_save=async_save)
        run.step()
        monkeypatch.setattr(checkpoint.manager, "file_record", broken)
        with pytest.raises(CheckpointError, match="writing checkpoint .* disk quota exceeded"):
            run.save()
            run.manager.wait()
        monkeypatch.undo()
        assert run.manager.steps() == [] and Run(directory).manager.load_latest() is None
        assert list(directory.iterdir()) == []  # nothing half-written left behind


def test_train_state_holds_json_and_matches_the_step(tmp_path):
    run = Run(tmp_path)
    run.train.extra = {"fingerprint": object()}
    with pytest.raises(TypeError, match="TrainState.extra must hold JSON values"):
        run.save()
    run.train.extra = {}
    with pytest.raises(ValueError, match=r"save\(7\) but parts\['train'\].step is 0"):
        run.manager.save(7)


def test_rank_without_saved_random_state_is_reseeded_deterministically(monkeypatch):
    saved = RNGState(np.random.default_rng(0)).state_dict()  # written by one rank
    restored = RNGState(np.random.default_rng(5))
    restored.load_state_dict(saved)
    assert restored.note is None
    rank0 = [torch.rand(3), restored.np_rng.random()]

    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_rank", lambda: 1)  # a second rank now
    draws = []
    for _ in range(2):
        reseeded = RNGState(np.random.default_rng(5), seed=3)
        reseeded.load_state_dict(saved)
        draws.append([torch.rand(3), reseeded.np_rng.random()])
    assert "rank 1 has none and is reseeded" in reseeded.note
    assert_identical(draws[0], draws[1], "reseeded draws")
    assert not torch.equal(draws[0][0], rank0[0])


def test_load_model_state_and_export(tmp_path):
    run_dir = tmp_path / "run"
    run = Run(run_dir / "checkpoints")
    run.step()
    run.save()
    first = copy.deepcopy(run.model.state_dict())
    run.step()
    run.train.extra = {"config": {"hidden_dim": 16}}
    run.save()

    config, state = checkpoint.load_model_state(run_dir)
    assert config == {"hidden_dim": 16}
    assert_identical(run.model.state_dict(), state)
    _, state = checkpoint.load_model_state(run_dir / "checkpoints" / "step-00000001")
    assert_identical(first, state)
    flat = checkpoint.read_checkpoint(run_dir / "checkpoints" / "step-00000002")
    assert flat["train.step"] == 2 and flat["scheduler.last_epoch"] == 2
    exp_avg = run.optimizer.state[run.model[0].weight]["exp_avg"]
    assert_identical(exp_avg, flat["app.optim.state.0.weight.exp_avg"])

    out = checkpoint.export_model(run_dir, tmp_path / "export" / "model.pt")
    assert_identical(run.model.state_dict(), torch.load(out, weights_only=True))
    assert sorted(p.name for p in out.parent.iterdir()) == ["model.pt"]  # no temp files left


def test_export_refuses_bad_input(tmp_path, monkeypatch):
    # inside a checkpoint, the file would make that checkpoint fail its check (unlisted file)
    inside = tmp_path / "checkpoints" / "step-00000040" / "m.safetensors"
    with pytest.raises(ValueError, match=f"--out {inside} is inside {tmp_path / 'checkpoints'}"):
        checkpoint.export_model(tmp_path, inside)
    with pytest.raises(ValueError, match=r"must end in \.pt or \.safetensors"):
        checkpoint.export_model(tmp_path, tmp_path / "model.bin")
    with pytest.raises(CheckpointError, match="no complete checkpoint"):
        checkpoint.export_model(tmp_path, tmp_path / "model.pt")
    for module in ("safetensors", "safetensors.torch"):  # as if not installed (nor imported)
        monkeypatch.setitem(sys.modules, module, None)
    with pytest.raises(CheckpointError, match=r"pip install -e '\.\[safetensors\]'"):
        checkpoint.export_model(tmp_path, tmp_path / "model.safetensors")
    assert list(tmp_path.iterdir()) == []


def test_export_safetensors(tmp_path):
    safetensors_torch = pytest.importorskip("safetensors.torch")
    run = Run(tmp_path / "run" / "checkpoints")
    run.step()
    run.train.extra = {"config": {"hidden_dim": 16}}
    run.save()
    out = checkpoint.export_model(tmp_path / "run", tmp_path / "model.safetensors")
    assert_identical(run.model.state_dict(), safetensors_torch.load_file(out))
    with safetensors_torch.safe_open(out, "pt") as f:
        assert json.loads(f.metadata()["config"]) == {"hidden_dim": 16}


def test_git_commit_never_fails_without_git(monkeypatch):
    monkeypatch.setenv("PATH", "")
    assert checkpoint.git_commit() is None


# --------------------------------------------------------------------------- hostile checkpoints


def rewrite_marker(path, change) -> None:
    marker = json.loads((path / checkpoint.MARKER).read_text())
    change(marker)
    (path / checkpoint.MARKER).write_text(json.dumps(marker))


def test_a_marker_listing_fewer_files_is_refused(tmp_path, warnings_log):
    """A marker whose list leaves out the corrupted shard must not vouch for it: resume and
    export both fall back to the checkpoint before, and say why."""
    run_dir = tmp_path / "run"
    run, saved = two_checkpoints(run_dir / "checkpoints")
    newest = run_dir / "checkpoints" / "step-00000002"
    flip_tensor_bytes(newest / "__0_0.distcp", run.model[0].weight)
    rewrite_marker(newest, lambda m: m["files"].pop("__0_0.distcp"))

    other = Run(run_dir / "checkpoints", seed=1)
    assert other.manager.load_latest() == 1
    assert_identical(saved, other.snapshot())
    assert "COMPLETE.json does not list 1 file(s) present (__0_0.distcp)" in warnings_log.text
    _, state = checkpoint.load_model_state(run_dir)
    assert_identical(saved["model"], state)  # not the corrupted step 2
    assert checkpoint.verify(newest).startswith("COMPLETE.json does not list")


@pytest.mark.parametrize("damage", ["no files", "not json", "a list"])
def test_a_marker_that_is_not_a_file_list_is_refused(tmp_path, warnings_log, damage):
    _, saved = two_checkpoints(tmp_path)
    marker = tmp_path / "step-00000002" / checkpoint.MARKER
    text = {"no files": '{"step": 2}', "not json": "{", "a list": "[]"}[damage]
    marker.write_text(text)
    other = Run(tmp_path, seed=1)
    assert other.manager.load_latest() == 1
    assert_identical(saved, other.snapshot())
    assert "skipping checkpoint" in warnings_log.text and "COMPLETE.json" in warnings_log.text


def test_a_shard_written_elsewhere_is_never_marked_complete(tmp_path, monkeypatch):
    # Ranks with different run_dirs (now refused at start) wrote their shards to two places,
    # and rank 0 marked complete a checkpoint missing rank 1's: every resume refused it later.
    # Here the shard DCP's metadata names is taken away before the marker is written.
    run = Run(tmp_path)
    run.step()
    save = checkpoint.manager.dcp.save

    def save_elsewhere(*args, checkpoint_id, **kwargs):
        result = save(*args, checkpoint_id=checkpoint_id, **kwargs)
        (Path(checkpoint_id) / "__0_0.distcp").rename(tmp_path / "elsewhere.distcp")
        return result

    monkeypatch.setattr(checkpoint.manager.dcp, "save", save_elsewhere)
    with pytest.raises(CheckpointError, match=r"its metadata names __0_0.distcp, which is not in"):
        run.save()
    assert checkpoint.complete_steps(tmp_path) == []


def test_a_checkpoint_without_metadata_is_reported_as_that(tmp_path, warnings_log):
    two_checkpoints(tmp_path)
    (tmp_path / "step-00000002" / ".metadata").unlink()
    assert Run(tmp_path, seed=1).manager.load_latest() == 1
    assert "step-00000002: it has no .metadata" in warnings_log.text.replace(
        str(tmp_path) + "/", ""
    )
    assert "no COMPLETE.json" not in warnings_log.text


@pytest.mark.parametrize("which", ["all", "the newest"])
def test_step_directories_nobody_can_verify_are_kept_and_refuse_a_fresh_start(tmp_path, which):
    """Markers lost (not a save of this run interrupted): starting over, or resuming from an
    older checkpoint, would delete intact tensors at the first save. Refused, way on named."""
    two_checkpoints(tmp_path)
    steps = [2] if which == "the newest" else [1, 2]
    for step in steps:
        (tmp_path / f"step-{step:08d}" / checkpoint.MARKER).unlink()
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    with pytest.raises(CheckpointError) as err:
        Run(tmp_path, seed=1).manager.load_latest()
    assert "cannot verify step-00000002 (.metadata but no COMPLETE.json)" in str(err.value)
    assert "away to start over, or restore COMPLETE.json" in str(err.value)
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


def test_a_newer_checkpoint_refused_as_corrupt_is_moved_aside_not_deleted(tmp_path):
    run, _ = two_checkpoints(tmp_path)
    flip_tensor_bytes(tmp_path / "step-00000002" / "__0_0.distcp", run.model[0].weight)
    other = Run(tmp_path, seed=1)
    assert other.manager.load_latest() == 1
    other.step()
    other.train.step = 2
    other.save()  # the same step again, on the branch resumed from step 1
    aside = [p.name for p in tmp_path.iterdir() if p.name.startswith("step-00000002.refused-")]
    assert len(aside) == 1 and (tmp_path / aside[0] / "__0_0.distcp").is_file()
    assert checkpoint.verify(tmp_path / "step-00000002") is None


@pytest.mark.parametrize("async_save", [False, True], ids=["sync", "async"])
def test_a_disk_that_fills_during_a_save_is_one_error_and_leaves_nothing(
    tmp_path, monkeypatch, async_save
):
    run = Run(tmp_path, async_save=async_save)
    run.step()
    run.save()
    run.manager.wait()
    run.step()
    fail_writes(monkeypatch, tmp_path / "step-00000002")  # DCP's shards and .metadata
    with pytest.raises(CheckpointError) as err:
        run.save()
        run.manager.wait()
    monkeypatch.undo()
    message = str(err.value)
    assert "writing checkpoint" in message and "step-00000002" in message
    assert "No space left on device" in message and "\n" not in message
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000001"]
    assert Run(tmp_path, seed=1).manager.load_latest() == 1


# --------------------------------------------------------------------------- measurement


def measure_stall(directory, megabytes: int = 64, saves: int = 3) -> None:
    """Print the stall and write time of sync and async saves of a model of `megabytes` of
    fp32 weights (plus twice that of AdamW state)."""
    width = 1024
    layers = max(1, megabytes * 2**20 // (4 * width * width))
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(4, width)).sum().backward()
    optimizer.step()
    for async_save in (False, True):
        train = TrainState()
        parts = {"app": ModelAndOptimizer(model, optimizer), "train": train}
        manager = CheckpointManager(
            directory / str(async_save), parts, keep=2, async_save=async_save
        )
        for step in range(1, saves + 1):
            train.step = step
            stats = manager.save(step)
            time.sleep(2.0)  # "training" while the write goes on
            print(f"{'async' if async_save else 'sync '} save {step}: stall {stats.stall_s:.3f} s")
        for done in manager.wait() + manager.poll():
            print(f"  step {done.step}: written in {done.write_s:.3f} s, {done.bytes / 1e6:.0f} MB")
        manager.close()


if __name__ == "__main__":
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        measure_stall(Path(tmp), int(sys.argv[1]) if len(sys.argv) > 1 else 64)
