"""Hostile files (docs/data.md#what-a-dataset-may-hold): each number of a dataset's index.json
checked against the files before any work proportional to it, a chat template bounded in time
and output, bad input files and weights files in one line naming them. Each case ends within
seconds in one line, without a traceback."""

import hashlib
import io
import json
import os
import shutil
import signal
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from conftest import one_line

from {{ cookiecutter.package_name }}.cli import main
from {{ cookiecutter.package_name }}.config_keys import ConfigError
from {{ cookiecutter.package_name }}.data import kinds
from {{ cookiecutter.package_name }}.data.augmentation import AugmentationKeys
from {{ cookiecutter.package_name }}.data.directory import DatasetError, sample_sha256


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
def tokens(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("tokens")
    (root / "a.txt").write_text("the quick brown fox jumps over the lazy dog. " * 200)
    assert main(["make-dataset", "--text", str(root / "a.txt"), "--out", str(root / "ds")]) == 0
    return root / "ds"


def first_shard(change):
    return lambda index: change(index["train"]["files"][0])


@pytest.mark.parametrize(
    "name, change, expected",
    [
        ("1e9 blocks", first_shard(lambda e: e.update(sampled_blocks=1e9)), "sampled_blocks"),
        ("2**40 blocks", first_shard(lambda e: e.update(sampled_blocks=2**40)), "not in 1 to 64"),
        ("a path out", first_shard(lambda e: e.update(name="/etc/passwd")), "not a file name"),
        ("a path up", first_shard(lambda e: e.update(name="../ds/x.bin")), "not a file name"),
        ("true blocks", first_shard(lambda e: e.update(sampled_blocks=True)), "sampled_blocks"),
    ],
)
def test_an_index_number_is_checked_before_the_work_it_asks_for(
    tokens, tmp_path, capsys, name, change, expected
):
    directory = mutated_index(shutil.copytree(tokens, tmp_path / "ds"), change)
    with ends_within(60):  # seconds on a busy machine; without the check, hours
        assert main(["evaluate", f"dataset={directory}", "--print-split"]) == 2
    line = one_line(capsys)
    assert "dataset error" in line and expected in line, line


@pytest.mark.parametrize(
    "text, expected",
    [
        ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
        ('{"format": "tokens/1", "dtype": "uint16", "vocab_size": Infinity}', "malformed index"),
    ],
)
def test_an_index_json_python_cannot_hold_is_one_line(tokens, tmp_path, capsys, text, expected):
    directory = shutil.copytree(tokens, tmp_path / "ds")
    (directory / "index.json").write_text(text)
    assert main(["evaluate", f"dataset={directory}", "--print-split"]) == 2
    assert expected in one_line(capsys)


def test_an_index_json_that_is_a_fifo_is_one_line_not_a_wait(tokens, tmp_path, capsys):
    """Reading a FIFO waits for a writer for ever: the command hung at its first open."""
    directory = shutil.copytree(tokens, tmp_path / "ds")
    (directory / "index.json").unlink()
    os.mkfifo(directory / "index.json")
    assert main(["evaluate", f"dataset={directory}", "--print-split"]) == 2
    assert "not a regular file (a directory, a FIFO or a device)" in one_line(capsys)


# --- chat datasets: the conversations' lengths, JSONL lines, the template's bounds --------------


@pytest.fixture(scope="module")
def chat_files(tmp_path_factory):
    pytest.importorskip("transformers", reason="needs the [hf] extra")
    from test_chat import char_tokenizer, conversations, write_jsonl

    root = tmp_path_factory.mktemp("chat")
    source = write_jsonl(root / "talks.jsonl", [{"messages": t} for t in conversations(40)])
    return char_tokenizer(root / "tokenizer"), source


def make_chat(chat_files, out: Path, source: Path | None = None, template: Path | None = None):
    tokenizer, talks = chat_files
    argv = ["make-dataset", "--chat", str(source or talks), "--tokenizer", str(tokenizer)]
    argv += ["--chat-template", str(template)] if template else []
    return main([*argv, "--out", str(out)])


def rewrite_lengths(directory: Path, first: list[int]) -> None:
    path = directory / "train-lengths.bin"
    lengths = np.fromfile(path, "<u4")
    lengths[: len(first)] = first
    lengths.tofile(path)
    entry = json.loads((directory / "index.json").read_text())["train"]["files"]["lengths"]
    digest = sample_sha256(path, entry["bytes"], entry["sampled_blocks"])
    mutated_index(directory, lambda i: i["train"]["files"]["lengths"].update(sample_sha256=digest))


@pytest.mark.parametrize(
    "first, expected",
    [([0], "conversation 0 has no tokens"), ([2**32 - 1], "add up to"), ([1, 1], "add up to")],
)
def test_chat_lengths_are_checked_against_the_tokens_at_open(chat_files, tmp_path, first, expected):
    assert make_chat(chat_files, tmp_path / "ds") == 0
    rewrite_lengths(tmp_path / "ds", first)
    spec = SimpleNamespace(context_length=lambda cfg: 512)
    with pytest.raises(DatasetError, match=expected):
        kinds.KINDS["chat"].open(tmp_path / "ds", SimpleNamespace(), spec)


def test_a_byte_order_mark_is_read_and_bad_lines_name_file_and_line(chat_files, tmp_path, capsys):
    lines = chat_files[1].read_bytes().splitlines(keepends=True)
    bom = tmp_path / "bom.jsonl"
    bom.write_bytes(b"\xef\xbb\xbf" + b"".join(lines))
    assert make_chat(chat_files, tmp_path / "ds", bom) == 0
    capsys.readouterr()
    for name, bad, expected in [
        ("latin1", '{"prompt": "caf\xe9", "completion": "x"}\n'.encode("latin-1"), "not UTF-8"),
        ("nested", b"[" * 100_000 + b"]" * 100_000 + b"\n", "not a JSON line (nested too deeply"),
    ]:
        source = tmp_path / f"{name}.jsonl"
        source.write_bytes(b"".join(lines[:3]) + bad + b"".join(lines[3:]))
        assert make_chat(chat_files, tmp_path / name, source) == 2
        line = one_line(capsys)
        assert f"{source}:4: {expected}" in line, line
        assert not (tmp_path / name).exists()


# a ChatML template behind a prelude that never ends or grows without bound (written with [ ]
# for Jinja's braces: a generated file holds no Jinja delimiters)
CHATML = (
    "[% for m in messages %][[ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' ]]"
    "[% endfor %][% if add_generation_prompt %][[ '<|im_start|>assistant\\n' ]][% endif %]"
)
HOSTILE = {
    "nested loops": "[% for i in range(99999) %][% for j in range(99999) %]"
    "[% endfor %][% endfor %]",
    "a billion x": "[[ 'x' * 10**9 ]]",  # 1 GB: beyond the memory bound the test sets
    "growing output": "[% for i in range(3000) %][[ 'y' * 1000 ]][% endfor %]",  # 3 MB: fast
}


@pytest.mark.parametrize("name", HOSTILE)
def test_a_chat_template_is_bounded_in_time_and_output(
    chat_files, tmp_path, capsys, monkeypatch, name
):
    from {{ cookiecutter.package_name }}.make_dataset import chat_worker

    if name != "growing output":  # found by its size, within the default time on a busy machine
        monkeypatch.setattr(chat_worker, "RENDER_SECONDS", 2.0)
    monkeypatch.setattr(chat_worker, "RENDER_MEMORY", 2**28)  # 256 MiB over the process's
    template = tmp_path / "hostile.jinja"
    template.write_text((HOSTILE[name] + CHATML).translate(str.maketrans("[]", "{}")))
    with ends_within(60):  # 2 s and the process's end; without the bound, for ever
        assert make_chat(chat_files, tmp_path / "ds", template=template) == 2
    line = one_line(capsys)
    assert f"dataset error: {template}: " in line, line
    bound = {"nested loops": "more than 2 s", "a billion x": "needed more than 0.3 GiB of "
             "memory", "growing output": "characters, more than"}[name]  # fmt: skip
    assert bound in line, line
    assert not (tmp_path / "ds").exists()


@pytest.mark.parametrize("name", ["nested loops", "growing output"])
def test_generate_chat_renders_a_datasets_template_within_the_same_bounds(
    chat_files, tmp_path, monkeypatch, name
):
    """`generate --chat` puts the message in the chat template of the dataset's tokenizer:
    code from a directory, rendered with make-dataset's bounds."""
    from {{ cookiecutter.package_name }}.commands.generate import chat_prompt
    from {{ cookiecutter.package_name }}.make_dataset import chat_worker

    monkeypatch.setattr(chat_worker, "RENDER_SECONDS", 2.0)
    monkeypatch.setattr(chat_worker, "RENDER_CHARS", 100_000)  # the growing one writes 3 MB
    tokenizer = shutil.copytree(chat_files[0], tmp_path / "tokenizer")
    (tokenizer / "chat_template.jinja").write_text(
        (HOSTILE[name] + CHATML).translate(str.maketrans("[]", "{}"))
    )
    with ends_within(60), pytest.raises(DatasetError) as refused:
        chat_prompt("How high is the Matterhorn?", tokenizer)
    bound = "more than 2 s" if name == "nested loops" else "characters, more than 100000"
    assert str(refused.value).startswith(f"{tokenizer}: its chat template: "), refused.value
    assert bound in str(refused.value)
    (tokenizer / "chat_template.jinja").write_text(CHATML.translate(str.maketrans("[]", "{}")))
    prompt, _ = chat_prompt("How high is the Matterhorn?", tokenizer)
    assert prompt.endswith("How high is the Matterhorn?<|im_end|>\n<|im_start|>assistant\n")


# --- images: train-index.npy -----------------------------------------------------------------


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    pytest.importorskip("torchvision", reason="needs the [vision] extra")
    from test_images import image_folder

    from {{ cookiecutter.package_name }}.make_dataset.images import write_image_dataset

    root = tmp_path_factory.mktemp("images")
    write_image_dataset(image_folder(root / "folder", per_class=3), root / "ds", workers=1)
    return root / "ds"


def with_length(length: int, offset: int | None = None):
    def change(records):
        records = records.copy()
        records["length"][0] = length
        records["offset"][0] = records["offset"][0] if offset is None else offset
        return records

    return change


@pytest.mark.parametrize(
    "change, expected",
    [
        (with_length(-5), "record 0 has a length of no bytes"),
        (with_length(0), "record 0 has a length of no bytes"),
        (with_length(2**62, 2**62), "record 0 lies outside its shard"),  # the sum overflows
        (lambda records: np.array([{"a": 1}], dtype=object), "not an array of records"),
        (lambda records: records.reshape(-1, 1), "not the records of make-dataset --images"),
        (lambda records: np.arange(len(records)), "not the records of make-dataset --images"),
    ],
)
def test_image_records_are_checked_at_open(images, tmp_path, change, expected):
    directory = shutil.copytree(images, tmp_path / "ds")
    buffer = io.BytesIO()
    np.save(buffer, change(np.load(directory / "train-index.npy")), allow_pickle=True)
    (directory / "train-index.npy").write_bytes(buffer.getvalue())
    digest = "sha256:" + hashlib.sha256(buffer.getvalue()).hexdigest()
    mutated_index(directory, lambda index: index["train"].update(sha256=digest))
    cfg = SimpleNamespace(image_size=16, **vars(AugmentationKeys()))
    with pytest.raises(DatasetError, match=expected):
        kinds.KINDS["images"].open(directory, cfg, None)


@pytest.mark.parametrize("value", ["inf", "nan", "1e999"])
def test_a_shard_size_that_is_no_finite_number_is_refused(capsys, value):
    with pytest.raises(SystemExit) as exit_:
        main(["make-dataset", "--images", "d", "--out", "o", "--shard-mb", value])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "argument --shard-mb: expects a finite number" in err, err


def test_a_negative_shard_size_is_one_line(capsys):
    assert main(["make-dataset", "--images", "d", "--out", "o", "--shard-mb", "-1"]) == 2
    assert "--shard-mb must be positive, got -1.0" in one_line(capsys)


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


@pytest.mark.parametrize("form", ["peft", "hf"])
def test_a_directory_export_to_a_file_name_is_refused(tmp_path, capsys, form):
    out = tmp_path / "adapters.safetensors"
    assert main(["export", f"run_dir={tmp_path / 'run'}", "--format", form, "--out", str(out)]) == 2
    assert f"export --format {form} writes a directory" in one_line(capsys)
    assert not out.exists()
