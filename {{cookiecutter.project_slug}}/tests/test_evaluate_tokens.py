"""`evaluate` of language models (test_evaluate.py: of the classifier): the GPT's newest
checkpoint on a token split, its loss in bits per token and its perplexity, the whole split, its
tail included, and the same tokens and numbers on any number of ranks; `evaluate hf_model=DIR
dataset=D`: a Hugging Face directory as it is, as transformers scores it; `--print-split`: the
validation split as text."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from _language import TINY_GPT, validation_windows
from conftest import PACKAGE, REPO, TIMEOUT_S, clean_env, one_line, two_ranks

from {{ cookiecutter.package_name }}.cli import main
from {{ cookiecutter.package_name }}.config_keys import read_toml

ARGS = ["max_steps=6", "checkpoint_every=6", "eval_every=6", "eval_batches=2", "dropout=0.0"]
VAL_TOKENS = 1500  # make-dataset's validation split of 300,000 tokens: their last 0.5%


def run(*args: str, env: dict | None = None, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", PACKAGE, *args],
        cwd=cwd,
        env=env or clean_env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )


def evaluated(capsys, *args: str) -> dict:
    """evaluate's JSON line, on one rank in this process."""
    capsys.readouterr()
    assert main(["evaluate", *args]) == 0
    return json.loads(capsys.readouterr().out)


def tree(path) -> dict:
    return {p.relative_to(path).as_posix(): p.stat().st_mtime_ns for p in path.rglob("*")}


@pytest.fixture(scope="module")
def token_data(tmp_path_factory) -> Path:
    """300,000 random ids of a vocabulary of 256 (`ids.npy` beside it) as a token dataset."""
    root = tmp_path_factory.mktemp("evaluate")
    np.save(root / "ids.npy", np.random.default_rng(0).integers(0, 256, 300_000, dtype=np.uint16))
    done = run("make-dataset", "--tokens", str(root / "ids.npy"), "--vocab-size", "256",
               "--out", str(root / "data"))  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return root / "data"


@pytest.fixture(scope="module")
def trained(token_data):
    """TINY_GPT on token_data, named `dataset=data` relative to the directory it was trained in."""
    run_dir = token_data.parent / "run"
    done = run(*TINY_GPT, "dataset=data", f"run_dir={run_dir}", *ARGS, cwd=token_data.parent)
    assert done.returncode == 0, done.stderr[-2000:]
    return run_dir


def last_eval(run_dir) -> dict:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in records if r.get("kind") == "eval"][-1]


def test_the_newest_checkpoint_on_its_own_validation_split(trained, cli):
    before = tree(trained)
    done = cli("evaluate", f"run_dir={trained}", "eval_batches=2", "device=cpu")
    assert done.returncode == 0, done.stderr[-2000:]
    (line,) = done.stdout.strip().splitlines()
    result = json.loads(line)
    assert result["step"] == 6 and result["ranks"] == 1
    # the same number the run logged at its last evaluation (same batches, same weights)
    assert result["eval_loss"] == pytest.approx(last_eval(trained)["eval_loss"], rel=1e-5)
    assert result["eval_bits_per_token"] == pytest.approx(result["eval_loss"] / math.log(2))
    assert result["perplexity"] == pytest.approx(math.exp(result["eval_loss"]))
    assert tree(trained) == before  # nothing written


def test_one_and_two_ranks_score_the_whole_split_alike(trained, token_data, single_process, capsys):
    """Without eval_batches: the whole validation split, its tail included (1,499 targets: 46
    windows of 32 and one aligned to the end for the last 27), the same tokens and the same loss
    on 1 and 2 ranks; run from another directory than the run's, whose config.toml records
    the dataset's absolute path."""
    recorded = read_toml(trained / "config.toml")["dataset"]
    assert Path(recorded).is_absolute() and Path(recorded).resolve() == token_data.resolve()
    args = ["evaluate", f"run_dir={trained}", "device=cpu"]
    a = evaluated(capsys, *args[1:])
    (first, out, err), (second, out1, err1) = two_ranks([args, args])
    assert [first.returncode, second.returncode] == [0, 0], err[-2000:]
    assert "reseeded" not in err + err1  # a 1-rank run's random states: evaluate draws none
    b = json.loads(out)
    assert (a["ranks"], b["ranks"], b["step"], out1) == (1, 2, 6, "")  # rank 0 prints
    assert a["scored_tokens"] == b["scored_tokens"] == b["scoreable_tokens"] == VAL_TOKENS - 1
    assert a["split"] == "val" and "the last aligned to the shard's end" in a["scheme"]
    assert b["eval_loss"] == pytest.approx(a["eval_loss"], rel=1e-6)


@pytest.mark.parametrize(
    "args, expected",
    [
        (["n_layer=4"], "not n_layer (the model is the checkpoint's)"),
        (["dataset=synthetic", "vocab_size=512"], "not vocab_size"),
    ],
)
def test_wrong_arguments_are_one_line(trained, args, expected, cli):
    done = cli("evaluate", f"run_dir={trained}", *args)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert expected in done.stderr.strip().splitlines()[-1]


def test_a_hugging_face_directory_as_it_is_scores_as_in_transformers(
    token_data, tmp_path, single_process, capsys
):
    """The baseline of a fine-tuning run: a Llama directory's own weights on the dataset, on 1
    and 2 ranks, equal to transformers' loss on the same windows of the last 1,500 tokens."""
    transformers = pytest.importorskip("transformers", reason="needs the [hf] extra")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, vocab_size=256, max_position_embeddings=64,
    )  # fmt: skip
    model = transformers.AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0.0, 0.3)
    model.save_pretrained(tmp_path / "llama")
    args = ["evaluate", f"hf_model={tmp_path / 'llama'}", f"dataset={token_data}",
            "hf_context_length=32", "device=cpu"]  # fmt: skip
    a = evaluated(capsys, *args[1:])
    (first, out, err), _ = two_ranks([args, args])
    assert first.returncode == 0, err[-2000:]
    b = json.loads(out)
    assert a["hf_model"] == str(tmp_path / "llama") and "step" not in a
    assert a["scored_tokens"] == b["scored_tokens"] == VAL_TOKENS - 1
    ids = np.load(token_data.parent / "ids.npy")[-VAL_TOKENS:]
    windows, labels = validation_windows(ids, 32)
    with torch.no_grad():
        expected = model.eval()(input_ids=windows, labels=labels).loss.item()
    assert a["eval_loss"] == pytest.approx(expected, rel=1e-5)
    assert b["eval_loss"] == pytest.approx(expected, rel=1e-5)


def test_the_validation_split_prints_as_text(tmp_path, single_process, capsys):
    """The last 1,025 bytes of the token stream (the text, then the 0 that ends its document),
    decoded as the bytes they are (a character cut by the split's start is U+FFFD)."""
    text = "".join(f"Zeile {i}: Grüße aus den Alpen\n" for i in range(200))
    (tmp_path / "a.txt").write_text(text)
    data = tmp_path / "data"
    assert main(["make-dataset", "--text", str(tmp_path / "a.txt"), "--out", str(data)]) == 0
    capsys.readouterr()
    assert main(["evaluate", f"dataset={data}", "--print-split"]) == 0
    stream = text.encode() + b"\0"
    assert capsys.readouterr().out == stream[-1025:].decode("utf-8", errors="replace") + "\n"


def test_hf_model_without_a_dataset_is_one_line(tmp_path, single_process, capsys):
    assert main(["evaluate", f"hf_model={tmp_path}"]) == 2
    assert "evaluate hf_model=DIR needs dataset=D" in one_line(capsys)
