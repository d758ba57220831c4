"""The command line's error boundary: an expected failure ends in one line and an exit status,
never a traceback (the faults themselves are injected; their real sources are tested elsewhere)."""

import argparse
import errno
import socket
import subprocess
import sys
import time

import pytest
import torch
from conftest import PACKAGE, TINY, clean_env, one_line

import {{ cookiecutter.package_name }}.training.loop as train_module
from {{ cookiecutter.package_name }}.cli import main


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
    def failing(cfg, origins):
        raise fault

    monkeypatch.setattr(train_module, "train", failing)
    assert main(["train", "run_dir=runs/x"]) == 1
    line = one_line(capsys)
    assert expected in line and line.startswith("python -m ")


def test_export_names_a_run_dir_that_does_not_exist(capsys, tmp_path):
    """Bad input, as for evaluate: exit 2 (generate's: test_generate.py)."""
    missing = tmp_path / "no-such-run"
    assert main(["export", f"run_dir={missing}", "--out", str(tmp_path / "m.pt")]) == 2
    assert f"{missing} does not exist" in one_line(capsys)


def test_an_unknown_command_is_named_not_read_as_an_override(capsys):
    assert main(["expor", "run_dir=runs/a"]) == 2
    line = one_line(capsys)
    assert "unknown command 'expor' (did you mean export?); choose from train," in line
    assert main(["zzz"]) == 2
    assert "unknown command 'zzz'; choose from" in one_line(capsys)


@pytest.mark.parametrize("value", ["abc", "-1", "\u0663", "1.5"])  # U+0663: ARABIC-INDIC THREE
def test_a_launcher_variable_that_is_no_number_is_named(monkeypatch, capsys, value):
    monkeypatch.setenv("RANK", value)
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert main(["doctor"]) == 1  # a launch error
    assert f"RANK={value!r} is not a whole number" in one_line(capsys)


def test_an_unreachable_rendezvous_is_one_line_within_the_timeout(monkeypatch, capsys):
    with socket.socket() as s:  # a port nothing listens on: bound, never listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        for name, value in {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1"}.items():
            monkeypatch.setenv(name, value)
        monkeypatch.setenv("MASTER_PORT", str(port))
        start = time.monotonic()
        assert main(["doctor", "--timeout-s", "2"]) == 1
        assert time.monotonic() - start < 10
    assert f"could not reach the rendezvous at MASTER_ADDR=127.0.0.1 MASTER_PORT={port}" in (
        one_line(capsys)
    )


def test_rank_0_alone_at_the_rendezvous_is_one_line_within_the_timeout(
    monkeypatch, capsys, tmp_path
):
    # the other ranks never start (or were given another port): torch's store raised
    # DistStoreError with a traceback after the timeout
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for name, value in {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("MASTER_PORT", str(port))
    assert main([*TINY, f"run_dir={tmp_path / 'run'}", "dist_timeout_s=3"]) == 1
    err = capsys.readouterr().err
    line = err.strip().splitlines()[-1]
    assert "Traceback" not in err
    assert f"not every rank joined within dist_timeout_s=3 s at 127.0.0.1:{port}" in line, line
    assert "1/2 clients joined" in line


def test_plot_skips_lines_that_are_not_records_and_names_the_file(tmp_path):
    pytest.importorskip("matplotlib")
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_bytes(b'\xff{"kind": "train"}\n[1, 2]\n{"kind": "train", "step": 1}\n')
    proc = subprocess.run(
        [sys.executable, "-m", PACKAGE, "plot", f"run_dir={metrics}"],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert f"{metrics}: skipped 2 line(s) that are not JSON records" in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        f"python -m {PACKAGE} plot: error: no training records (with step and loss) in {metrics}"
    )


def argparse_error(capsys) -> str:
    """The one line of an argparse refusal: the error under the command's usage (the doctor's,
    which each rank of a job writes: the line alone), no traceback."""
    err = capsys.readouterr().err
    assert "Traceback" not in err
    usage, _, rest = err.rpartition(f"python -m {PACKAGE}")
    assert usage.startswith("usage: ") or usage == "" and " doctor: " in rest, err
    assert rest.count("\n") == 1, err
    return f"python -m {PACKAGE}{rest}".strip()


# U+0663 ARABIC-INDIC DIGIT THREE and U+FF12 FULLWIDTH DIGIT TWO: Python's int() reads 3 and 2
@pytest.mark.parametrize(
    "argv, option, value",
    [
        (["make-dataset", "--out", "d", "--samples"], "--samples", "\u0663"),
        (["make-dataset", "--out", "d", "--workers"], "--workers", "\u0663"),
        (["doctor", "--timeout-s"], "--timeout-s", "\uff12"),
        (["doctor", "--expect-busbw"], "--expect-busbw", "\u0663"),
        (["doctor", "--sizes"], "--sizes", "\u0663M"),
    ],
)
def test_a_numeric_option_takes_ascii_digits_only(capsys, argv, option, value):
    """The workloads' options: test_language_runs.py, test_generate.py, test_images.py."""
    with pytest.raises(SystemExit) as exit_:
        main([*argv, value])
    assert exit_.value.code == 2
    line = argparse_error(capsys)
    assert f"error: argument {option}: " in line and repr(value) in line, line


def test_no_option_reads_numbers_with_pythons_int_or_float():
    """Every numeric option of every command reads ASCII digits, as the config keys do."""
    from {{ cookiecutter.package_name }}.commands import COMMANDS, PROG
    from {{ cookiecutter.package_name }}.doctor.preflight import make_parser

    parsers = [make_parser()]
    for command in COMMANDS.values():
        if command.add_arguments is not None:
            parsers.append(argparse.ArgumentParser(prog=f"{PROG} {command.name}"))
            command.add_arguments(parsers[-1])
    typed = {(p.prog, a.dest): a.type for p in parsers for a in p._actions}
    assert [where for where, kind in typed.items() if kind in (int, float)] == []


@pytest.mark.parametrize(
    "argv",
    [
        ["make-dataset", "--samples", "30"],
        ["export", "run_dir=r"],
        ["plot", "run_dir=r"],
        ["compare", "run_dir=r", "run_dir=s"],
    ],
)
def test_an_output_name_too_long_is_refused_before_anything_is_made(capsys, tmp_path, argv):
    """train-tokenizer's: test_language_runs.py."""
    out = tmp_path / "new" / ("a" * 300)
    with pytest.raises(SystemExit) as exit_:
        main([*argv, "--out", str(out)])
    assert exit_.value.code == 2
    line = argparse_error(capsys)
    assert "error: argument --out: " in line and "a name of 300 bytes in it is too long" in line
    assert list(tmp_path.iterdir()) == []


def test_a_name_the_file_system_cannot_take_is_bad_input(monkeypatch, capsys):
    """ENAMETOOLONG from a path the command line gave (run_dir=, an input file): exit 2."""
    path = "/scratch/" + "a" * 300

    def failing(cfg, origins):
        raise OSError(errno.ENAMETOOLONG, "File name too long", path)

    monkeypatch.setattr(train_module, "train", failing)
    assert main(["train", "run_dir=runs/x"]) == 2
    assert f"File name too long: {path}" in one_line(capsys)
