"""Hugging Face data in: make-dataset --hf (parquet, JSONL) with a tokenizer trained here,
uint16/uint32 shards, determinism across worker counts, interrupted writes, and a tiny GPT trained
on BPE shards that resumes under another spelling of the dataset path and samples text.
Nothing comes from the network: every dataset and tokenizer is made in the test."""

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tokenizers", reason="needs the [data] extra: pip install -e '.[data]'")
pytest.importorskip("datasets", reason="needs the [data] extra: pip install -e '.[data]'")
pa = pytest.importorskip("pyarrow", reason="installed with datasets")
import pyarrow.parquet as pq  # noqa: E402
from _language import TINY_GPT  # noqa: E402
from conftest import PACKAGE, REPO, TIMEOUT_S, clean_env  # noqa: E402

from {{ cookiecutter.package_name }}.cli import main  # noqa: E402
from {{ cookiecutter.package_name }}.data import tokenizer  # noqa: E402
from {{ cookiecutter.package_name }}.data.directory import DatasetError  # noqa: E402
from {{ cookiecutter.package_name }}.data.tokens import TokenDataset  # noqa: E402
from {{ cookiecutter.package_name }}.make_dataset import hf_datasets  # noqa: E402
from {{ cookiecutter.package_name }}.make_dataset.tokenizer import train_tokenizer  # noqa: E402

WORDS = "alps cluster node train token shard lustre model batch step the a of and".split()


def documents(n=80, seed=0):
    rng = np.random.default_rng(seed)
    docs = []
    for i in range(n):
        words = rng.choice(WORDS, size=int(rng.integers(20, 120)))
        docs.append(f"Dokument {i}: " + " ".join(words) + ". Grüezi ☃\n")
    return docs


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """The same documents as a folder of two parquet files, a JSONL file and a text file."""
    root = tmp_path_factory.mktemp("corpus")
    docs = documents()
    (root / "pq").mkdir()
    half = len(docs) // 2
    for part, chunk in enumerate((docs[:half], docs[half:])):
        table = pa.table({"text": chunk, "id": list(range(len(chunk)))})
        pq.write_table(table, root / "pq" / f"part-{part}.parquet")
    with open(root / "docs.jsonl", "w") as f:
        for doc in docs:
            f.write(json.dumps({"content": doc}) + "\n")
    (root / "corpus.txt").write_text("".join(docs))
    return root, docs


@pytest.fixture(scope="module")
def bpe(corpus):
    root, _ = corpus
    size = train_tokenizer([root / "corpus.txt"], 300, root / "tokenizer.json")
    assert 257 < size <= 300
    return root / "tokenizer.json"


@pytest.fixture(autouse=True)
def offline(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))


def small(**options):
    return {"min_val_tokens": 200, "shard_tokens": 1000, "progress_every_s": 0.0, **options}


def test_parquet_and_jsonl_give_the_same_bpe_shards(corpus, bpe, tmp_path, capsys):
    root, docs = corpus
    index = hf_datasets.write_hf_dataset(root / "pq", bpe, tmp_path / "a", **small())
    assert (index["dtype"], index["tokenizer"], index["vocab_size"]) == (
        "uint16",
        "huggingface",
        300,
    )
    assert index["document_end"] == 0  # <|endoftext|>, train-tokenizer's id 0
    assert (
        all(f["tokens"] <= 1000 for f in index["train"]["files"])
        and len(index["train"]["files"]) > 1
    )
    # every document's ids, each followed by the separator, in the source's order
    tok, _ = tokenizer.load_tokenizer(bpe)
    expected = [i for d in docs for i in [*tok.encode(d, add_special_tokens=False).ids, 0]]
    data = TokenDataset.open(tmp_path / "a")
    assert np.concatenate(data.train + data.val).tolist() == expected
    for entry, shard in zip(index["train"]["files"], data.train, strict=True):
        assert entry["max_id"] == int(np.asarray(shard).max())
    assert data.tokenizer_file == tmp_path / "a" / "tokenizer.json"
    assert data.tokenizer_file.read_bytes() == bpe.read_bytes()
    err = capsys.readouterr().err
    assert f"of {len(docs)} documents (100%)" in err and "tokens/s" in err and "ETA" in err
    jsonl = hf_datasets.write_hf_dataset(
        root / "docs.jsonl", bpe, tmp_path / "b", column="content", **small()
    )
    assert jsonl["fingerprint"] == index["fingerprint"]
    assert tokenizer.TextCodec(tok).decode(expected[: expected.index(0) + 1]) == (
        docs[0] + "<|endoftext|>"
    )


