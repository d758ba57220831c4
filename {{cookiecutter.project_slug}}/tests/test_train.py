"""Single-process runs of the loop: the first command a user types, the minimal classifier, the
TF32 set-up other libraries must survive."""

from types import SimpleNamespace

import torch
from conftest import TINY, checkpoint_steps

from {{ cookiecutter.package_name }}.cli import main
from {{ cookiecutter.package_name }}.optim import Schedule, lr_factor
from {{ cookiecutter.package_name }}.telemetry.metrics import read_records
from {{ cookiecutter.package_name }}.training.build import enable_tf32
from {{ cookiecutter.package_name }}.training.epochs import Epochs


def test_tf32_setup_leaves_the_legacy_getters_working():
    """Lightning and user code call these; with the new fp32_precision API they raise."""
    before = torch.get_float32_matmul_precision()
    try:
        enable_tf32()
        assert torch.get_float32_matmul_precision() == "high"
        assert isinstance(torch.backends.cuda.matmul.allow_tf32, bool)
        assert isinstance(torch.backends.cudnn.allow_tf32, bool)
    finally:
        torch.set_float32_matmul_precision(before)


def test_the_schedule_sets_the_learning_rates_torchs_lambdalr_set():
    """Bit for bit at every step, and each loads the other's state (a checkpoint written with
    LambdaLR resumes with the same learning rate)."""
    cfg = SimpleNamespace(lr=6e-4, min_lr=6e-5, warmup_steps=7, max_steps=40)

    def optimizer():
        return torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))], lr=cfg.lr)

    ours, theirs = optimizer(), optimizer()
    schedule = Schedule(ours, cfg)
    reference = torch.optim.lr_scheduler.LambdaLR(theirs, lambda step: lr_factor(cfg, step))
    for _ in range(45):  # past max_steps: min_lr
        assert schedule.get_last_lr() == reference.get_last_lr()
        ours.step()
        theirs.step()
        schedule.step()
        reference.step()
    assert abs(schedule.get_last_lr()[0] - cfg.min_lr) < 1e-12
    resumed = Schedule(optimizer(), cfg)
    resumed.load_state_dict(reference.state_dict())
    assert resumed.get_last_lr() == reference.get_last_lr() and resumed.last_epoch == 45
    assert resumed.state_dict() == {"last_epoch": 45}


def test_train_on_cpu_in_five_steps(tmp_path, single_process):
    run_dir = tmp_path / "run"
    argv = [*TINY, f"run_dir={run_dir}", "device=cpu", "max_steps=5", "checkpoint_every=0"]
    assert main(["train", *argv]) == 0
    assert checkpoint_steps(run_dir) == [5]


def test_the_minimal_mlp_example_learns(tmp_path, single_process):
    run_dir = tmp_path / "run"
    argv = [*TINY, f"run_dir={run_dir}", "max_steps=60", "eval_every=60", "log_every=10"]
    assert main([*argv, "batch_size=16", "grad_accum_steps=1", "dropout=0.2"]) == 0
    records = read_records(run_dir)
    train = [r for r in records if r["kind"] == "train"]
    (evaluation,) = [r for r in records if r["kind"] == "eval"]
    assert train[-1]["loss"] < train[0]["loss"] and "samples_per_s" in train[0]
    assert evaluation["eval_acc"] > 0.5  # 4 classes: chance is 0.25


def test_epochs_end_where_the_passes_end_on_any_number_of_ranks():
    """100 training samples, epochs=2: a new run at 16 a step has ceil(200 / 16) = 13 steps;
    resumed at step 5 (80 samples seen) on half the ranks (8 a step), the 120 samples left take
    15 more steps; a finished run none. An interval in epochs falls on the step whose samples
    complete it, 0.1 epochs as typed (10 samples), not as a binary float."""
    assert Epochs(100, 16).last_step(2, 0, 0) == 13
    assert Epochs(100, 8).last_step(2, 5, 80) == 20
    assert Epochs(100, 16).last_step(2, 13, 208) == 13
    assert Epochs(100, 16).completes(1.0, 96, 112) and not Epochs(100, 16).completes(1.0, 80, 96)
    assert [s for s in range(1, 8) if Epochs(100, 16).completes(0.5, 16 * (s - 1), 16 * s)] == [
        4, 7
    ]  # fmt: skip
    assert Epochs(100, 5).completes(0.1, 5, 10) and not Epochs(100, 5).completes(0.1, 10, 15)
    assert Epochs(100, 16).epoch(150) == 1.5 and Epochs(None, 16).epoch(150) is None


def test_a_run_directory_in_use_by_another_job_is_refused(tmp_path, single_process, capsys):
    import json
    import os
    import socket

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    holder = {"job": "4242", "host": socket.gethostname(), "pid": os.getppid()}
    (run_dir / "LOCK").write_text(json.dumps(holder))
    assert main([*TINY, f"run_dir={run_dir}", "max_steps=5"]) == 1
    err = capsys.readouterr().err
    assert "is in use by job 4242" in err and "Traceback" not in err
    assert not (run_dir / "checkpoints").exists()  # nothing trained into it


def test_a_run_whose_checkpoints_all_fail_to_load_stops_with_one_line(
    tmp_path, single_process, capsys
):
    run_dir = tmp_path / "run"
    argv = [*TINY, f"run_dir={run_dir}", "max_steps=4", "checkpoint_every=2"]
    assert main(argv) == 0
    for shard in (run_dir / "checkpoints").glob("step-*/*.distcp"):
        shard.write_bytes(b"not a checkpoint")  # every complete checkpoint now fails its check
    capsys.readouterr()
    assert main(argv) == 1  # not a silent fresh start
    err = capsys.readouterr().err
    assert "can be loaded" in err and "move them away" in err and "Traceback" not in err
    assert checkpoint_steps(run_dir) == [2, 4]  # nothing was overwritten


def test_another_model_or_size_on_an_existing_run_is_refused_before_loading(
    tmp_path, single_process, capsys
):
    """Exit 2, one line with each changed key and the two ways on; no checkpoint is read (a
    checkpoint loaded into another shape would end in DCP's size-mismatch text). Another model
    and the GPT's sizes: test_language_runs.py."""
    run_dir = tmp_path / "run"
    argv = [*TINY, f"run_dir={run_dir}", "max_steps=2", "checkpoint_every=2", "eval_every=0"]
    assert main(argv) == 0

    def files() -> dict:  # every file's time and size (folders change: the lock, write probes)
        return {
            p: (p.stat().st_mtime_ns, p.stat().st_size) for p in run_dir.rglob("*") if p.is_file()
        }

    before = files()
    changed = [*argv, "hidden_dim=32"]
    assert main(changed) == 2
    err = capsys.readouterr().err
    (line,) = [line for line in err.splitlines() if "error" in line]
    assert "hidden_dim: 16 -> 32" in line
    assert "new run_dir" in line and "restore the values" in line
    assert "Traceback" not in err and "mismatch" not in err.lower()
    assert files() == before  # no file of the run was touched
