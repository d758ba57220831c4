"""Command line: benchmark JSON line, plots, metrics records."""

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import PACKAGE, TIMEOUT_S, TINY, clean_env
from torch.utils._python_dispatch import TorchDispatchMode

from {{ cookiecutter.package_name }}.cli import main
from {{ cookiecutter.package_name }}.config.settings import load_config
from {{ cookiecutter.package_name }}.distributed import DistEnv
from {{ cookiecutter.package_name }}.models import spec_of
from {{ cookiecutter.package_name }}.telemetry.metrics import Metrics, plot_series, read_records


def test_benchmark_prints_one_json_line(single_process, capsys):
    assert main(["benchmark", *TINY, "bench_warmup=2", "bench_steps=10"]) == 0
    out, err = capsys.readouterr()
    lines = out.strip().splitlines()
    assert len(lines) == 1
    result = json.loads(lines[0])
    # and in words, on stderr
    ratio = f"ratio {result['ratio']:.3f}: the package's training step is "
    assert ratio in err and "than a bare PyTorch loop" in err
    assert ("within the target" in err) == (round(result["ratio"], 3) <= 1.03)  # as printed
    for key in (
        "train_step_median_s",
        "train_samples_per_s",
        "bare_step_median_s",
        "bare_samples_per_s",
        "ratio",
        "gflop_per_step_and_rank",
    ):
        assert result[key] > 0
    assert 0 <= result["data_wait_fraction"] < 1
    assert result["steps"] == 10 and result["world_size"] == 1 and result["model"] == "mlp"
    assert result["dataset"] == "synthetic" and "inline_baseline" not in result  # token windows'
    assert "bare: one batch already on the device" in result["baseline"]
    # one round (a block of each loop); the ratios are of this process's CPU time per step
    assert result["clock"] == "process CPU time" and 0 < result["cpu_share"] <= 1.05
    # the package's step includes the non-finite check's part (TINY: log_every=1)
    assert result["non_finite_check"] == "loss and gradient norm, read every 1 steps"
    blocks = result["blocks"]
    assert sorted(blocks) == ["bare", "train"] and len(blocks["train"]) == 1
    assert result["ratio"] == pytest.approx(blocks["train"][0] / blocks["bare"][0])
    assert "compile_on" not in result  # compared only on GPU unless asked
    assert "checkpoint_sync_stall_s" not in result  # likewise


def test_the_benchmark_ratio_pairs_the_blocks_of_each_round():
    """The load rose between the package's and the bare loop's block of round 3: the medians of
    each loop's blocks fall in different load phases (1.02 / 2.0), the rounds' ratios do not."""
    from {{ cookiecutter.package_name }}.telemetry.timing import paired_ratio, round_quartiles

    package, bare = [1.02, 1.02, 1.02, 2.04, 2.04], [1.0, 1.0, 2.0, 2.0, 2.0]
    assert paired_ratio(package, bare) == pytest.approx(1.02)
    assert round_quartiles(package, bare) == pytest.approx([1.02, 1.02])
    assert round_quartiles([1.1], [1.0]) == pytest.approx([1.1, 1.1])  # one round


def test_the_benchmark_sentence_names_a_slow_input_and_judges_the_ratio_as_printed():
    from {{ cookiecutter.package_name }}.commands.benchmark import verdict

    slow_input = verdict({"ratio": 1.39, "device": "cpu", "data_wait_fraction": 0.21})
    assert "the package's step waited 21% of its time for its input" in slow_input
    assert "fixed cost per step" not in slow_input
    small_model = verdict({"ratio": 1.10, "device": "cpu", "data_wait_fraction": 0.01})
    assert "fixed cost per step" in small_model and "waited" not in small_model
    assert "(within the target of 1.03)" in verdict({"ratio": 1.0304, "device": "cuda:0"})
    assert "ratio 1.030:" in verdict({"ratio": 1.0304, "device": "cuda:0"})


def test_on_a_shared_cpu_the_benchmark_compares_cpu_time(single_process, capsys, monkeypatch):
    """Other processes on the cores slow the wall clock, not this process's CPU time: the
    ratios use the latter, and the sentence says how long others held the cores."""
    wall_clock = time.perf_counter
    monkeypatch.setattr(time, "process_time", lambda: 0.6 * wall_clock())  # 40 % to others
    assert main(["benchmark", *TINY, "bench_warmup=1", "bench_steps=25"]) == 0
    out, err = capsys.readouterr()
    result = json.loads(out)
    assert result["clock"] == "process CPU time" and result["steps"] == 30  # whole blocks, up
    assert result["cpu_share"] == pytest.approx(0.6, rel=0.01)
    cpu_median = statistics.median(result["blocks"]["train"])
    assert cpu_median == pytest.approx(0.6 * result["train_step_median_s"], rel=0.01)
    train, bare = result["blocks"]["train"], result["blocks"]["bare"]
    assert len(train) == 3 and result["ratio"] == pytest.approx(
        statistics.median(t / b for t, b in zip(train, bare, strict=True))
    )
    assert "other processes held the cores 40% of the time" in err


