"""Hostile files (docs/data.md#what-a-dataset-may-hold): an index.json Python cannot hold or
that is no file, and weights files, in one line naming them. Each case ends within seconds in
one line, without a traceback. A token index's numbers, chat files and templates:
test_hostile_tokens.py; image records: test_hostile_images.py."""

import json
import os
import re
import shutil
import signal
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import one_line

from {{ cookiecutter.package_name }}.cli import main
from {{ cookiecutter.package_name }}.config_keys import ConfigError
from {{ cookiecutter.package_name }}.data import kinds
from {{ cookiecutter.package_name }}.data.directory import DatasetError


@contextmanager
def ends_within(seconds: float):
    """Fail the test where the code under it would hang (SIGALRM: the tests' main thread)."""

    def hung(signum, frame):
        pytest.fail(f"still running after {seconds} s: the work is not bounded")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def mutated_index(directory: Path, change) -> Path:
    index = json.loads((directory / "index.json").read_text())
    change(index)
    (directory / "index.json").write_text(json.dumps(index))
    return directory


@pytest.fixture(scope="module")
def arrays(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("arrays")
    assert main(["make-dataset", "--out", str(root / "ds"), "--samples", "300"]) == 0
    return root / "ds"


@pytest.mark.parametrize(
    "text, expected",
    [
        ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ],
)
def test_an_index_json_python_cannot_hold_is_one_line(arrays, tmp_path, capsys, text, expected):
    directory = shutil.copytree(arrays, tmp_path / "ds")
    (directory / "index.json").write_text(text)
    assert main(["evaluate", f"dataset={directory}", "--print-split"]) == 2
    assert expected in one_line(capsys)


def test_a_number_python_cannot_hold_is_a_malformed_index(arrays, tmp_path):
    """JSON's Infinity where a count belongs (Python reads a float, no integer holds it)."""
    directory = shutil.copytree(arrays, tmp_path / "ds")
    text = (directory / "index.json").read_text()
    (directory / "index.json").write_text(
        re.sub(r'"num_classes": \d+', '"num_classes": Infinity', text)
    )
    cfg = SimpleNamespace(eval_samples=100, data_on_gpu=False)
    with pytest.raises(DatasetError, match="index.json: malformed index"):
        kinds.KINDS["arrays"].open(directory, cfg, None)


def test_an_index_json_that_is_a_fifo_is_one_line_not_a_wait(arrays, tmp_path, capsys):
    """Reading a FIFO waits for a writer for ever: the command hung at its first open."""
    directory = shutil.copytree(arrays, tmp_path / "ds")
    (directory / "index.json").unlink()
    os.mkfifo(directory / "index.json")
    assert main(["evaluate", f"dataset={directory}", "--print-split"]) == 2
    assert "not a regular file (a directory, a FIFO or a device)" in one_line(capsys)


@pytest.mark.parametrize("name", ["../x.npy", "/etc/passwd", "", 7])
def test_an_arrays_index_naming_a_file_outside_its_directory_is_refused(arrays, tmp_path, name):
    """The arrays' file names in index.json are plain names inside the dataset directory, as
    the token shards' are: a path out of it is never opened."""
    directory = shutil.copytree(arrays, tmp_path / "ds")
    shutil.copy(directory / "x.npy", tmp_path / "x.npy")  # what "../x.npy" would read
    mutated_index(directory, lambda index: index["arrays"]["x"].update(file=name))
    cfg = SimpleNamespace(eval_samples=100, data_on_gpu=False)
    with pytest.raises(DatasetError, match="which is not a file name inside the dataset"):
        kinds.KINDS["arrays"].open(directory, cfg, None)


# --- weights files ---------------------------------------------------------------------------


def test_a_legacy_weights_file_loads_and_an_empty_one_is_named(tmp_path):
    from {{ cookiecutter.package_name }}.checkpoint.initial import open_weights_file

    state = {"w": torch.randn(3, 2), "b": torch.zeros(3)}
    legacy = tmp_path / "legacy.pth"
    torch.save(state, legacy, _use_new_zipfile_serialization=False)
    loaded = open_weights_file(legacy).tensors
    assert loaded.keys() == state.keys() and all(torch.equal(loaded[k], state[k]) for k in state)
    (tmp_path / "empty.pth").touch()
    with pytest.raises(ConfigError, match="an empty file"):
        open_weights_file(tmp_path / "empty.pth")
