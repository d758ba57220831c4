"""`generate`: its arguments and tokenizers are checked in one line, its text streams as it is
sampled, and Ctrl-C keeps what was printed."""

import json
import signal
import subprocess
import sys
import time

import pytest
import torch
from _language import TINY_GPT
from conftest import PACKAGE, REPO, clean_env, one_line
from test_error_boundary import argparse_error

from {{ cookiecutter.package_name }}.cli import main
from {{ cookiecutter.package_name }}.commands import parse


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A GPT trained for two steps on synthetic tokens (vocabulary 256: bytes)."""
    run = tmp_path_factory.mktemp("generate") / "run"
    args = [*TINY_GPT, "max_steps=2", "checkpoint_every=2", "eval_every=0", f"run_dir={run}"]
    assert main(["train", *args]) == 0
    return run


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--temperature", "nan"], "--temperature: expects a finite number, got 'nan'"),
        (["--temperature", "inf"], "--temperature: expects a finite number, got 'inf'"),
        (["--tokens", "1000000000"], "1 <= --tokens <= 100000; got 1000000000"),
        (["--top-k", "0"], "--top-k >= 1; got 0"),
    ],
)
def test_bad_arguments_are_one_line(capsys, run_dir, args, expected):
    try:
        status = main(["generate", f"run_dir={run_dir}", "--prompt", "x", *args])
        said = one_line(capsys)
    except SystemExit as refused:  # argparse's own: its usage, then the one line, exit 2
        status, said = refused.code, capsys.readouterr().err.strip().splitlines()[-1]
    assert status == 2
    assert expected in said


def word_level(tmp_path, size: int, unknown: bool):
    """A WordLevel tokenizer.json of `size` ids ('a', 'b', ...; with [UNK] when `unknown`)."""
    models = pytest.importorskip("tokenizers", reason="needs the [data] extra").models
    from tokenizers import Tokenizer, pre_tokenizers

    vocab = {f"w{i}": i for i in range(size - unknown)}
    if unknown:
        vocab["[UNK]"] = size - 1
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]" if unknown else None))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    path = tmp_path / f"wordlevel-{size}-{unknown}.json"
    tokenizer.save(str(path))
    return path


def test_a_tokenizer_that_cannot_encode_the_prompt_is_one_line(capsys, run_dir, tmp_path):
    tokenizer = word_level(tmp_path, 100, unknown=False)
    args = ["--prompt", "zebra", "--tokenizer", str(tokenizer)]
    assert main(["generate", f"run_dir={run_dir}", *args]) == 2
    err = capsys.readouterr().err
    assert f"the tokenizer {tokenizer} cannot encode the prompt: WordLevel error" in err
    assert "Traceback" not in err


def test_a_tokenizer_with_more_ids_than_the_model_is_refused(capsys, run_dir, tmp_path):
    tokenizer = word_level(tmp_path, 300, unknown=True)
    args = ["--prompt", "w1", "--tokenizer", str(tokenizer)]
    assert main(["generate", f"run_dir={run_dir}", *args]) == 2
    err = capsys.readouterr().err
    assert "the tokenizer has 300 ids but the model was trained on 256" in err


def test_another_tokenizer_of_the_same_size_is_warned_about(run_dir, tmp_path):
    tokenizer = word_level(tmp_path, 256, unknown=True)
    args = ["--prompt", "w1", "--tokens", "3", "--tokenizer", str(tokenizer), "--device", "cpu"]
    proc = subprocess.run(
        [sys.executable, "-m", PACKAGE, "generate", f"run_dir={run_dir}", *args],
        cwd=REPO,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    warning = f"{tokenizer} is not the tokenizer the run was trained with (byte tokens"
    assert warning in proc.stderr and "Traceback" not in proc.stderr
    assert proc.stdout.startswith("w1")  # the text alone on stdout


def test_text_streams_and_ctrl_c_keeps_it(run_dir):
    """Output appears while sampling goes on; SIGINT ends it with the text kept and one line."""
    args = ["--prompt", "abc", "--tokens", "100000", "--device", "cpu"]
    proc = subprocess.Popen(
        [sys.executable, "-m", PACKAGE, "generate", f"run_dir={run_dir}", *args],
        cwd=REPO,
        env=clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        # as from a terminal: a pytest-xdist worker ignores SIGINT, and a child would inherit it
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    first = proc.stdout.read(8)  # arrives before the 100,000 tokens are done
    assert first.startswith(b"abc")
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert len(first + out) > 8
    assert err.decode().strip().splitlines() == [
        f"python -m {PACKAGE} generate: stopped (Ctrl-C); the text above is what was sampled"
    ]


def test_generate_equals_the_streamed_text(run_dir):
    from {{ cookiecutter.package_name }}.commands.generate import generate, stream

    pieces = list(stream(run_dir, "abc", 20, temperature=0.9, device="cpu", seed=3))
    assert pieces[0] == "abc" and len(pieces) > 2
    assert "".join(pieces) == generate(run_dir, "abc", 20, temperature=0.9, device="cpu", seed=3)
    json.dumps(pieces)  # plain strings


@pytest.mark.parametrize(
    "argv",
    [
        ["generate", "run_dir=runs/a", "--tokens", "5"],
        ["generate", "--tokens", "5", "run_dir=runs/a"],
    ],
)
def test_generate_takes_run_dir_key_value_anywhere(argv, capsys):
    """test_cli_style.py's argument style, for generate."""
    assert parse(argv).run.as_posix() == "runs/a"
    assert capsys.readouterr().err == ""


