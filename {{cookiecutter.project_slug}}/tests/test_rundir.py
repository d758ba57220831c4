"""The run directory's paths and its faults: files written whole or not at all, and a full disk,
a read-only file system or a file where a folder belongs ending a run in one line that names
the path and the cause, with nothing half-written (injected, see _faults.py)."""

import errno
import os
from pathlib import Path

import pytest
from _faults import fail_writes
from conftest import TINY

from {{ cookiecutter.package_name }}.cli import main
from {{ cookiecutter.package_name }}.config.settings import load_config, save_config
from {{ cookiecutter.package_name }}.run import atomic, preemption
from {{ cookiecutter.package_name }}.run.rundir import REQUEUE, RunDir, RunDirError


def test_the_run_directory_names_each_path_once(tmp_path):
    run_dir = RunDir(tmp_path)
    assert run_dir.checkpoints == tmp_path / "checkpoints"
    assert run_dir.metrics == tmp_path / "metrics.jsonl"
    assert run_dir.config == tmp_path / "config.toml"
    assert run_dir.lock == tmp_path / "LOCK"
    assert run_dir.requeue == tmp_path / REQUEUE == tmp_path / "REQUEUE"
    assert run_dir.tracker_state == tmp_path / "tracker.json"
    assert os.fspath(run_dir) == str(tmp_path) and RunDir.of(run_dir) is run_dir
    preemption.write_requeue_marker(run_dir, "step 4: SIGUSR2")
    assert run_dir.requeue.read_text() == "step 4: SIGUSR2\n"
    preemption.remove_requeue_marker(run_dir)
    assert list(tmp_path.iterdir()) == []


def test_atomic_write_never_leaves_a_partial_file(tmp_path, monkeypatch):
    def crash(tmp):
        tmp.write_bytes(b"half")
        raise OSError("disk full")

    with pytest.raises(OSError):
        atomic.atomic_write(tmp_path / "COMPLETE.json", crash)
    assert list(tmp_path.iterdir()) == []
    atomic.atomic_write_text(tmp_path / "COMPLETE.json", "{}")
    fail_writes(monkeypatch, tmp_path)
    with pytest.raises(OSError, match="No space left on device"):
        atomic.atomic_write_text(tmp_path / "COMPLETE.json", "{...}")
    with pytest.raises(OSError, match="No space left on device"):
        atomic.create_exclusive(tmp_path / "LOCK", b"{}")
    monkeypatch.undo()
    assert [p.name for p in tmp_path.iterdir()] == ["COMPLETE.json"]
    assert (tmp_path / "COMPLETE.json").read_text() == "{}"


def test_a_config_that_cannot_be_written_leaves_no_temp_file(tmp_path, monkeypatch):
    cfg, _ = load_config(None, [*TINY, f"run_dir={tmp_path}"])
    fail_writes(monkeypatch, tmp_path)
    with pytest.raises(OSError, match="No space left on device"):
        save_config(cfg, tmp_path / "config.toml")
    monkeypatch.undo()
    assert list(tmp_path.iterdir()) == []  # no .config.toml.tmp<pid>


def test_a_file_where_a_folder_belongs_is_named(tmp_path):
    (tmp_path / "run").write_text("")
    with pytest.raises(RunDirError, match=r"/run is a file, not a directory"):
        RunDir(tmp_path / "run").create()
    with pytest.raises(RunDirError, match=r"cannot create the directory .*/run/sub: Not a dir"):
        RunDir(tmp_path / "run" / "sub").create()
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "checkpoints").write_text("")
    with pytest.raises(RunDirError, match=r"/other/checkpoints is a file, not a directory"):
        RunDir(tmp_path / "other").prepare()
    (tmp_path / "third" / "metrics.jsonl").mkdir(parents=True)
    with pytest.raises(RunDirError, match=r"/third/metrics.jsonl is a directory, not a file"):
        RunDir(tmp_path / "third").prepare()


