"""The console: the start line, the slow-CPU warning, eval lines and the closing summary."""

import logging
import re
from pathlib import Path

import torch
from conftest import TINY

from {{ cookiecutter.package_name }}.cli import main
from {{ cookiecutter.package_name }}.config.settings import Config
from {{ cookiecutter.package_name }}.telemetry import console


def messages(caplog, level="INFO"):
    return [r.getMessage() for r in caplog.records if r.levelname == level]


def test_eval_lines_and_the_closing_summary(tmp_path, single_process, capfd, monkeypatch):
    run_dir = tmp_path / "run"
    # the tiny classifier (2e4 FLOP a step) made to look slow, to see the warning come out of a
    # real run
    monkeypatch.setattr(console, "SLOW_STEP_S", 1e-6)
    monkeypatch.setattr(console, "cpu_matmul_gflops", lambda: 1e-4)
    argv = [*TINY, f"run_dir={run_dir}", "max_steps=20", "log_every=10", "eval_every=10"]
    assert main(argv) == 0
    err = capfd.readouterr().err
    assert f"training the classifier mlp to step 20 on cpu into {run_dir}" in err
    assert "WARNING this run is large for a CPU: each step needs" in err
    info = [line.split(" INFO ", 1)[1] for line in err.splitlines() if " INFO " in line]
    # the first step's line at once (log_every=10), with its epoch, its time and the run's ETA
    steps = [m for m in info if m.startswith("step ")]
    assert [m.split()[1] for m in steps] == ["1/20", "10/20", "20/20"]
    assert re.search(r"ms/step .* eta [0-9.]+ (s|min|h)$", steps[0])
    assert steps[0].startswith("step 1/20 epoch 0.01 ")  # 8 of 1000 samples a step
    evals = [m for m in info if m.startswith("eval step")]
    # TINY: 4 samples x 2 micro-steps = 8 samples per step; the held-out samples scored
    # (eval_batches=2 of 4), then the samples trained on
    eval_line = (
        r"eval step 10/20 epoch 0.08: loss [0-9.]+ \(accuracy [0-9.]+%\) over 8 held-out "
        r"samples; 80 samples trained on"
    )
    assert re.fullmatch(eval_line, evals[0]), evals[0]
    assert evals[1].endswith("160 samples trained on") and len(evals) == 2
    losses = [float(m.split("loss ")[1].split()[0]) for m in evals]
    (summary,) = [m for m in info if m.startswith("training finished at step 20")]
    assert ", 20 steps in " in summary and " samples/s overall" in summary
    best = min(losses)
    assert f"eval loss best {best:.4f} (step {10 + 10 * losses.index(best)})" in summary
    assert f"last {losses[-1]:.4f} (step 20)" in summary
    checkpoint = summary.rsplit("checkpoint ", 1)[1]
    assert Path(checkpoint) == run_dir / "checkpoints" / "step-00000020"
    assert (Path(checkpoint) / "COMPLETE.json").exists()


def test_start_line_says_what_the_run_is_about_to_do(caplog):
    caplog.set_level(logging.INFO)
    console.Console(Config(model="mlp"), True, torch.device("cpu"), 1e6, 1024, 0).start(0)
    assert (
        "training the classifier mlp to step 300 on cpu into runs/default (dataset synthetic)"
        in (messages(caplog)[0])
    )
    assert not messages(caplog, "WARNING")  # a small step: no warning


def test_a_large_preset_on_a_cpu_warns_with_the_estimated_step_time(caplog, monkeypatch):
    monkeypatch.setattr(console, "cpu_matmul_gflops", lambda: 40.0)
    flops = 12e12  # a model as large as gpt2-124m on 16 sequences of 1024 tokens
    console.Console(Config(model="mlp"), True, torch.device("cpu"), flops, 1024, 0).start(0)
    (warning,) = messages(caplog, "WARNING")
    step_s = flops / 40e9
    assert f"at least {step_s / 60:.1f} min at this CPU's measured 40 GFLOP/s" in warning
    assert "300 steps take at least" in warning and "configs/tiny.toml" in warning
    caplog.clear()
    console.Console(Config(model="mlp"), True, torch.device("cuda"), flops, 1024, 0).start(0)
    assert not messages(caplog, "WARNING")  # the same run on a GPU


def test_a_run_with_tiny_tomls_batch_is_told_its_model_is_large(caplog, monkeypatch):
    """`--config configs/tiny.toml` with a large model: the warning names the model, it does
    not send the run to the file it already uses."""
    monkeypatch.setattr(console, "cpu_matmul_gflops", lambda: 40.0)
    cfg = Config(model="mlp", batch_size=8)
    console.Console(cfg, True, torch.device("cpu"), 6 * 124e6 * 8 * 1024, 1024, 0).start(0)
    (warning,) = messages(caplog, "WARNING")
    assert "configs/tiny.toml" not in warning
    assert warning.endswith(
        "the model (mlp) makes it so at batch_size 8: for a try-out choose a "
        "smaller one, or run on a GPU node"
    )


def test_the_real_cpu_measurement_is_positive():
    assert console.cpu_matmul_gflops(size=64, repeats=2) > 0


def test_a_finished_run_started_again_says_there_is_nothing_to_train(caplog):
    """It said "training finished at step 300, 0 steps in 0.0 s, 0 samples/s overall; no
    evaluation (eval_every=0 or no eval step reached)" of a run that had evaluated."""
    caplog.set_level(logging.INFO)
    report = console.Console(Config(model="mlp"), True, torch.device("cpu"), 1e6, 1024, 300)
    report.start(4800)
    line = report.summary(300, 4800, "runs/default/checkpoints/step-00000300")
    assert line == (
        "nothing to train: the run in runs/default already finished at step 300 "
        "(max_steps=300); its evaluations are in its metrics.jsonl; checkpoint "
        "runs/default/checkpoints/step-00000300"
    )
    assert messages(caplog) == [line]  # no "training ... from step 300 to step 300" line


def test_summary_of_a_stopped_run_and_of_a_run_without_evaluation():
    report = console.Console(Config(model="mlp"), True, torch.device("cpu"), 1.0, 1, 10)
    report.start(160)
    line = report.summary(14, 224, "runs/x/checkpoints/step-00000014", "received SIGTERM")
    assert line.startswith("stopped at step 14 (received SIGTERM), 4 steps in ")
    assert "samples/s overall; no evaluation" in line
    assert line.endswith("checkpoint runs/x/checkpoints/step-00000014")
