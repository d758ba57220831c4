"""Checkpoint files, fallback on corrupt files, incompatible resume, checkpoint interval."""

import shutil

import pytest
import torch
from conftest import TINY, assert_same_training_state, checkpoint_steps

from {{ cookiecutter.package_name }} import checkpoint
from {{ cookiecutter.package_name }}.config import ConfigError, load_config
from {{ cookiecutter.package_name }}.train import train

SHORT = [*TINY, "max_steps=40"]


def run_here(run_dir, *extra) -> int:
    return train(load_config(None, [*SHORT, f"run_dir={run_dir}", *extra]))


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A finished single-process run (checkpoints at 20, 30, 40), run in this process."""
    run_dir = tmp_path_factory.mktemp("single") / "run"
    with pytest.MonkeyPatch.context() as mp:
        for key in ("RANK", "WORLD_SIZE", "SLURM_NTASKS", "SLURM_JOB_END_TIME"):
            mp.delenv(key, raising=False)
        assert run_here(run_dir) == 0
    torch.set_num_threads(max(1, torch.get_num_threads()))
    return run_dir


def test_truncated_newest_checkpoint_falls_back_to_previous(
    finished_run, tmp_path, single_process, capsys
):
    run_dir = tmp_path / "run"
    shutil.copytree(finished_run, run_dir)
    newest = run_dir / "checkpoints" / "step-00000040.pt"
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])
    assert run_here(run_dir) == 0
    err = capsys.readouterr().err
    assert "skipping unreadable checkpoint" in err and newest.name in err
    assert "from checkpoint step 30" in err
    assert_same_training_state(finished_run, run_dir, 40)  # redone from 30: the same weights


def test_no_loadable_checkpoint_is_an_error_not_a_fresh_start(
    finished_run, tmp_path, single_process
):
    run_dir = tmp_path / "run"
    shutil.copytree(finished_run, run_dir)
    for path in (run_dir / "checkpoints").glob("*.pt"):
        path.write_bytes(b"garbage")
    with pytest.raises(RuntimeError, match="none of the checkpoints"):
        run_here(run_dir)


def test_incompatible_resume_is_refused_unless_forced(
    finished_run, tmp_path, single_process, capsys
):
    run_dir = tmp_path / "run"
    shutil.copytree(finished_run, run_dir)
    with pytest.raises(ConfigError, match=r"hidden_dim: 16 -> 32.*force_resume=true"):
        run_here(run_dir, "hidden_dim=32")
    with pytest.raises(ConfigError, match=r"lr: 0\.01 -> 0\.02"):
        run_here(run_dir, "lr=0.02")
    # keys that do not change the run are fine, force_resume continues anyway
    assert run_here(run_dir, "log_every=7", "checkpoint_every=5") == 0
    assert run_here(run_dir, "max_steps=50", "force_resume=true") == 0
    assert "Continuing because force_resume=true" in capsys.readouterr().err
    assert checkpoint_steps(run_dir)[-1] == 50


def test_checkpoint_contents_and_retention(finished_run):
    assert checkpoint_steps(finished_run) == [20, 30, 40]  # keep_checkpoints=3
    state = torch.load(finished_run / "checkpoints" / "step-00000040.pt", weights_only=True)
    assert state["step"] == 40 and state["world_size"] == 1
    assert not any(k.startswith(("module.", "_orig_mod.")) for k in state["model"])
    assert {"torch", "python", "numpy", "loader"} <= state["rng"][0].keys()
    assert {"epoch", "batch_in_epoch"} == state["data"].keys()
    assert state["config"]["hidden_dim"] == 16 and isinstance(state["torch_version"], str)
    assert not list((finished_run / "checkpoints").glob(".*tmp*"))  # no temp files left


def test_atomic_save_never_leaves_a_partial_file(tmp_path, monkeypatch):
    target = tmp_path / "step-00000001.pt"

    def crash(obj, f):
        f.write(b"half")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", crash)
    with pytest.raises(OSError):
        checkpoint.atomic_save({"model": {}, "step": 1}, target)
    assert list(tmp_path.iterdir()) == []


def test_git_commit_never_fails_without_git(monkeypatch):
    monkeypatch.setenv("PATH", "")
    assert checkpoint.git_commit() is None


def test_young_daly_interval():
    # 60 s to save, 6 h job MTBF -> about 27 minutes (CSCS's recommendation, first order)
    assert checkpoint.young_daly_interval(60, 6 * 3600) == pytest.approx(1609.97, rel=1e-4)


def test_schedule_forms(monkeypatch):
    steps = checkpoint.CheckpointSchedule("100", 24)
    assert steps.due_by_steps(200) and not steps.due_by_steps(150) and not steps.due_by_time()
    never = checkpoint.CheckpointSchedule("0", 24)
    assert not never.due_by_steps(100) and not never.due_by_time()

    clock = [1000.0]
    monkeypatch.setattr(checkpoint.time, "monotonic", lambda: clock[0])
    minutes = checkpoint.CheckpointSchedule("30min", 24)
    clock[0] += 29 * 60
    assert not minutes.due_by_time()
    clock[0] += 61
    assert minutes.due_by_time() and not minutes.due_by_steps(100)

    auto = checkpoint.CheckpointSchedule("auto", mtbf_hours=6)
    assert auto.due_by_time()  # nothing measured yet: save once to measure
    auto.record_save(60.0)
    clock[0] += 1600
    assert not auto.due_by_time()
    clock[0] += 20
    assert auto.due_by_time()
    assert "Young/Daly" in auto.describe()
