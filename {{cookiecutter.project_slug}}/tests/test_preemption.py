"""Signal flag, agreement, end-time guard (single process; the 2-rank case is test_resume)."""

import os
import signal
import time

import torch
from conftest import TINY

from {{ cookiecutter.package_name }} import preemption
from {{ cookiecutter.package_name }}.config import load_config
from {{ cookiecutter.package_name }}.train import train


def test_signals_only_set_a_flag_and_handlers_are_restored():
    before = signal.getsignal(signal.SIGUSR2)
    with preemption.PreemptionFlag() as flag:
        assert not flag.requested
        os.kill(os.getpid(), signal.SIGUSR2)
        assert flag.received == signal.SIGUSR2
        os.kill(os.getpid(), signal.SIGTERM)  # would end pytest if it were not handled
        assert flag.received == signal.SIGTERM
    assert signal.getsignal(signal.SIGUSR2) == before


def test_agree_in_a_single_process():
    assert preemption.agree(True, False, torch.device("cpu")) == (True, False)
    assert preemption.agree(False, True, torch.device("cpu")) == (False, True)


def test_deadline():
    assert not preemption.Deadline(None, 60).near(10, 5)
    now = 1_000_000.0
    deadline = preemption.Deadline(now + 100, safety_s=60)
    assert not deadline.near(until_next_check_s=10, save_s=5, now=now)
    assert deadline.near(until_next_check_s=30, save_s=15, now=now)


def test_stops_before_slurm_job_end_time_with_requeue_status(tmp_path, single_process, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_END_TIME", str(int(time.time()) + 30))
    run_dir = tmp_path / "run"
    cfg = load_config(
        None,
        [
            *TINY,
            f"run_dir={run_dir}",
            "end_time_margin_s=60",
            "preempt_check_every=4",
            "checkpoint_every=0",
        ],
    )
    assert train(cfg) == preemption.REQUEUE_EXIT_CODE == 3
    assert (run_dir / "REQUEUE").read_text().startswith("step 4: SLURM_JOB_END_TIME")
    assert [p.name for p in (run_dir / "checkpoints").glob("*.pt")] == ["step-00000004.pt"]

    monkeypatch.delenv("SLURM_JOB_END_TIME")
    assert train(cfg) == 0
    assert not (run_dir / "REQUEUE").exists()
