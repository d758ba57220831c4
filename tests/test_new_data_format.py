"""A user's own input format for make-dataset in one module and one line (docs/data.md of the
generated repo, "Your own input format").

The module and the registry line are copied out of the docs page itself into a copy of a baked
repository; no other file of the package is touched. The new option then writes a dataset whose
tokens are exactly the file's ids, a GPT trains on it, and its bad inputs are one line each.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from user_code import add_from_docs, python


@pytest.fixture(scope="module")
def user_repo(bake, tmp_path_factory) -> tuple[Path, str]:
    """A copy of the default bake with the docs' source module and registry line added."""
    repo = tmp_path_factory.mktemp("own-format") / "repo"
    return repo, add_from_docs(
        bake("default"), repo, "data.md", "make_dataset/id_lines.py", "make_dataset/sources.py",
        '"hf_datasets",',
    )  # fmt: skip


def test_a_format_in_one_module_writes_a_dataset_a_gpt_trains_on(user_repo, tmp_path):
    repo, package = user_repo
    rng = np.random.default_rng(0)
    documents = [rng.integers(0, 299, size=rng.integers(50, 400)) for _ in range(40)]
    ids = tmp_path / "ids.txt"
    ids.write_text("".join(" ".join(map(str, doc)) + "\n" for doc in documents))
    out = tmp_path / "mine"

    assert "--id-lines" in python(repo, package, "make-dataset", "--help").stdout
    made = python(
        repo, package, "make-dataset", "--id-lines", str(ids), "--id-vocab", "300",
        "--id-end", "299", "--out", str(out),
    )  # fmt: skip
    assert f"train with dataset={out}" in made.stdout
    index = json.loads((out / "index.json").read_text())
    assert (index["vocab_size"], index["document_end"]) == (300, 299)
    shards = [out / f["name"] for f in index["train"]["files"] + index["val"]["files"]]
    written = np.concatenate([np.fromfile(s, dtype=index["dtype"]) for s in shards])
    expected = np.concatenate([np.append(doc, 299) for doc in documents])
    assert np.array_equal(written, expected), "the shards are not the file's ids, in order"

    trained = python(
        repo, package, "device=cpu", "model=gpt", "preset=tiny", "n_embd=32", "block_size=32",
        f"dataset={out}", "batch_size=4", "max_steps=3", "warmup_steps=1", "eval_every=3",
        "eval_batches=1", "checkpoint_every=0", "async_checkpoint=false", "num_workers=0",
        f"run_dir={tmp_path / 'run'}",
    )  # fmt: skip
    assert "training finished at step 3" in trained.stderr

    # its bad inputs: one line each, exit 2, nothing written
    bad = tmp_path / "bad.txt"
    for text, args, message in [
        ("1 2 3\n4 ٣ 5\n", ["--id-vocab", "300"], "bad.txt:2: not a line of ids below 300"),
        ("1 2 300\n", ["--id-vocab", "300"], "bad.txt:1: not a line of ids below 300"),
        ("1 2 3\n", [], "--id-lines needs --id-vocab"),
        ("1 2 3\n", ["--id-vocab", "300", "--id-end", "-1"], "--id-end -1 is not an id below"),
        ("1 2 3\n", ["--id-vocab", str(2**40)], f"vocab_size {2**40} is not in 1 to"),
    ]:
        bad.write_text(text)
        target = tmp_path / "not-written"
        result = python(
            repo, package, "make-dataset", "--id-lines", str(bad), *args, "--out", str(target),
            check=False,
        )  # fmt: skip
        assert result.returncode == 2, (text, args, result.stderr[-2000:])
        (line,) = result.stderr.strip().splitlines()
        assert message in line, line
        assert not target.exists()
        assert not [p for p in tmp_path.iterdir() if p.name.startswith(".not-written")]
