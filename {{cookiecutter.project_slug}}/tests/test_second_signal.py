"""A second SIGINT/SIGTERM stops at once and names the last checkpoint; the first still waits."""

import os
import signal
import time

from conftest import TINY, Ranks, checkpoint_steps

from {{ cookiecutter.package_name }}.checkpoint import complete_steps
from {{ cookiecutter.package_name }}.run import interrupts, preemption


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def plant_checkpoint(run_dir, step, complete=True):
    path = run_dir / "checkpoints" / f"step-{step:08d}"
    path.mkdir(parents=True)
    (path / ".metadata").write_bytes(b"")
    if complete:
        (path / "COMPLETE.json").write_text("{}")


def test_the_second_stop_signal_exits_at_once_naming_the_last_checkpoint(
    tmp_path, caplog, monkeypatch
):
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("SLURM_PROCID", raising=False)
    plant_checkpoint(tmp_path, 20)
    plant_checkpoint(tmp_path, 30, complete=False)  # cut off: not where a restart resumes
    exits, clock = [], Clock()
    second = interrupts.SecondSignal(tmp_path, complete_steps, exit=exits.append, clock=clock)
    second(signal.SIGUSR2)  # Slurm's warning is not a stop request
    second(signal.SIGTERM)
    assert exits == [] and "send it again to stop at once" in caplog.text
    clock.now += 0.1
    second(signal.SIGINT)  # the same event (Ctrl-C under torchrun): still waiting
    assert exits == []
    clock.now += 5
    second(signal.SIGINT)
    assert exits == [128 + signal.SIGINT]
    (record,) = [r for r in caplog.records if "stopping now" in r.getMessage()]
    assert "received SIGINT, a second stop request: stopping now" in record.getMessage()
    assert "the last complete checkpoint is step 20" in record.getMessage()


def test_no_checkpoint_yet_is_said_and_other_ranks_stay_quiet(tmp_path, caplog, monkeypatch):
    exits, clock = [], Clock()
    second = interrupts.SecondSignal(
        tmp_path, complete_steps, exit=exits.append, clock=clock, is_main=True
    )
    second(signal.SIGTERM)
    clock.now += 1
    second(signal.SIGTERM)
    assert exits == [143] and "no complete checkpoint yet" in caplog.text
    caplog.clear()
    quiet = interrupts.SecondSignal(
        tmp_path, complete_steps, exit=exits.append, clock=clock, is_main=False
    )
    quiet(signal.SIGTERM)
    clock.now += 1
    quiet(signal.SIGTERM)
    assert exits == [143, 143] and caplog.text == ""


def test_the_flag_hands_every_signal_to_the_second_signal_check(tmp_path):
    exits = []
    second = interrupts.SecondSignal(tmp_path, complete_steps, exit=exits.append)
    before = signal.getsignal(signal.SIGINT)
    with preemption.PreemptionFlag(second) as flag:
        os.kill(os.getpid(), signal.SIGINT)  # would raise KeyboardInterrupt if not handled
        assert flag.received == signal.SIGINT and exits == []
        time.sleep(interrupts.SAME_EVENT_S + 0.1)
        os.kill(os.getpid(), signal.SIGTERM)
        assert exits == [143]
    assert signal.getsignal(signal.SIGINT) == before


def test_training_stops_at_once_on_the_second_sigterm(tmp_path):
    """End to end, one rank: the first signal waits (the next agreement step is far away), the
    second ends the process within seconds with 128 + signal and names the checkpoint."""
    sig, run_dir = signal.SIGTERM, tmp_path / "run"  # what Slurm and `timeout` send
    extra = ["max_steps=100000", "preempt_check_every=100000", "checkpoint_every=5"]
    ranks = Ranks([*TINY, f"run_dir={run_dir}", *extra, "log_every=1"], tmp_path / "logs", world=1)
    ranks.wait_for_step(run_dir, 12)
    ranks.send(sig)
    time.sleep(1.5)
    assert ranks.running(), "the first signal should wait for the next agreement step"
    assert "send it again to stop at once" in ranks.log(0)
    ranks.send(sig)
    started = time.monotonic()
    assert ranks.wait(timeout=30) == [128 + sig]
    assert time.monotonic() - started < 10
    log = ranks.log(0)
    newest = max(checkpoint_steps(run_dir))
    assert f"received {signal.Signals(sig).name}, a second stop request: stopping now" in log
    assert f"the last complete checkpoint is step {newest} " in log
    assert "Traceback" not in log