def run_cli(args, cwd, **env):
    environment = {**os.environ, "PYTHONPATH": str(REPO / "src"), "HF_HUB_OFFLINE": "1", **env}
    return subprocess.run(
        [sys.executable, "-m", PACKAGE, *map(str, args)],
        cwd=cwd,
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_shards_do_not_depend_on_the_number_of_workers(corpus, bpe, tmp_path):
    root, _ = corpus
    # batches of 8 documents on 2 threads here, of 64 on 1 thread in a new process
    # (the tokenizer's thread pool is sized once per process)
    here = hf_datasets.write_hf_dataset(
        root / "pq", bpe, tmp_path / "w2", workers=2, batch_documents=8
    )
    out = tmp_path / "w1"
    args = ["make-dataset", "--hf", root / "pq", "--tokenizer", bpe, "--out", out, "--workers", 1]
    done = run_cli(args, tmp_path, HF_HOME=str(tmp_path / "hf"))
    assert done.returncode == 0, done.stderr
    assert json.loads((out / "index.json").read_text())["fingerprint"] == here["fingerprint"]
    assert {p.name: p.read_bytes() for p in (tmp_path / "w2").glob("*.bin")} == {
        p.name: p.read_bytes() for p in out.glob("*.bin")
    }


def test_a_vocabulary_above_65536_gets_uint32_shards(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<|endoftext|>": 0, "[UNK]": 1, **{f"w{i}": 69_990 + i for i in range(10)}}
    vocab.update({f"filler{i}": 2 + i for i in range(100)})
    big = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    big.pre_tokenizer = pre_tokenizers.Whitespace()
    big.save(str(tmp_path / "big.json"))
    rows = [" ".join(f"w{(i * 7 + k) % 10}" for k in range(30)) for i in range(40)]
    pq.write_table(pa.table({"text": rows}), tmp_path / "big.parquet")
    index = hf_datasets.write_hf_dataset(
        tmp_path / "big.parquet", tmp_path / "big.json", tmp_path / "ds", **small()
    )
    assert (index["dtype"], index["vocab_size"]) == ("uint32", 70_000)
    assert max(f["max_id"] for f in index["train"]["files"]) == 69_999
    data = TokenDataset.open(tmp_path / "ds")
    assert data.train[0].dtype == np.dtype("<u4")
    assert (tmp_path / "ds" / "train-00000.bin").stat().st_size == 4 * index["train"]["files"][0][
        "tokens"
    ]
    x = data.train_batch(0, 0, 0, 0, batch_size=4, block_size=16)["inputs"]
    assert int(x.max()) >= 69_990 and set(x.flatten().tolist()) <= {0, *range(69_990, 70_000)}


def test_an_interrupted_run_leaves_nothing_that_looks_complete(corpus, bpe, tmp_path, monkeypatch):
    root, _ = corpus
    whole = hf_datasets.write_hf_dataset(root / "pq", bpe, tmp_path / "whole", **small())
    encode = hf_datasets.encode_batches

    def dies_after_the_first_batch(*args):
        for n, item in enumerate(encode(*args)):
            if n == 1:
                raise KeyboardInterrupt  # Ctrl-C, or scancel, mid-corpus
            yield item

    monkeypatch.setattr(hf_datasets, "encode_batches", dies_after_the_first_batch)
    with pytest.raises(KeyboardInterrupt):
        hf_datasets.write_hf_dataset(
            root / "pq", bpe, tmp_path / "ds", batch_documents=8, **small()
        )
    assert not (tmp_path / "ds").exists() and not list(tmp_path.glob(".*"))  # nor a temp dir
    monkeypatch.undo()
    # A run killed by SIGKILL leaves a hidden temp directory: never read, the rerun starts over.
    stale = tmp_path / ".ds.tmp-12345-deadbeef"
    stale.mkdir()
    (stale / "train-00000.bin").write_bytes(b"\0" * 10)
    again = hf_datasets.write_hf_dataset(root / "pq", bpe, tmp_path / "ds", **small())
    assert again["fingerprint"] == whole["fingerprint"]


def test_source_and_tokenizer_errors_are_one_line(corpus, bpe, tmp_path, capsys):
    root, _ = corpus
    cases = [
        (
            ["--hf", root / "docs.jsonl", "--tokenizer", bpe],
            "no column 'text'; its columns are ['content']",
        ),
        (["--hf", tmp_path / "none.parquet", "--tokenizer", bpe], "none.parquet: no such file"),
        (["--hf", root / "corpus.txt", "--tokenizer", bpe], "corpus.txt: unknown data file type"),
        (["--hf", root / "pq", "--tokenizer", tmp_path], "no tokenizer.json in this directory"),
        (
            ["--hf", root / "pq", "--tokenizer", root / "corpus.txt"],
            "not a readable tokenizer.json",
        ),
        (["--hf", root / "pq"], "--hf needs --tokenizer"),
        (  # parquet, JSONL (and the tokenizer's JSON) side by side: not read in part
            ["--hf", root, "--tokenizer", bpe],
            "holds .json, .jsonl, .parquet files; a folder is read as one kind",
        ),
        (
            ["--hf", root / "pq", "--tokenizer", bpe, "--separator", "<eos>"],
            "'<eos>' is not in the vocabulary",
        ),
    ]
    for args, message in cases:
        assert main(["make-dataset", *map(str, args), "--out", str(tmp_path / "ds")]) == 2, args
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "ds").exists() and not list(tmp_path.glob(".*"))
    out = str(tmp_path / "tok.json")
    for args, message in [
        (["--text", str(tmp_path / "none.txt"), "--vocab-size", "300"], "none.txt: cannot read"),
        (["--text", str(root / "corpus.txt"), "--vocab-size", "100"], "needs at least 257 ids"),
    ]:
        assert main(["train-tokenizer", *args, "--out", out]) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, err
    assert not list(tmp_path.glob("*tok.json*"))


def test_train_tokenizer_reads_what_make_dataset_reads(corpus, tmp_path, capsys):
    # it read only plain text: a parquet file was "not valid UTF-8"
    root, _ = corpus
    made = {}
    for name, source in (
        ("pq", ["--hf", str(root / "pq")]),
        ("jsonl", ["--hf", str(root / "docs.jsonl"), "--column", "content"]),
    ):
        out = tmp_path / f"{name}.json"
        assert main(["train-tokenizer", *source, "--vocab-size", "300", "--out", str(out)]) == 0
        made[name] = tokenizer.load_tokenizer(out)[0].get_vocab()
    assert made["pq"] == made["jsonl"] and 257 < len(made["pq"]) <= 300  # the same documents
    capsys.readouterr()
    bad = ["train-tokenizer", "--hf", str(root / "pq"), "--column", "nope", "--vocab-size", "300"]
    assert main([*bad, "--out", str(tmp_path / "x.json")]) == 2
    assert "no column 'nope'; its columns are ['id', 'text']" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()


def test_train_resume_under_other_path_spellings_then_sample_text(
    corpus, bpe, tmp_path, monkeypatch, single_process, capsys
):
    root, docs = corpus
    monkeypatch.chdir(tmp_path)
    assert (
        main(
            ["make-dataset", "--hf", str(root / "pq"), "--tokenizer", str(bpe), "--out", "data/bpe"]
        )
        == 0
    )
    base = [
        *TINY_GPT,
        "vocab_size=0",
        "dropout=0.0",
        "grad_accum_steps=1",
        "eval_every=0",
        "checkpoint_every=0",
        "max_steps=30",
        "run_dir=run",
    ]
    assert main(["train", *base, "dataset=data/bpe/"]) == 0
    capsys.readouterr()
    # the same data as ./data/bpe and as an absolute path: the same run (resumed at its end)
    for spelling in ("./data/bpe", str(tmp_path / "data" / "bpe")):
        assert main(["train", *base, f"dataset={spelling}"]) == 0
    log = capsys.readouterr()
    assert "RESUMING" in log.err + log.out and "config error" not in log.err
    from {{ cookiecutter.package_name }}.commands.generate import generate

    text = generate(Path("run"), "Dokument 3:", 40, temperature=0, device="cpu")
    assert text.startswith("Dokument 3:") and "\ufffd" not in text
    assert len(text) > len("Dokument 3:") + 20  # 40 BPE tokens of text, not bytes
    assert set(text.replace("<|endoftext|>", "")) <= set("".join(docs))
    # run elsewhere: the run recorded its dataset's absolute path, so its tokenizer is found
    monkeypatch.chdir(root)
    assert generate(tmp_path / "run", "Dokument 3:", 40, temperature=0, device="cpu") == text
    # the dataset moved away: one line asks for the tokenizer
    (tmp_path / "data").rename(tmp_path / "moved")
    with pytest.raises(DatasetError, match="pass --tokenizer PATH"):
        generate(tmp_path / "run", "Dokument", 5, device="cpu")
    again = generate(
        tmp_path / "run", "Dokument 3:", 40, temperature=0, device="cpu", tokenizer=bpe
    )
    assert again == text
    (tmp_path / "moved").rename(tmp_path / "data")
    # the dataset directory remade (here: its fingerprint changed): its tokenizer may not be
    # the run's any more, so neither generate nor the HF export takes it on trust
    monkeypatch.chdir(tmp_path)
    index = json.loads(Path("data/bpe/index.json").read_text())
    index["fingerprint"] = "0" * 64
    Path("data/bpe/index.json").write_text(json.dumps(index))
    with pytest.raises(DatasetError, match="no longer holds the data the run trained on"):
        generate(Path("run"), "Dokument", 5, device="cpu")
    assert (
        generate(Path("run"), "Dokument 3:", 40, temperature=0, device="cpu", tokenizer=bpe) == text
    )
    capsys.readouterr()
    assert main(["export", "run_dir=run", "--format", "hf", "--out", "hf"]) != 0
    assert "no longer holds the data the run trained on" in capsys.readouterr().err
    assert not Path("hf").exists()


def test_the_data_benchmark_prints_one_json_line(corpus, bpe, capsys):
    from {{ cookiecutter.package_name }}.make_dataset import benchmark as data_benchmark

    root, docs = corpus
    assert data_benchmark.main(["--hf", str(root / "pq"), "--tokenizer", str(bpe)]) == 0
    (line,) = capsys.readouterr().out.splitlines()
    result = json.loads(line)
    tok, _ = tokenizer.load_tokenizer(bpe)
    assert result["tokens"] == sum(
        len(tok.encode(d, add_special_tokens=False).ids) + 1 for d in docs
    )
    for key in ("pipeline_tokens_per_s", "encode_batch_tokens_per_s", "peak_rss_mib"):
        assert result[key] > 0
    assert result["ratio"] == pytest.approx(  # the line rounds the ratio to 3 decimals
        result["pipeline_tokens_per_s"] / result["encode_batch_tokens_per_s"], abs=5e-4
    )


def test_the_readme_own_corpus_commands_work_word_for_word(corpus, tmp_path):
    """The README's "Your own corpus" commands as written, in a scratch directory holding the
    repository's configs/, the corpus as my.txt and its parquet folder as data/raw/mycorpus: a
    tokenizer, a BPE dataset, a run of configs/tiny.toml on it, and text sampled from it."""
    root, _ = corpus
    readme = (REPO / "README.md").read_text()
    block = readme.split("## Your own corpus and tokenizer", 1)[1]
    block = block.split("```bash\n", 1)[1].split("```", 1)[0]
    (tmp_path / "configs").symlink_to(REPO / "configs")
    (tmp_path / "my.txt").write_text((root / "corpus.txt").read_text())
    (tmp_path / "data" / "raw").mkdir(parents=True)
    (tmp_path / "data" / "raw" / "mycorpus").symlink_to(root / "pq")
    commands = [shlex.split(line, comments=True) for line in block.splitlines()]
    commands = [c for c in commands if c and c[0] != "pip"]  # the extras are installed here
    assert [c[:3] for c in commands] == [["python", "-m", PACKAGE]] * len(commands)
    for command in commands:
        done = subprocess.run(
            [sys.executable, *command[1:]], cwd=tmp_path, env=clean_env(),
            capture_output=True, text=True, timeout=TIMEOUT_S,
        )  # fmt: skip
        assert done.returncode == 0, (command, done.stderr[-2000:])
    assert (tmp_path / "runs" / "mine" / "checkpoints").is_dir()
    assert done.stdout.startswith("Once upon a time")