def test_generate_has_one_spelling_of_the_run_directory(capsys):
    with pytest.raises(SystemExit) as exit_:
        parse(["generate", "runs/a", "--tokens", "5"])
    assert exit_.value.code == 2
    assert "run_dir=DIR" in capsys.readouterr().err


# ------------------------------------------------------------- test_error_boundary.py's cases


def test_generate_refuses_an_empty_prompt_in_one_line(capsys, tmp_path):
    assert main(["generate", f"run_dir={tmp_path}", "--prompt", ""]) == 2
    assert "--prompt of at least one character" in one_line(capsys)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is usable here")
def test_generate_on_cuda_without_a_gpu_is_one_line(capsys, tmp_path):
    assert main(["generate", f"run_dir={tmp_path}", "--prompt", "x", "--device", "cuda"]) == 2
    assert "--device cuda: no GPU is usable here" in one_line(capsys)


def test_generate_names_a_run_dir_that_does_not_exist(capsys, tmp_path):
    """Bad input, as for evaluate: exit 2."""
    missing = tmp_path / "no-such-run"
    assert main(["generate", f"run_dir={missing}", "--prompt", "x"]) == 2
    assert f"{missing} does not exist" in one_line(capsys)


def test_a_misspelt_generate_is_named_not_read_as_an_override(capsys):
    assert main(["generat", "run_dir=runs/a"]) == 2
    line = one_line(capsys)
    assert "unknown command 'generat' (did you mean generate?); choose from train," in line


# U+0663 ARABIC-INDIC DIGIT THREE and U+FF12 FULLWIDTH DIGIT TWO: Python's int() reads 3 and 2
@pytest.mark.parametrize(
    "argv, option, value",
    [
        (["generate", "run_dir=r", "--temperature"], "--temperature", "0.\u0663"),
        (["generate", "run_dir=r", "--top-k"], "--top-k", "\uff12"),
    ],
)
def test_generates_numeric_options_take_ascii_digits_only(capsys, argv, option, value):
    with pytest.raises(SystemExit) as exit_:
        main([*argv, value])
    assert exit_.value.code == 2
    line = argparse_error(capsys)
    assert f"error: argument {option}: " in line and repr(value) in line, line
