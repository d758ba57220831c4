"""Tracking sinks: TensorBoard events and W&B offline runs survive a preempt-and-resume."""

from __future__ import annotations

import builtins
import importlib.util
import json
import re
import sys

import pytest
from _faults import fail_writes

from {{ cookiecutter.package_name }}.telemetry import tracking
from {{ cookiecutter.package_name }}.telemetry.tracking import TrackerError, open_tracker

CONFIG = {"lr": 0.01, "run_dir": "runs/a"}


def records(steps, offset: float = 0.0):
    for step in steps:
        yield {"kind": "train", "step": step, "loss": 10.0 - step + offset, "lr": 0.01}
        yield {"kind": "eval", "step": step, "eval_loss": 20.0 - step + offset, "note": "text"}


def cycle(kind, run_dir, steps, resume_step=0, offset=0.0, **kwargs):
    """One job: open the tracker, log, close."""
    tracker = open_tracker(kind, run_dir, CONFIG, True, "demo", resume_step=resume_step, **kwargs)
    for record in records(steps, offset):
        tracker.log(record)
    tracker.close()
    return tracker


def test_scalars_keep_numeric_fields_under_their_kind():
    record = {"kind": "eval", "step": 3, "eval_loss": 1.5, "n": 2, "ok": True, "time": 1.0}
    assert tracking.scalars(record | {"note": "x"}) == {"eval/eval_loss": 1.5, "eval/n": 2.0}


def test_none_tracker_and_other_ranks_do_nothing(tmp_path):
    for kind, is_main in (("none", True), ("tensorboard", False), ("wandb", False)):
        if kind != "none" and importlib.util.find_spec(kind) is None:
            continue
        tracker = open_tracker(kind, tmp_path, CONFIG, is_main, "demo")
        tracker.log({"kind": "train", "step": 1, "loss": 1.0})
        tracker.close()
    assert list(tmp_path.iterdir()) == []


def test_unknown_kind_is_a_clear_error(tmp_path):
    with pytest.raises(TrackerError, match="tracker must be one of none, tensorboard, wandb"):
        open_tracker("mlflow", tmp_path, CONFIG, True, "demo")


@pytest.mark.parametrize("kind", ["tensorboard", "wandb"])
def test_missing_package_names_the_extra(kind, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, kind, None)  # `import kind` fails as if not installed
    for is_main in (True, False):  # every rank stops at start, not only rank 0
        with pytest.raises(TrackerError) as err:
            open_tracker(kind, tmp_path, CONFIG, is_main, "demo")
        assert f"pip install -e '.[{kind}]'" in str(err.value)


def test_a_failing_tracker_warns_once_and_training_goes_on(caplog):
    class Broken(tracking.Tracker):
        calls = 0

        def write(self, step, values, wall_time):
            Broken.calls += 1
            raise OSError("disk full")

    tracker = Broken()
    tracker.log({"kind": "train", "step": 1, "loss": 1.0})
    tracker.log({"kind": "train", "step": 2, "loss": 1.0})
    assert Broken.calls == 1 and "disk full" in caplog.text


def test_tensorboard_events_survive_preempt_and_resume(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir = tmp_path / "run"
    cycle("tensorboard", run_dir, range(1, 11))  # killed after step 10, checkpoint at step 5
    cycle("tensorboard", run_dir, range(6, 9), resume_step=5, offset=0.5)
    assert len(list((run_dir / "tensorboard").glob("events.out.tfevents.*"))) == 2

    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    assert {"train/loss", "train/lr", "eval/eval_loss"} <= set(events.Tags()["scalars"])
    loss = {e.step: e.value for e in events.Scalars("train/loss")}
    # steps 9-10 of the killed job are purged; 6-8 are the resumed job's values
    assert sorted(loss) == list(range(1, 9))
    assert loss[5] == pytest.approx(5.0) and loss[6] == pytest.approx(4.5)
    assert [e.step for e in events.Scalars("eval/eval_loss")] == list(range(1, 9))


@pytest.fixture
def offline_wandb(tmp_path, monkeypatch):
    """W&B writes only under tmp_path and never reaches the network or $HOME."""
    pytest.importorskip("wandb")
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    for name in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(name, str(tmp_path / name.lower()))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_DISABLE_GIT", "true")
    return tmp_path


def test_wandb_offline_run_keeps_its_id_across_preempt_and_resume(offline_wandb):
    run_dir = offline_wandb / "run"
    cycle("wandb", run_dir, range(1, 11))
    run_id = json.loads((run_dir / "tracker.json").read_text())["wandb_run_id"]
    cycle("wandb", run_dir, range(6, 9), resume_step=5)
    assert json.loads((run_dir / "tracker.json").read_text())["wandb_run_id"] == run_id

    # one offline run directory per job, both for the same run id (a second one started in
    # the same second gets a "-1" suffix)
    offline = sorted((run_dir / "wandb").glob("offline-run-*"))
    assert len(offline) == 2
    name = re.compile(rf"offline-run-[0-9_]+-{run_id}(-[0-9]+)?")
    assert all(name.fullmatch(d.name) for d in offline), offline
    logs = [d / f"run-{run_id}.wandb" for d in offline]
    assert all(f.exists() for f in logs)
    assert any(b"train/loss" in f.read_bytes() for f in logs)  # the scalars went in
    assert not list((offline_wandb / "home").rglob("*"))  # nothing written to $HOME


def test_wandb_mode_from_the_environment_wins(offline_wandb, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    run_dir = offline_wandb / "run"
    cycle("wandb", run_dir, range(1, 3), mode="disabled")  # disabled would write nothing
    assert list((run_dir / "wandb").glob("offline-run-*"))


def test_unreadable_tracker_json_is_a_clear_error(tmp_path):
    (tmp_path / "tracker.json").write_text("{not json")
    with pytest.raises(TrackerError, match="cannot read the W&B run id from .*tracker.json"):
        tracking.wandb_run_id(tmp_path, "demo")


def test_run_id_is_written_atomically(tmp_path, monkeypatch):
    """A crash while writing leaves no tracker.json, so the next start makes a new one."""

    def crash(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(tracking.os, "replace", crash)
    with pytest.raises(KeyboardInterrupt):
        tracking.wandb_run_id(tmp_path, "demo")
    assert not (tmp_path / "tracker.json").exists()
    monkeypatch.undo()
    first = tracking.wandb_run_id(tmp_path, "demo")
    assert tracking.wandb_run_id(tmp_path, "demo") == first


def test_a_run_id_that_cannot_be_stored_is_one_line_and_leaves_nothing(tmp_path, monkeypatch):
    fail_writes(monkeypatch, tmp_path)  # a full disk
    with pytest.raises(TrackerError, match=r"cannot store the W&B run id: No space left on dev"):
        tracking.wandb_run_id(tmp_path, "demo")
    monkeypatch.undo()
    assert list(tmp_path.iterdir()) == []


def test_no_optional_package_is_imported_for_none(tmp_path, monkeypatch):
    real_import = builtins.__import__

    def guarded(name, *args, **kwargs):
        assert not name.startswith(("wandb", "tensorboard", "torch.utils.tensorboard")), name
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", guarded)
    open_tracker("none", tmp_path, CONFIG, True, "demo").log({"kind": "train", "step": 1})
