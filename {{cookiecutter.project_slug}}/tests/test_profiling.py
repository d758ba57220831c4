"""profile_steps=START:END writes a torch.profiler trace per rank; profile_memory a snapshot."""

import json

import pytest
import torch
from conftest import TINY

from {{ cookiecutter.package_name }}.cli import main
from {{ cookiecutter.package_name }}.config.settings import ConfigError, load_config
from {{ cookiecutter.package_name }}.telemetry.profiling import StepProfiler, parse_window


def step_markers(trace_path):
    events = json.loads(trace_path.read_text())["traceEvents"]
    return {e["name"] for e in events if str(e.get("name", "")).startswith("train step ")}


def test_a_profiled_window_writes_a_trace_of_exactly_those_steps(tmp_path, single_process, capfd):
    run_dir = tmp_path / "run"
    argv = [*TINY, f"run_dir={run_dir}", "max_steps=6", "profile_steps=3:4", "profile_memory=true"]
    assert main(argv) == 0
    (trace,) = (run_dir / "profile").iterdir()
    assert trace.name == "rank0-steps3-4.trace.json"
    assert step_markers(trace) == {"train step 3", "train step 4"}
    err = capfd.readouterr().err
    assert "the CUDA memory snapshot is skipped" in err  # TINY runs on the CPU: says why
    assert "ui.perfetto.dev" in err


@pytest.mark.skipif(not torch.cuda.is_available(), reason="a CUDA memory snapshot needs a GPU")
def test_cuda_memory_snapshot(tmp_path):
    profiler = StepProfiler("1:2", True, 0, "cuda", tmp_path)
    x = torch.randn(256, 256, device="cuda")
    for step in (1, 2):
        with profiler.step(step):
            x = x @ x
    torch.cuda.synchronize()
    assert step_markers(tmp_path / "profile" / "rank0-steps1-2.trace.json")
    assert (tmp_path / "profile" / "rank0-steps1-2.memory.pickle").stat().st_size > 0


def test_a_run_ending_inside_the_window_still_writes_its_steps(tmp_path):
    profiler = StepProfiler("2:100", False, 3, "cpu", tmp_path)
    for step in (1, 2, 3):
        with profiler.step(step):
            torch.ones(8) @ torch.ones(8)
    profiler.close()  # as the training loop's `finally` does
    trace = tmp_path / "profile" / "rank3-steps2-3.trace.json"
    assert step_markers(trace) == {"train step 2", "train step 3"}
    assert [p.name for p in (tmp_path / "profile").iterdir()] == [trace.name]  # no temp files


def test_no_window_profiles_nothing(tmp_path):
    profiler = StepProfiler("", True, 0, "cpu", tmp_path)
    with profiler.step(1):
        pass
    profiler.close()
    assert not (tmp_path / "profile").exists()


@pytest.mark.parametrize("text", ["3", "4:3", "0:2", "a:b", "1:2:3", "١:٢"])
def test_bad_windows_are_config_errors(text):
    with pytest.raises(ConfigError, match="'profile_steps' expects START:END"):
        load_config(None, [f"profile_steps={text}"])
    assert parse_window("10:12") == (10, 12) and parse_window("5:5") == (5, 5)


def test_profile_memory_without_a_window_is_a_config_error():
    with pytest.raises(ConfigError, match="'profile_memory' needs profile_steps=START:END"):
        load_config(None, ["profile_memory=true"])
    assert load_config(None, ["profile_memory=true", "profile_steps=2:3"]).config.profile_memory
