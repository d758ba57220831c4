"""Token datasets: the byte tokenizer, make-dataset's shards and errors, training windows."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from {{ cookiecutter.package_name }}.cli import main
from {{ cookiecutter.package_name }}.data import batches, tokens
from {{ cookiecutter.package_name }}.data.directory import (
    SAMPLE_BLOCKS,
    SAMPLE_BYTES,
    ShardFile,
    file_sha256,
    sample_blocks,
    sample_sha256,
)
from {{ cookiecutter.package_name }}.data.info import IGNORE_INDEX, DataInfo, Splits
from {{ cookiecutter.package_name }}.data.kinds import verify_files
from {{ cookiecutter.package_name }}.data.tokenizer import decode_bytes, encode_bytes
from {{ cookiecutter.package_name }}.data.tokens import DatasetError, TokenDataset, window_draws
from {{ cookiecutter.package_name }}.make_dataset import text_files as text_writer
from {{ cookiecutter.package_name }}.make_dataset import tokens as token_writer


def test_byte_tokenizer_round_trip():
    text = "def f(x):\n    return 'Grüezi ☃'\n"
    encoded = encode_bytes(text)
    assert encoded.dtype == np.uint16 and len(encoded) == len(text.encode("utf-8"))
    assert decode_bytes(encoded) == text
    assert decode_bytes(torch.tensor([104, 105, 0xC3])) == "hi\ufffd"  # cut UTF-8


def text_files(directory, contents):
    directory.mkdir(exist_ok=True)
    paths = []
    for i, text in enumerate(contents):
        paths.append(directory / f"doc{i}.txt")
        paths[-1].write_bytes(text)
    return paths


DOCS = [b"alpha " * 200, "b\u00e9ta\n".encode() * 300, bytes(range(1, 256)) * 4]


def test_text_dataset_index_shards_and_fingerprint(tmp_path):
    files = text_files(tmp_path / "src", DOCS)
    out = tmp_path / "ds"
    index = text_writer.write_text_dataset(files, out, shard_tokens=1000, min_val_tokens=300)
    assert json.loads((out / "index.json").read_text()) == index
    assert index["format"] == "tokens/1" and index["dtype"] == "uint16"
    assert (index["vocab_size"], index["tokenizer"], index["document_end"]) == (256, "bytes", 0)
    total = sum(len(d) + 1 for d in DOCS)
    assert index["train"]["tokens"] + index["val"]["tokens"] == total
    assert index["val"]["tokens"] == 300  # min_val_tokens: 0.5% would be 13
    assert [f["name"] for f in index["train"]["files"]] == [f"train-0000{i}.bin" for i in range(4)]
    assert [f["tokens"] for f in index["train"]["files"]] == [1000, 1000, 1000, total - 3300]
    assert index["sources"] == [str(f) for f in files]
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["index.json", "val-00000.bin"] + [f"train-0000{i}.bin" for i in range(4)]
    )
    # The shards hold every document's bytes, each followed by a 0 byte.
    names = [f["name"] for f in index["train"]["files"] + index["val"]["files"]]
    stream = b"".join(np.fromfile(out / n, dtype="<u2").astype(np.uint8).tobytes() for n in names)
    assert stream == b"".join(d + b"\0" for d in DOCS)

    data = TokenDataset.open(out)
    assert isinstance(data.train[0], ShardFile)
    assert (data.vocab_size, data.train_tokens, data.val_tokens) == (256, total - 300, 300)
    assert data.fingerprint == index["fingerprint"] and data.tokenizer == "bytes"

    # Same input, same fingerprint; one changed byte, another one.
    again = text_writer.write_text_dataset(
        files, tmp_path / "again", shard_tokens=1000, min_val_tokens=300
    )
    assert again["fingerprint"] == index["fingerprint"]
    files[1].write_bytes(DOCS[1].replace(b"\n", b"!", 1))
    changed = text_writer.write_text_dataset(
        files, tmp_path / "new", shard_tokens=1000, min_val_tokens=300
    )
    assert changed["fingerprint"] != index["fingerprint"]


def test_an_existing_dataset_is_kept_unless_the_new_one_is_identical(tmp_path):
    files = text_files(tmp_path / "src", DOCS)
    out = tmp_path / "ds"
    first = text_writer.write_text_dataset(files, out, min_val_tokens=300)
    before = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    assert text_writer.write_text_dataset(files, out, min_val_tokens=300) == first  # no-op
    with pytest.raises(DatasetError, match="already holds a different token dataset"):
        text_writer.write_text_dataset(files[:2], out, min_val_tokens=300)
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == before
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp dirs

    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(DatasetError, match="other: exists and is not a token dataset"):
        text_writer.write_text_dataset(files, tmp_path / "other", min_val_tokens=300)
    (tmp_path / "empty").mkdir()  # an empty directory is fine (e.g. made by a job script)
    assert text_writer.write_text_dataset(files, tmp_path / "empty", min_val_tokens=300) == first


def test_concurrent_writers_of_the_same_dataset_both_succeed(tmp_path):
    # e.g. two jobs that both found no index.json and run make-dataset at once
    files = text_files(tmp_path / "src", DOCS * 200)  # ~1 MB: the writes overlap in time
    script = (
        "import json, sys; from pathlib import Path; "
        f"from {text_writer.__name__} import write_text_dataset as w; "
        "files = [Path(a) for a in sys.argv[2:]]; "
        "print(json.dumps(w(files, Path(sys.argv[1]), min_val_tokens=300)))"
    )
    args = [sys.executable, "-c", script, str(tmp_path / "ds"), *map(str, files)]
    env = {**os.environ, "PYTHONPATH": str(Path(tokens.__file__).parents[2])}  # src/
    writers = [subprocess.Popen(args, stdout=subprocess.PIPE, env=env) for _ in range(2)]
    results = [json.loads(w.communicate(timeout=60)[0]) for w in writers]
    assert [w.returncode for w in writers] == [0, 0]
    assert results[0] == results[1] == json.loads((tmp_path / "ds" / "index.json").read_text())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds", "src"]  # no temp directories
    assert TokenDataset.open(tmp_path / "ds").fingerprint == results[0]["fingerprint"]


def test_an_interrupted_write_leaves_nothing_under_out(tmp_path, monkeypatch):
    files = text_files(tmp_path / "src", DOCS)
    write = token_writer.ShardWriter.write
    calls = []

    def dies_on_the_second_document(self, chunk):
        calls.append(len(chunk))
        if len(calls) == 2:
            raise KeyboardInterrupt  # e.g. Ctrl-C, or any error, after some shards are written
        write(self, chunk)

    monkeypatch.setattr(token_writer.ShardWriter, "write", dies_on_the_second_document)
    with pytest.raises(KeyboardInterrupt):
        text_writer.write_text_dataset(files, tmp_path / "ds", shard_tokens=500, min_val_tokens=300)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]


@pytest.mark.parametrize(
    ("name", "make", "message"),
    [
        ("empty.txt", lambda p: p.write_bytes(b""), "empty.txt: empty file"),
        ("missing.txt", lambda p: None, "missing.txt: cannot read"),
        ("folder.txt", lambda p: p.mkdir(), "folder.txt: cannot read: not a file"),
    ],
)
def test_text_errors_name_the_file_and_the_problem(tmp_path, name, make, message):
    good = text_files(tmp_path / "src", DOCS)
    make(tmp_path / name)
    with pytest.raises(DatasetError, match=message):
        text_writer.write_text_dataset([*good, tmp_path / name], tmp_path / "ds")
    assert not (tmp_path / "ds").exists()


def test_any_bytes_are_text_to_the_byte_tokenizer(tmp_path):
    latin1 = text_files(tmp_path / "src", ["café ".encode("latin-1") * 400])  # not UTF-8
    index = text_writer.write_text_dataset(latin1, tmp_path / "ds", min_val_tokens=100)
    assert index["train"]["tokens"] + index["val"]["tokens"] == 2001


def test_too_little_text_for_a_validation_split(tmp_path):
    with pytest.raises(DatasetError, match="only 41 tokens in all; need at least 2050"):
        text_writer.write_text_dataset(text_files(tmp_path / "src", [b"x" * 40]), tmp_path / "ds")


def test_token_files_from_another_tokenizer(tmp_path):
    ids = np.random.default_rng(0).integers(0, 50257, 5000).astype(np.int32)
    np.save(tmp_path / "ids.npy", ids)
    index = text_writer.write_token_dataset(
        tmp_path / "ids.npy", 50257, tmp_path / "a", min_val_tokens=500
    )
    assert (index["vocab_size"], index["tokenizer"], index["document_end"]) == (
        50257,
        "external",
        None,
    )
    ids.astype("<u2").tofile(tmp_path / "ids.bin")
    again = text_writer.write_token_dataset(
        tmp_path / "ids.bin", 50257, tmp_path / "b", min_val_tokens=500
    )
    assert again["fingerprint"] == index["fingerprint"]
    data = TokenDataset.open(tmp_path / "a")
    assert np.array_equal(np.concatenate(data.train + data.val), ids)


def test_token_files_above_65536_ids_become_uint32_shards(tmp_path):
    ids = np.random.default_rng(0).integers(0, 128_256, 5000)  # Llama 3's vocabulary
    np.save(tmp_path / "ids.npy", ids)
    index = text_writer.write_token_dataset(
        tmp_path / "ids.npy", 128_256, tmp_path / "a", min_val_tokens=500
    )
    assert index["dtype"] == "uint32" and (tmp_path / "a" / "val-00000.bin").stat().st_size == 2000
    assert max(f["max_id"] for f in index["train"]["files"] + index["val"]["files"]) == ids.max()
    data = TokenDataset.open(tmp_path / "a")
    assert np.array_equal(np.concatenate(data.train + data.val), ids)
    ids.astype("<u4").tofile(tmp_path / "ids.bin")  # raw uint32 above 65536
    again = text_writer.write_token_dataset(
        tmp_path / "ids.bin", 128_256, tmp_path / "b", min_val_tokens=500
    )
    assert again["fingerprint"] == index["fingerprint"]
    # the same ids under another vocabulary size are other data
    small = text_writer.write_token_dataset(
        tmp_path / "ids.npy", 2**17, tmp_path / "c", min_val_tokens=500
    )
    assert small["fingerprint"] != index["fingerprint"]


@pytest.mark.parametrize(
    ("array", "vocab", "message"),
    [
        (np.array([1, 70000, 3] * 1000), 2**32 + 1, "vocab_size 4294967297 is not in 1 to"),
        (np.array([1, 70000, 3] * 1000), 65536, "token 70000 at position 1 is outside"),
        (np.array([5, 6, 256] * 1000), 256, r"token 256 at position 2 is outside \[0, vocab_"),
        (np.array([5, -1, 6] * 1000), 256, "token -1 at position 1"),
        (np.zeros((10, 300), dtype=np.int64), 256, "need a 1-D array of integer tokens"),
        (np.zeros(3000, dtype=np.float32), 256, "need a 1-D array of integer tokens"),
        (np.zeros(0, dtype=np.int64), 256, "ids.npy: empty file"),
    ],
)
def test_token_file_errors(tmp_path, array, vocab, message):
    np.save(tmp_path / "ids.npy", array)
    with pytest.raises(DatasetError, match=message) as err:
        text_writer.write_token_dataset(
            tmp_path / "ids.npy", vocab, tmp_path / "ds", min_val_tokens=500
        )
    assert "ids.npy" in str(err.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ids.npy"]


def test_token_file_unreadable_or_of_unknown_type(tmp_path):
    with pytest.raises(DatasetError, match="nothing.npy: cannot read"):
        text_writer.write_token_dataset(tmp_path / "nothing.npy", 256, tmp_path / "ds")
    (tmp_path / "ids.txt").write_text("1 2 3")
    with pytest.raises(DatasetError, match="ids.txt: unknown token file type"):
        text_writer.write_token_dataset(tmp_path / "ids.txt", 256, tmp_path / "ds")
    (tmp_path / "odd.bin").write_bytes(b"abc")
    with pytest.raises(DatasetError, match="odd.bin: odd number of bytes"):
        text_writer.write_token_dataset(tmp_path / "odd.bin", 256, tmp_path / "ds")
    (tmp_path / "text.npy").write_text("not numpy")
    with pytest.raises(DatasetError, match="text.npy: not a readable .npy array"):
        text_writer.write_token_dataset(tmp_path / "text.npy", 256, tmp_path / "ds")


def test_opening_checks_the_index_and_the_shard_sizes(tmp_path):
    with pytest.raises(DatasetError, match="index.json not found: .*make-dataset --stdlib"):
        TokenDataset.open(tmp_path)
    files = text_files(tmp_path / "src", DOCS)
    out = tmp_path / "ds"
    text_writer.write_text_dataset(files, out, min_val_tokens=300)
    index = json.loads((out / "index.json").read_text())
    (out / "index.json").write_text(json.dumps({**index, "format": "tokens/9"}))
    with pytest.raises(
        DatasetError, match="unknown dataset format 'tokens/9'; expected 'tokens/1'"
    ):
        TokenDataset.open(out)
    (out / "index.json").write_text(json.dumps(index))
    with open(out / "train-00000.bin", "r+b") as f:
        f.truncate(1000)
    with pytest.raises(DatasetError, match=r"train-00000.bin: 1000 bytes, but index.json says \d+"):
        TokenDataset.open(out)


def byte_dataset(tmp_path):
    out = tmp_path / "ds"
    text_writer.write_text_dataset(text_files(tmp_path / "src", DOCS), out, min_val_tokens=300)
    return out, json.loads((out / "index.json").read_text())


def edit_index(out, index, **changes):
    (out / "index.json").write_text(json.dumps({**index, **changes}))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda i: {"train": {"files": [], "tokens": 0}}, "lists no train files"),
        (lambda i: {"val": {"files": [], "tokens": 0}}, "lists no val files"),
        (lambda i: {"dtype": "int8"}, "unknown token dtype 'int8'; expected one of"),
        (lambda i: {"train": {"files": [{"tokens": 5}]}}, r"malformed index \(KeyError: 'name'\)"),
        (lambda i: {"vocab_size": 0}, "vocab_size 0 is not in 1 to"),
        (
            lambda i: {
                "train": {
                    **i["train"],
                    "files": [
                        *i["train"]["files"],
                        {"name": "train-00009.bin", "tokens": 9, "max_id": 1}
                        | {"sampled_blocks": 1, "sample_sha256": "sha256:0", "sha256": "sha256:0"},
                    ],
                }
            },
            "train-00009.bin: missing, but index.json lists it",
        ),
        # ids above the vocabulary: an IndexError mid-training without this check
        (
            lambda i: {"vocab_size": 200},
            r"train-00000.bin: holds token id 255, but the vocabulary .* is 200",
        ),
    ],
)
def test_a_malformed_index_is_refused_in_one_line(tmp_path, change, message):
    out, index = byte_dataset(tmp_path)
    edit_index(out, index, **change(index))
    with pytest.raises(DatasetError, match=message) as err:
        TokenDataset.open(out)
    assert "\n" not in str(err.value)


def test_training_on_ids_outside_the_vocabulary_stops_with_one_line(
    tmp_path, capsys, single_process
):
    out, index = byte_dataset(tmp_path)
    edit_index(out, index, vocab_size=200)  # DOCS hold bytes up to 255
    argv = ["train", "model=gpt", "preset=tiny", f"dataset={out}", f"run_dir={tmp_path / 'run'}"]
    assert main([*argv, "device=cpu", "max_steps=1"]) == 2
    err = capsys.readouterr().err
    (line,) = [line for line in err.splitlines() if "error" in line]
    assert "dataset error" in line and "holds token id 255" in line and "is 200" in line
    assert "Traceback" not in err
    assert not list((tmp_path / "run").glob("checkpoints/step-*")), "no checkpoint is written"


def test_a_shard_rewritten_in_place_stops_the_resume_in_one_line(tmp_path, capsys, single_process):
    # Same size, same largest id, other order: the fingerprint in index.json still matches the
    # checkpoint's, so only reading the shards again can tell (index.json's sampled blocks).
    out, _ = byte_dataset(tmp_path)
    run = ["train", "model=gpt", "preset=tiny", f"dataset={out}", f"run_dir={tmp_path / 'run'}"]
    run += ["device=cpu", "eval_every=0", "checkpoint_every=2", "max_steps=4"]
    assert main(run) == 0
    checkpoints = tmp_path / "run" / "checkpoints"
    shutil.rmtree(checkpoints / "step-00000004")  # as if stopped after step 2
    shard = out / "train-00000.bin"
    shard.write_bytes(np.roll(np.fromfile(shard, dtype=np.uint16), 7).tobytes())
    capsys.readouterr()
    assert main(run) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    (line,) = [line for line in err.splitlines() if "error" in line]
    assert f"{shard}: changed since make-dataset wrote it" in line
    assert [p.name for p in checkpoints.glob("step-*")] == ["step-00000002"]


def unsampled_bytes(size: int, blocks: int) -> np.ndarray:
    """A mask of the bytes of a file of `size` that its `blocks` sampled blocks do not read."""
    mask = np.ones(size, dtype=bool)
    span = max(size - SAMPLE_BYTES, 0)
    for k in range(blocks):
        start = span * k // max(blocks - 1, 1)
        mask[start : start + SAMPLE_BYTES] = False
    return mask


def test_shards_changed_where_the_samples_do_not_look_stop_a_training_start(
    tmp_path, capsys, single_process
):
    """Defect 11 of issue 41: most tokens of a shard changed outside its 64 sampled blocks (the
    open's check passes) trained and resumed silently. Every training start, new or resumed
    (the same check, before a checkpoint loads), hashes every shard in full against
    index.json's sha256: refused in one line naming the shard."""
    ids = np.random.default_rng(0).integers(1, 256, 2**21, dtype=np.uint16)  # 4 MiB of tokens
    np.save(tmp_path / "ids.npy", ids)
    out = tmp_path / "ds"
    text_writer.write_token_dataset(tmp_path / "ids.npy", 256, out)
    shard = out / "train-00000.bin"
    entry = json.loads((out / "index.json").read_text())["train"]["files"][0]
    data = np.fromfile(shard, dtype=np.uint8)
    unsampled = unsampled_bytes(len(data), entry["sampled_blocks"])
    data[unsampled & (np.arange(len(data)) % 2 == 0)] ^= 1  # low bytes: ids stay below 256
    shard.write_bytes(data.tobytes())
    assert unsampled.mean() > 0.7  # 3/4 of the tokens changed
    TokenDataset.open(out)  # the sampled blocks do not see it
    run = ["train", "preset=tiny", "vocab_size=256", f"dataset={out}", "device=cpu"]
    assert main([*run, "max_steps=2", f"run_dir={tmp_path / 'run'}"]) == 2
    err = capsys.readouterr().err
    (line,) = [line for line in err.splitlines() if "error" in line]
    assert f"{shard}: changed since make-dataset wrote it (its sha256 differs" in line
    assert "Traceback" not in err and not list((tmp_path / "run").glob("checkpoints/step-*"))


def test_each_rank_hashes_its_share_of_the_shards(tmp_path):
    """Rank r of w hashes the r-th, (r+w)-th, ... file: the work is split, and the rank whose
    share holds the changed file names it (every rank then stops with its line, all_gather)."""
    files = {}
    for i in range(3):
        (tmp_path / f"train-{i}.bin").write_bytes(bytes([i]) * 1000)
        files[tmp_path / f"train-{i}.bin"] = file_sha256(tmp_path / f"train-{i}.bin")
    (tmp_path / "train-1.bin").write_bytes(bytes([9]) * 1000)
    source = Splits(None, None, DataInfo("tokens", "sha256:x"), files=files)
    verify_files(source, 0, 2)  # files 0 and 2: unchanged
    with pytest.raises(DatasetError, match=r"train-1.bin: changed since make-dataset wrote it"):
        verify_files(source, 1, 2)
    (tmp_path / "train-2.bin").unlink()
    with pytest.raises(DatasetError, match=r"train-2.bin: cannot read: No such file"):
        verify_files(source, 0, 2)


def test_the_sampled_blocks_cost_the_same_for_any_dataset_size(tmp_path):
    # about SAMPLE_BLOCKS reads of SAMPLE_BYTES, one more per shard at most
    for sizes in ([10], [2**29] * 4, [2**29] * 3 + [12345], [2**30] * 1000):
        counts = sample_blocks(sizes)
        assert all(c >= 1 for c in counts)
        assert sum(counts) <= SAMPLE_BLOCKS + len(sizes)
    path = tmp_path / "shard.bin"
    data = bytearray(3 * 2**20)
    path.write_bytes(data)
    before = sample_sha256(path, len(data), 64)
    data[-1] = 1  # the last block is sampled, and so is the first
    path.write_bytes(data)
    assert sample_sha256(path, len(data), 64) != before


@pytest.mark.parametrize("field", ["sample_sha256", "sha256"])
def test_an_index_without_sample_hashes_is_refused_in_one_line(tmp_path, field):
    out, index = byte_dataset(tmp_path)
    del index["val"]["files"][0][field]
    edit_index(out, index)
    with pytest.raises(DatasetError, match="records no sample hashes for val-00000.bin"):
        TokenDataset.open(out)


def test_a_shard_cut_short_under_a_live_run_is_named_not_a_sigbus(tmp_path):
    # With memmapped shards the next batch touching the missing pages ended the process with
    # SIGBUS and no message; here a subprocess, so that the old code fails instead of crashing.
    out, _ = byte_dataset(tmp_path)
    code = (
        "import os, sys\n"
        "from {{ cookiecutter.package_name }}.data.tokens import DatasetError, TokenDataset, window_draws\n"
        f"data = TokenDataset.open({str(out)!r})\n"
        f"os.truncate({str(out / 'train-00000.bin')!r}, 64)\n"
        "try:\n"
        "    for step in range(20):\n"
        "        data.train_batch(0, step, 0, 0, 8, 64)\n"
        "except DatasetError as err:\n"
        "    print(err)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert done.stdout.startswith(f"{out / 'train-00000.bin'}: ends before token ")
    assert "was cut short while this run read it" in done.stdout


def test_an_id_outside_the_vocabulary_in_a_batch_names_its_shard(tmp_path):
    # a change where the sampled blocks did not look: refused when a batch reads it, not an
    # IndexError inside the embedding
    path = tmp_path / "train-00000.bin"
    ids = np.arange(1000, dtype=np.uint16) % 200
    ids[500] = 300
    ids.tofile(path)
    shard = np.memmap(path, dtype=np.uint16, mode="r")
    assert tokens.gather([shard], np.array([0, 100]), 65, 256).shape == (2, 65)
    with pytest.raises(DatasetError, match=r"train-00000.bin: holds token id 300, but the vocab"):
        tokens.gather([shard], np.array([0, 480]), 65, 256)


def test_resume_compares_datasets_by_fingerprint_not_path_spelling(caplog):
    from {{ cookiecutter.package_name }}.config.resume import check_resume
    from {{ cookiecutter.package_name }}.config.settings import Config, ConfigError, config_record

    saved = config_record(Config(dataset="data/x/"))
    for spelling in ("./data/x", "/abs/data/x", "data/x"):
        check_resume(saved, Config(dataset=spelling), 1, 1, "sha256:aa", "sha256:aa")
    with pytest.raises(ConfigError, match="dataset contents: fingerprint sha256:aa -> sha256:bb"):
        check_resume(saved, Config(dataset="data/x/"), 1, 1, "sha256:aa", "sha256:bb")
    with pytest.raises(ConfigError, match="dataset: 'data/x/' -> 'data/y'"):
        check_resume(saved, Config(dataset="data/y"), 1, 1, "sha256:aa", "sha256:bb")
    forced = Config(dataset="data/y", force_resume=True, lr=1e-3)
    check_resume(saved, forced, 1, 1, "sha256:aa", "sha256:bb")
    (warning,) = [r.getMessage() for r in caplog.records if "force_resume" in r.getMessage()]
    assert "overrides 3 resume check(s)" in warning
    assert "dataset: 'data/x/' -> 'data/y'" in warning and "lr: 0.0006 -> 0.001" in warning


def counting_dataset(tmp_path, n=30000, shard_tokens=4096) -> TokenDataset:
    """Token i is i: a token's value is its position in the stream."""
    np.save(tmp_path / "ids.npy", np.arange(n))
    text_writer.write_token_dataset(
        tmp_path / "ids.npy", 2**16, tmp_path / "ds", shard_tokens=shard_tokens, min_val_tokens=2000
    )
    return TokenDataset.open(tmp_path / "ds")


def test_windows_are_a_function_of_seed_step_rank_and_micro_step(tmp_path):
    data = counting_dataset(tmp_path)
    keys = [(0, 5, 0, 0), (0, 5, 1, 0), (0, 5, 0, 1), (0, 6, 0, 0), (1, 5, 0, 0)]
    forward = [data.window_starts(*k, batch_size=8, block_size=16) for k in keys]
    backward = [data.window_starts(*k, batch_size=8, block_size=16) for k in reversed(keys)]
    for a, b in zip(forward, reversed(backward), strict=True):
        assert a.dtype == np.int64 and np.array_equal(a, b)
    assert len({tuple(s) for s in forward}) == len(keys)  # each key draws other windows
    (tmp_path / "copy").mkdir()
    reopened = counting_dataset(tmp_path / "copy")  # another process, e.g. after a restart
    assert np.array_equal(reopened.window_starts(0, 5, 0, 0, 8, 16), forward[0])


def test_window_draws_are_uniform_and_one_call_equals_one_per_key():
    keys = [(step, micro) for step in range(500) for micro in range(2)]
    draws = window_draws(1234, keys, 3, 100, 1000)
    assert draws.dtype == np.int64 and draws.min() >= 0 and draws.max() < 1000
    counts = np.bincount(draws, minlength=1000)  # 100 expected per value
    assert abs(counts - 100).max() < 60 and 8 < counts.std() < 12  # binomial: sd 9.95
    one_by_one = np.concatenate([window_draws(1234, [key], 3, 100, 1000) for key in keys[:20]])
    assert np.array_equal(draws[:2000], one_by_one)
    assert not np.array_equal(window_draws(1234, keys[:1], 4, 100, 1000), draws[:100])  # rank
    huge = window_draws(2**32 - 1, [(10**12, 7)], 0, 1000, 2**40)  # no overflow, full range
    assert huge.min() >= 0 and huge.max() < 2**40 and huge.max() > 2**39


def test_targets_are_the_inputs_shifted_by_one_and_windows_stay_in_a_shard(tmp_path):
    data = counting_dataset(tmp_path, shard_tokens=100)
    starts = np.concatenate(
        [data.window_starts(0, step, 0, 0, batch_size=64, block_size=20) for step in range(50)]
    )
    assert np.array_equal(starts // 100, (starts + 20) // 100)  # start and last token: one shard
    assert len(np.unique(starts % 100)) == 80  # every in-shard start occurs, and no other
    batch = data.train_batch(0, 7, 0, 0, batch_size=64, block_size=20)
    assert batch.keys() == {"inputs", "targets"}  # the one form of a language model's batch
    x, y = batch["inputs"], batch["targets"]
    assert x.shape == y.shape == (64, 20) and x.dtype == y.dtype == torch.int64
    expected = torch.from_numpy(data.window_starts(0, 7, 0, 0, 64, 20))[:, None] + torch.arange(20)
    assert torch.equal(x, expected) and torch.equal(y, x + 1)


def scored_targets(split, batch_size: int, world: int, max_batches=None) -> list[list[int]]:
    """Each rank's scored targets (token i is i: its position), checking every batch."""
    sets = [batches.eval_batches(split, batch_size, r, world, max_batches) for r in range(world)]
    assert len({len(s.chunks) for s in sets}) == 1  # as many forward passes on every rank
    per_rank = []
    for eval_set in sets:
        targets = []
        for index, batch in enumerate(eval_set):
            assert batch.keys() == {"inputs", "targets"}  # the training windows' form
            x, y = batch["inputs"], batch["targets"]
            scored = y != IGNORE_INDEX
            assert torch.equal(y[scored], (x + 1)[scored])  # the next token, scored or not
            if index < eval_set.scored:  # the rest only keep the ranks in step
                targets += y[scored].tolist()
        per_rank.append(targets)
    return per_rank


def test_validation_windows_score_every_token_once_on_any_number_of_ranks(tmp_path):
    data = counting_dataset(tmp_path, shard_tokens=1000)  # val: the last 2000 tokens, 2 shards
    split = tokens.token_splits(data, None, SimpleNamespace(context_length=lambda cfg: 96))
    # Windows of 97 tokens every 96: 10 per val shard, scoring its tokens 1 to 960, and one
    # aligned to its end for the last 39: 22 in all. A shard's first token has no context.
    assert len(split.val) == 22 and split.val.scoreable == 2 * 999
    every = [*range(28001, 29000), *range(29001, 30000)]
    for world in (1, 2, 3):
        per_rank = scored_targets(split, 4, world)
        assert sorted(t for targets in per_rank for t in targets) == every  # each once
    assert scored_targets(split, 4, 3) == scored_targets(split, 4, 3)  # fixed
    # eval_batches=2: 8 of the 22 windows, spread evenly, the same on 1 and 3 ranks
    sample = scored_targets(split, 4, 1, max_batches=2)[0]
    assert sorted(sum(scored_targets(split, 4, 3, max_batches=2), [])) == sorted(sample)
    assert min(sample) < 28100 and max(sample) == 29999
    # a shard shorter than a window is one window, its padding not scored
    long = tokens.token_splits(data, None, SimpleNamespace(context_length=lambda cfg: 1500))
    assert len(long.val) == 2
    assert sorted(sum(scored_targets(long, 1, 2), [])) == every


def test_synthetic_tokens(tmp_path):
    data = TokenDataset.synthetic(vocab_size=1000, tokens=50000, seed=3)
    assert (data.vocab_size, data.train_tokens, data.val_tokens) == (1000, 50000, 1025)
    x = data.train_batch(0, 0, 0, 0, 8, 64)["inputs"]
    assert x.shape == (8, 64) and 0 <= int(x.min()) and int(x.max()) < 1000
    same = TokenDataset.synthetic(1000, 50000, seed=3)
    assert torch.equal(same.train_batch(0, 0, 0, 0, 8, 64)["inputs"], x)
    assert TokenDataset.synthetic(1000, 50000, seed=4).fingerprint != data.fingerprint


def test_stdlib_sources_exist_offline():
    files = text_writer.stdlib_files()
    assert len(files) > 100 and files == sorted(files)
    assert sum(f.stat().st_size for f in files) > 3_000_000
    assert all(f.suffix == ".py" and f.stat().st_size > 0 for f in files)
    assert not [f for f in files if {"test", "tests", "site-packages"} & set(f.parts)]