def test_benchmark_times_sync_and_async_checkpoint_saves(tmp_path, single_process, capsys):
    run_dir = tmp_path / "run"
    argv = [*TINY, f"run_dir={run_dir}", "bench_warmup=1", "bench_steps=5", "bench_checkpoint=true"]
    assert main(["benchmark", *argv]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["checkpoint_gib"] > 0
    for mode in ("sync", "async"):
        assert 0 < result[f"checkpoint_{mode}_stall_s"] <= result[f"checkpoint_{mode}_write_s"]
    fraction = result["checkpoint_async_stall_s"] / result["checkpoint_sync_write_s"]
    assert result["checkpoint_async_stall_fraction"] == pytest.approx(fraction)
    assert not run_dir.exists()  # measured, then removed, with the run directory it made


def test_metrics_records_and_plot(tmp_path, single_process, capsys):
    run_dir = tmp_path / "run"
    assert (
        main(
            [
                *TINY,
                f"run_dir={run_dir}",
                "max_steps=30",
                "log_every=10",
                "eval_every=15",
                "grad_accum_steps=2",
            ]
        )
        == 0
    )
    records = read_records(run_dir)
    train = [r for r in records if r["kind"] == "train"]
    assert [r["step"] for r in train] == [1, 10, 20, 30]  # the first step's at once
    for key in (
        "loss",
        "epoch",
        "samples_seen",
        "samples_per_s",
        "samples_per_s_per_rank",
        "step_time_s",
        "data_wait_s",
        "peak_mem_gib",
        "eta_s",
        "lr",
    ):
        assert key in train[0]
    assert train[0]["samples_per_s"] > 0 and train[-1]["eta_s"] == 0
    assert [r["samples_seen"] for r in train] == [8, 80, 160, 240]  # 4 x 2 micro-steps a step
    for record in train:  # the share of a step spent waiting for input
        assert record["data_wait_fraction"] == record["data_wait_s"] / record["step_time_s"]
    assert [r["step"] for r in records if r["kind"] == "eval"] == [15, 30]
    assert any(r["kind"] == "checkpoint" and r["stall_s"] > 0 for r in records)

    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert main(["plot", str(run_dir)]) == 1
        assert "matplotlib" in capsys.readouterr().err
    else:
        out = tmp_path / "m.png"
        assert main(["plot", str(run_dir / "metrics.jsonl"), "--out", str(out)]) == 0
        assert out.read_bytes()[:4] == b"\x89PNG"
        # --out a directory: the plot goes into it, and the line says where
        folder = tmp_path / "plots"
        folder.mkdir()
        assert main(["plot", f"run_dir={run_dir}", "--out", str(folder)]) == 0
        assert f"wrote {folder / 'metrics.png'}" in capsys.readouterr().out
        assert (folder / "metrics.png").read_bytes()[:4] == b"\x89PNG"
        assert main(["plot", f"run_dir={run_dir}", "--out", str(tmp_path / "m.txt")]) == 1
        assert "not an image format" in capsys.readouterr().err
        assert sorted(p.name for p in tmp_path.iterdir()) == ["m.png", "plots", "run"]


def test_plot_draws_the_tasks_evaluation_figures():
    """A classifier's accuracy and top-5 in a panel of their own, its eval loss beside the
    training loss; a language model's figures (bits per token: its loss restated) are not."""
    train = [{"kind": "train", "step": s, "loss": 2.0 / s, "images_per_s": 90.0} for s in (1, 2)]
    evals = [
        {"kind": "eval", "step": 2, "epoch": 1.0, "eval_loss": 0.9, "eval_acc": 0.6,
         "eval_top5": 0.9, "eval_bits_per_token": 1.3},
        {"kind": "checkpoint", "step": 2, "stall_s": 0.1},
    ]  # fmt: skip
    panels = plot_series([{"kind": "start", "step": 0}, *train, *evals])
    assert list(panels) == ["loss", "evaluation", "images/s (all ranks)"]
    assert panels["loss"] == {"train": ([1, 2], [2.0, 1.0]), "eval": ([2], [0.9])}
    assert panels["evaluation"] == {"accuracy": ([2], [0.6]), "top-5": ([2], [0.9])}
    language = plot_series(
        [*train, {"kind": "eval", "step": 2, "eval_loss": 1, "eval_bits_per_token": 2}]
    )
    assert "evaluation" not in language and language["loss"]["eval"] == ([2], [1])


def test_help_lists_the_subcommands(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for name in ("train", "benchmark", "doctor", "make-dataset", "export", "plot"):
        assert name in out


def test_commands_that_do_not_train_start_without_distributed_checkpointing(tmp_path):
    """doctor, make-dataset and --help run on every node or often: they do not import torch's
    distributed checkpointing (about a second a process), which only training needs."""
    probe = (
        "import sys\n"
        "from {{ cookiecutter.package_name }}.cli import main\n"
        "for argv in (['--help'], ['doctor', '--help'], ['make-dataset', '--help']):\n"
        "    try:\n"
        "        main(argv)\n"
        "    except SystemExit:\n"
        "        pass\n"
        "print(sorted(m for m in sys.modules if m.startswith('torch.distributed.checkpoint')))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    proc = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "[]", proc.stdout[-2000:]


# The packages only the dataset writers use (the [data] extra); the writers are make_dataset/.
WRITER_PACKAGES = {"datasets", "tokenizers"}


def test_train_imports_no_dataset_writer(tmp_path):
    """Only the chosen command's parser and modules load: `train` reads datasets and never
    imports the modules that write them (the commands table builds one command's parser)."""
    argv = ["train", *TINY, "max_steps=1", f"run_dir={tmp_path / 'run'}"]
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", PACKAGE, *argv],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=TIMEOUT_S,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    imported = {  # "import time: self [us] | cumulative | name", the name indented by depth
        line.rpartition("|")[2].strip()
        for line in proc.stderr.splitlines()
        if line.startswith("import time:")
    }
    assert f"{PACKAGE}.training.loop" in imported  # the probe sees the package's imports
    writers = {name for name in imported if name.startswith(f"{PACKAGE}.make_dataset")}
    assert not writers | imported & WRITER_PACKAGES, sorted(writers | imported & WRITER_PACKAGES)


def test_a_collective_timeout_is_named_in_one_line(monkeypatch, capsys, caplog):
    """What a rank sees when a peer hangs (gloo's message): one ERROR line, no traceback."""
    import {{ cookiecutter.package_name }}.training.loop

    def hung_peer(cfg, origins):
        raise RuntimeError(
            "[../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting "
            "20000ms for recv operation to complete"
        )

    monkeypatch.setattr({{ cookiecutter.package_name }}.training.loop, "train", hung_peer)
    assert main([*TINY, "max_steps=1"]) == 1
    (record,) = [r for r in caplog.records if r.levelname == "ERROR"]
    assert "did not complete within dist_timeout_s" in record.getMessage()
    assert "another rank is hung or dead" in record.getMessage()
    assert record.exc_info is None  # no traceback: the cause is in the message


def test_a_rank_killed_mid_collective_is_named_in_one_line(monkeypatch, caplog):
    """What the other ranks see when one is killed (kill -9, the OOM killer): gloo's message
    ended in "ERROR failed" and a traceback; now one ERROR line naming the cause."""
    import {{ cookiecutter.package_name }}.training.loop

    def peer_killed(cfg, origins):
        raise RuntimeError(
            "[../third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:5787: "
            "Connection reset by peer. This is typically caused by a remote worker hanging or "
            "bugs in the application."
        )

    monkeypatch.setattr({{ cookiecutter.package_name }}.training.loop, "train", peer_killed)
    assert main([*TINY, "max_steps=1"]) == 1
    (record,) = [r for r in caplog.records if r.levelname == "ERROR"]
    assert record.getMessage().startswith("another rank's process ended during a collective")
    assert record.exc_info is None  # no traceback: the cause is in the message


def test_a_signal_outside_trainings_own_handlers_is_one_line(monkeypatch, capsys):
    """One Ctrl-C can arrive twice: the copy that lands after training restored the default
    handler (or one during start-up) printed KeyboardInterrupt's traceback."""
    import {{ cookiecutter.package_name }}.training.loop

    def interrupted(cfg, origins):
        raise KeyboardInterrupt

    monkeypatch.setattr({{ cookiecutter.package_name }}.training.loop, "train", interrupted)
    assert main([*TINY, "max_steps=1"]) == 130
    err = capsys.readouterr().err
    assert err == (
        f"python -m {PACKAGE} train: stopped (SIGINT); the same command resumes from its last "
        "complete checkpoint\n"
    )


def test_metrics_add_no_device_operation_per_step(tmp_path, single_process):
    """A step's loss is kept as it is and summed when a record is logged (each operation on the
    critical path costs a small model's step time); the logged mean is the same."""

    class Operations(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.seen = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.seen.append(func)
            return func(*args, **(kwargs or {}))

    cfg = load_config(None, [*TINY, f"run_dir={tmp_path}"]).config
    env = DistEnv(0, 1, 0, 1, "localhost", 0, "single")
    meter = Metrics(tmp_path, env, cfg, spec_of(cfg).task, 1e9, 128, 0)
    inputs = type("Inputs", (), {"wait_s": 0.0})()
    losses = [torch.tensor(2.0), torch.tensor(3.0), torch.tensor(7.0)]
    with Operations() as operations:
        for loss in losses:
            meter.update(loss, inputs)
    assert operations.seen == []
    assert meter.log(3, 1e-3)["loss"] == pytest.approx(4.0)
    meter.close()
