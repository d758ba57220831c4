"""Signal flag, agreement, end-time guard (single process; the 2-rank case is test_resume)."""

import os
import signal
import sys
import time

import pytest
import torch
from conftest import TINY, checkpoint_steps

from {{ cookiecutter.package_name }}.config.settings import load_config
from {{ cookiecutter.package_name }}.run import preemption
from {{ cookiecutter.package_name }}.training.loop import train


def test_signals_only_set_a_flag_and_handlers_are_restored():
    before = signal.getsignal(signal.SIGUSR2)
    with preemption.PreemptionFlag() as flag:
        assert not flag.requested
        os.kill(os.getpid(), signal.SIGUSR2)
        assert flag.received == signal.SIGUSR2
        os.kill(os.getpid(), signal.SIGUSR1)  # other guides' --signal=USR1@...
        assert flag.received == signal.SIGUSR1
        os.kill(os.getpid(), signal.SIGTERM)  # would end pytest if it were not handled
        assert flag.received == signal.SIGTERM
        os.kill(os.getpid(), signal.SIGHUP)  # a dropped ssh session: ended the run unsaved
        assert flag.received == signal.SIGHUP
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


class Schedule:
    """A stand-in CheckpointSchedule: saves every `every` steps; `due` says a time-based save."""

    def __init__(self, every=0, due=False):
        self.every, self.due, self.write_s = every, due, 2.0

    def due_by_steps(self, step):
        return self.every > 0 and step % self.every == 0

    def due_by_time(self):
        return self.due


def policy(flag=None, end_time=None, schedule=None, check_every=5, max_steps=100):
    flag = flag or preemption.PreemptionFlag()
    deadline = preemption.Deadline(end_time, safety_s=10)
    return preemption.StopPolicy(
        flag, deadline, schedule or Schedule(), check_every, max_steps, torch.device("cpu")
    )


def test_stop_policy_saves_by_steps_and_at_the_end_without_agreement():
    p = policy(schedule=Schedule(every=3))
    assert [s for s in range(1, 101) if p.poll(s).save] == [*range(3, 100, 3), 100]
    assert not any(p.poll(s).stop for s in range(1, 101))


def test_stop_policy_acts_on_a_signal_only_at_agreement_steps():
    flag = preemption.PreemptionFlag()
    p = policy(flag=flag)
    flag.received = signal.SIGUSR2  # as the handler would
    assert p.poll(3) == preemption.Decision(False, False)
    decision = p.poll(5)
    assert decision.stop and decision.save and decision.reason == "received SIGUSR2"


def test_stop_policy_stops_before_the_end_time_and_saves_by_time():
    p = policy(end_time=time.time() + 5)  # less than safety + write time left
    assert p.poll(5).reason == "SLURM_JOB_END_TIME near"
    p = policy(schedule=Schedule(due=True))
    assert p.poll(5) == preemption.Decision(False, True)
    assert p.poll(100) == preemption.Decision(False, True)  # the last step always saves


def test_stops_before_slurm_job_end_time_with_requeue_status(tmp_path, single_process, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_END_TIME", str(int(time.time()) + 30))
    run_dir = tmp_path / "run"
    cfg, _ = load_config(
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
    assert checkpoint_steps(run_dir) == [4]

    monkeypatch.delenv("SLURM_JOB_END_TIME")
    assert train(cfg) == 0
    assert not (run_dir / "REQUEUE").exists()


def test_young_daly_interval():
    # 60 s to save, 6 h job MTBF -> about 27 minutes (CSCS's recommendation, first order)
    assert preemption.young_daly_interval(60, 6 * 3600) == pytest.approx(1609.97, rel=1e-4)


def test_schedule_forms(monkeypatch):
    steps = preemption.CheckpointSchedule("100", 24)
    assert steps.due_by_steps(200) and not steps.due_by_steps(150) and not steps.due_by_time()
    never = preemption.CheckpointSchedule("0", 24)
    assert not never.due_by_steps(100) and not never.due_by_time()

    clock = [1000.0]
    monkeypatch.setattr(preemption.time, "monotonic", lambda: clock[0])
    minutes = preemption.CheckpointSchedule("30min", 24)
    clock[0] += 29 * 60
    assert not minutes.due_by_time()
    clock[0] += 61
    assert minutes.due_by_time() and not minutes.due_by_steps(100)

    auto = preemption.CheckpointSchedule("auto", mtbf_hours=6)
    assert auto.due_by_time()  # nothing measured yet: save once to measure
    auto.record_save(60.0)  # the stall, not the write, is what a save costs training
    clock[0] += 1600
    assert not auto.due_by_time()
    clock[0] += 20
    assert auto.due_by_time()
    assert "Young/Daly" in auto.describe() and "stall 60.00 s" in auto.describe()

    auto.record_save(0.01)  # async: tiny stall, but never save more often than a write takes
    auto.record_write(120.0)
    assert auto.interval_s() == 120.0


def test_torchrun_stopped_by_a_forwarded_signal_ends_in_one_line(monkeypatch, capsys):
    """What the job scripts' torchrun does after forwarding USR2 to its workers: one line and
    128 + the signal's number, not SignalException's traceback (the Slurm test runs it whole)."""
    from torch.distributed.elastic.multiprocessing.api import SignalException

    from {{ cookiecutter.package_name }}.run import torchrun

    def forwarded(argv):
        raise SignalException("Process 1 got signal: 12", sigval=signal.SIGUSR2)

    monkeypatch.setattr(torchrun, "main", forwarded)
    assert torchrun.run([]) == 128 + signal.SIGUSR2
    assert capsys.readouterr().err.startswith("torchrun: stopped by SIGUSR2, which it forwarded")
    monkeypatch.setattr(torchrun, "main", lambda argv: None)
    assert torchrun.run([]) == 0


@pytest.mark.parametrize(
    "worker, status, how",
    [(["sh", "-c", "exit 4"], 4, "exited with status 4"),
     ([sys.executable, "-c", "import os; os.kill(os.getpid(), 9)"], 128 + 9,
      "was killed by SIGKILL (exit status 137)")],
    ids=["diverged", "killed"],
)  # fmt: skip
def test_torchruns_status_is_its_first_failing_workers_own(worker, status, how, monkeypatch, capfd):
    """torchrun raised ChildFailedError (a page of traceback) and exited 1 whatever its workers'
    status: a diverged run's 4 is 4, in one line (two workers of the real torchrun, shells)."""
    from {{ cookiecutter.package_name }}.run import torchrun

    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # torchrun sets it in its own environment
    handled = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
    handlers = {sig: signal.getsignal(sig) for sig in handled}
    try:
        ended = torchrun.run(["--standalone", "--nproc-per-node=2", "--no-python", *worker])
    finally:  # and its own signal handlers
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    err = capfd.readouterr().err
    assert ended == status and "Traceback" not in err, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("torchrun: worker rank ") and how in last, err
