"""The command line's error boundary: an expected failure ends in one line and an exit status,
never a traceback (the faults themselves are injected; their real sources are tested elsewhere)."""

import errno

import pytest
import torch

import {{ cookiecutter.package_name }}.train as train_module
from {{ cookiecutter.package_name }}.cli import main


def one_line(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


@pytest.mark.parametrize(
    "fault, expected",
    [
        (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"), "out of memory"),
        (
            RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried ..."),
            "lower batch_size",
        ),
        (
            OSError(errno.ENOSPC, "No space left on device", "/scratch/run"),
            "No space left on device: /scratch/run",
        ),
        (OSError(errno.EROFS, "Read-only file system", "/ro/x"), "Read-only file system: /ro/x"),
        (
            NotADirectoryError(errno.ENOTDIR, "Not a directory", "/run/file"),
            "Not a directory: /run/file",
        ),
    ],
)
def test_train_faults_end_in_one_line(monkeypatch, capsys, fault, expected):
    def failing(cfg):
        raise fault

    monkeypatch.setattr(train_module, "train", failing)
    assert main(["train", "run_dir=runs/x"]) == 1
    line = one_line(capsys)
    assert expected in line and line.startswith("python -m ")


def test_generate_refuses_an_empty_prompt_in_one_line(capsys, tmp_path):
    assert main(["generate", f"run_dir={tmp_path}", "--prompt", ""]) == 2
    assert "--prompt of at least one character" in one_line(capsys)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is usable here")
def test_generate_on_cuda_without_a_gpu_is_one_line(capsys, tmp_path):
    assert main(["generate", f"run_dir={tmp_path}", "--prompt", "x", "--device", "cuda"]) == 2
    assert "--device cuda: no GPU is usable here" in one_line(capsys)


def test_generate_and_export_name_a_run_dir_that_does_not_exist(capsys, tmp_path):
    missing = tmp_path / "no-such-run"
    assert main(["generate", f"run_dir={missing}", "--prompt", "x"]) == 1
    assert f"{missing} does not exist" in one_line(capsys)
    assert main(["export", f"run_dir={missing}", "--out", str(tmp_path / "m.pt")]) == 1
    assert f"{missing} does not exist" in one_line(capsys)
