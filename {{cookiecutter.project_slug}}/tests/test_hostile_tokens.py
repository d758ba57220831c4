"""Hostile token and chat files (docs/data.md#what-a-dataset-may-hold): each number of a token
index.json checked against the files before any work proportional to it, a chat template bounded
in time and output, bad chat lines in one line naming them; a directory export refused a file
name. Each case ends within seconds in one line, without a traceback (test_hostile_data.py:
what every dataset's index.json is checked for)."""

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from conftest import one_line
from test_hostile_data import ends_within, mutated_index

from {{ cookiecutter.package_name }}.cli import main
from {{ cookiecutter.package_name }}.data import kinds
from {{ cookiecutter.package_name }}.data.directory import DatasetError, sample_sha256


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


# --- exports ----------------------------------------------------------------------------------


@pytest.mark.parametrize("form", ["peft", "hf"])
def test_a_directory_export_to_a_file_name_is_refused(tmp_path, capsys, form):
    out = tmp_path / "adapters.safetensors"
    assert main(["export", f"run_dir={tmp_path / 'run'}", "--format", form, "--out", str(out)]) == 2
    assert f"export --format {form} writes a directory" in one_line(capsys)
    assert not out.exists()