@pytest.mark.parametrize(
    "where, code, message",
    [
        ("", errno.EROFS, r"cannot write into .*/run: Read-only file system"),
        ("", errno.ENOSPC, r"cannot write into .*/run: No space left on device"),
        ("checkpoints", errno.EACCES, r"cannot write into .*/run/checkpoints: Permission denied"),
        ("metrics.jsonl", errno.EROFS, r"cannot append to .*/run/metrics.jsonl: Read-only file"),
    ],
)
def test_an_unwritable_run_directory_is_one_line(tmp_path, monkeypatch, where, code, message):
    run_dir = RunDir(tmp_path / "run")
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    fail_writes(monkeypatch, run_dir.path / where, code)
    with pytest.raises(RunDirError, match=message):
        run_dir.create()
        run_dir.prepare()
    monkeypatch.undo()
    assert sorted(p.name for p in run_dir.path.iterdir()) == ["checkpoints"]


def run_train(argv, capsys) -> tuple[int, str]:
    """Exit status, and the one error line (the command's log lines aside); no traceback."""
    capsys.readouterr()
    status = main(argv)
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    (line,) = [line for line in err.splitlines() if "error: " in line]
    return status, line


def test_train_on_a_run_dir_that_is_a_file_is_one_line(tmp_path, single_process, capsys):
    (tmp_path / "run").write_text("not a folder")
    status, err = run_train([*TINY, f"run_dir={tmp_path / 'run'}", "max_steps=2"], capsys)
    assert status == 1 and "/run is a file, not a directory" in err


@pytest.mark.parametrize("what", ["checkpoints", "metrics.jsonl"])
def test_train_on_a_read_only_part_of_the_run_dir_is_one_line(
    tmp_path, single_process, capsys, monkeypatch, what
):
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    fail_writes(monkeypatch, run_dir / what, errno.EROFS)
    status, err = run_train([*TINY, f"run_dir={run_dir}", "max_steps=2"], capsys)
    monkeypatch.undo()
    assert status == 1 and f"{run_dir / what}: Read-only file system" in err
    assert not (run_dir / "LOCK").exists()  # released


def test_a_disk_that_fills_during_a_save_ends_training_in_one_line(
    tmp_path, single_process, capsys, monkeypatch
):
    from {{ cookiecutter.package_name }}.checkpoint import manager

    run_dir = tmp_path / "run"
    argv = [*TINY, f"run_dir={run_dir}", "max_steps=4", "checkpoint_every=2"]
    real_prepare = manager.CheckpointManager._prepare

    def then_full(self, path):  # the disk fills up once the first checkpoint is written
        real_prepare(self, path)
        if path.name == "step-00000004":
            fail_writes(monkeypatch, path)

    monkeypatch.setattr(manager.CheckpointManager, "_prepare", then_full)
    status, err = run_train(argv, capsys)
    monkeypatch.undo()
    assert status == 1
    assert "writing checkpoint" in err and "step-00000004" in err
    assert "No space left on device" in err
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step-00000002"]


def test_a_start_refused_at_data_open_removes_only_a_new_run_dir(tmp_path, single_process, capsys):
    """Data the model cannot read is refused when the run builds it, after the run directory
    was made and metrics.jsonl opened: a new run directory is removed again, one with an
    earlier checkpoint keeps every file as it was."""
    no_train_split = ["synthetic_samples=200", "eval_samples=200"]
    new = tmp_path / "new"
    status, err = run_train([*TINY, *no_train_split, f"run_dir={new}"], capsys)
    assert status == 2 and "dataset has 200 samples, not more than eval_samples" in err
    assert not new.exists()
    earlier = tmp_path / "earlier"
    assert main([*TINY, "max_steps=10", f"run_dir={earlier}"]) == 0
    files = {p: p.read_bytes() for p in earlier.rglob("*") if p.is_file()}
    assert any(p.match("checkpoints/step-00000010/*") for p in files)
    status, err = run_train([*TINY, *no_train_split, f"run_dir={earlier}"], capsys)
    assert status == 2 and "not more than eval_samples" in err
    assert {p: p.read_bytes() for p in earlier.rglob("*") if p.is_file()} == files


def test_the_job_script_and_the_package_name_one_requeue_marker(tmp_path):
    """The job script requeues when `${RUN_DIR}/REQUEUE` is newer than the step's start."""
    jobs = Path(__file__).resolve().parents[1] / "jobs"
    scripts = sorted(p for p in jobs.iterdir() if p.is_file())
    text = "".join(p.read_text() for p in scripts)
    assert '"${RUN_DIR}/' + REQUEUE + '" -nt' in text, [p.name for p in scripts]
