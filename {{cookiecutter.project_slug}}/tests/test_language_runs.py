"""The GPT's cases of the shared tests (those run on conftest.py's TINY, the classifier every
training workload keeps): what only a language model has, its token windows, its presets and
sizes, its vocabulary and the tokens its lines count."""

import json
import logging
import re
from pathlib import Path

import pytest
import torch
from _language import TINY_GPT
from _layouts import assert_the_same_losses, losses_per_layout
from conftest import REPO, TINY, one_line
from test_error_boundary import argparse_error

from {{ cookiecutter.package_name }}.checkpoint import export_model
from {{ cookiecutter.package_name }}.cli import main
from {{ cookiecutter.package_name }}.config.resume import check_resume, check_run_dir_config
from {{ cookiecutter.package_name }}.config.settings import (
    Config,
    ConfigError,
    config_record,
    load_config,
    save_config,
    to_toml,
)
from {{ cookiecutter.package_name }}.models.gpt import GPTKeys
from {{ cookiecutter.package_name }}.models.mlp import MLPKeys
from {{ cookiecutter.package_name }}.telemetry import console


def test_epochs_on_token_windows_are_refused_in_one_line(tmp_path, single_process, capsys):
    """Token windows are drawn at random positions: no passes to count."""
    tiny = [item for item in TINY_GPT if not item.startswith("max_steps=")]
    argv = [*tiny, f"run_dir={tmp_path / 'run'}", "epochs=2", "eval_every=1epoch"]
    assert main(argv) == 2
    err = capsys.readouterr().err  # refused once the data is open: after the start's lines
    assert "Traceback" not in err and "epochs need a dataset of samples" in err.splitlines()[-1]
    assert "epochs=2, eval_every=1epoch: " in err.splitlines()[-1]
    assert not (tmp_path / "run").exists()  # nothing half-written


def test_another_model_or_size_on_a_gpt_run_is_refused_before_loading(
    tmp_path, single_process, capsys
):
    """Exit 2, one line with each changed key and the two ways on; no checkpoint is read (a
    GPT checkpoint loaded into another shape would end in DCP's size-mismatch text)."""
    run_dir = tmp_path / "run"
    argv = [*TINY_GPT, f"run_dir={run_dir}", "max_steps=2", "checkpoint_every=2", "eval_every=0"]
    assert main(argv) == 0

    def files() -> dict:  # every file's time and size (folders change: the lock, write probes)
        return {
            p: (p.stat().st_mtime_ns, p.stat().st_size) for p in run_dir.rglob("*") if p.is_file()
        }

    before = files()
    for changed, shown in [
        ([*argv, "n_layer=3", "n_head=4"], "n_layer: 0 -> 3; n_head: 0 -> 4"),
        ([*argv, "preset=gpt2-124m", "n_embd=0", "block_size=0"], "preset: 'tiny' -> 'gpt2-124m'"),
        ([*TINY, f"run_dir={run_dir}", "max_steps=2"], "model: 'gpt' -> 'mlp'"),
    ]:
        capsys.readouterr()
        assert main(changed) == 2
        err = capsys.readouterr().err
        (line,) = [line for line in err.splitlines() if "error" in line]
        assert shown in line and "new run_dir" in line and "restore the values" in line
        assert "Traceback" not in err and "mismatch" not in err.lower()
    assert files() == before  # no file of the run was touched


def test_an_exported_gpt_records_its_architecture_not_the_presets_zeros(tmp_path, single_process):
    """n_layer = 0 means "the preset's" in a config; the file records the model as built."""
    safetensors_torch = pytest.importorskip("safetensors.torch")
    run_dir = tmp_path / "run"
    args = [*TINY_GPT, f"run_dir={run_dir}", "max_steps=2", "checkpoint_every=2", "vocab_size=0"]
    assert main(args) == 0
    out = export_model(run_dir, tmp_path / "model.safetensors")
    with safetensors_torch.safe_open(out, "pt") as f:
        config = json.loads(f.metadata()["config"])
    built = {k: config["gpt"][k] for k in ("n_layer", "n_head", "n_embd", "block_size")}
    # tiny's 2 layers and 2 heads, TINY_GPT's width and context, the synthetic tokens' vocabulary
    assert built == {"n_layer": 2, "n_head": 2, "n_embd": 32, "block_size": 32}
    assert config["vocab_size"] == 50257
    assert config["gpt"]["preset"] == "tiny" and config["model"] == "gpt"


def test_a_full_disk_is_named_by_the_hugging_face_export(
    small_disk, tmp_path, single_process, capsys
):
    """transformers' writer on a full disk: the cause and the place in one line, nothing left."""
    run_dir = tmp_path / "run"
    assert main([*TINY_GPT, "max_steps=2", "checkpoint_every=2", f"run_dir={run_dir}"]) == 0
    capsys.readouterr()
    disk = small_disk(64)  # less than the model
    assert main(["export", f"run_dir={run_dir}", "--format", "hf", "--out", str(disk / "hf")])
    assert f"No space left on device: {disk}" in one_line(capsys)
    assert [p for p in disk.rglob("*")] == []


# --------------------------------------------------------------------------- test_console.py


def messages(caplog, level="INFO"):
    return [r.getMessage() for r in caplog.records if r.levelname == level]


def test_a_gpt_runs_eval_lines_count_tokens(tmp_path, single_process, capfd, monkeypatch):
    run_dir = tmp_path / "run"
    # the tiny GPT made to look slow, to see the warning come out of a real run
    monkeypatch.setattr(console, "SLOW_STEP_S", 1e-4)
    monkeypatch.setattr(console, "cpu_matmul_gflops", lambda: 0.01)
    argv = [*TINY_GPT, f"run_dir={run_dir}", "max_steps=20", "log_every=10", "eval_every=10"]
    assert main(argv) == 0
    err = capfd.readouterr().err
    assert f"training the language model gpt:tiny to step 20 on cpu into {run_dir}" in err
    assert "WARNING this run is large for a CPU: each step needs" in err
    info = [line.split(" INFO ", 1)[1] for line in err.splitlines() if " INFO " in line]
    # the first step's line at once (log_every=10), with its time and the run's ETA; token
    # windows have no epochs
    steps = [m for m in info if m.startswith("step ")]
    assert [m.split()[1] for m in steps] == ["1/20", "10/20", "20/20"]
    assert re.search(r"ms/step .* eta [0-9.]+ (s|min|h)$", steps[0]) and "epoch" not in steps[0]
    evals = [m for m in info if m.startswith("eval step")]
    # TINY_GPT: 4 sequences x 2 micro-steps x 32 tokens = 256 tokens per step
    # the held-out tokens scored (eval_batches=2 of 4 windows of 32, less the overlap), then
    # the tokens trained on
    eval_line = (
        r"eval step 10/20: loss [0-9.]+ \([0-9.]+ bits/token\) over [0-9]+ held-out tokens; "
        r"2.56k tokens trained on"
    )
    assert re.fullmatch(eval_line, evals[0]), evals[0]
    assert evals[1].endswith("5.12k tokens trained on") and len(evals) == 2
    losses = [float(m.split("loss ")[1].split()[0]) for m in evals]
    (summary,) = [m for m in info if m.startswith("training finished at step 20")]
    assert ", 20 steps in " in summary and " tokens/s overall" in summary
    best = min(losses)
    assert f"eval loss best {best:.4f} (step {10 + 10 * losses.index(best)})" in summary
    assert f"last {losses[-1]:.4f} (step 20)" in summary
    checkpoint = summary.rsplit("checkpoint ", 1)[1]
    assert Path(checkpoint) == run_dir / "checkpoints" / "step-00000020"
    assert (Path(checkpoint) / "COMPLETE.json").exists()


def test_start_line_says_what_the_run_is_about_to_do(caplog):
    caplog.set_level(logging.INFO)
    console.Console(Config(), True, torch.device("cpu"), 1e6, 1024, 0).start(0)
    assert (
        "training the language model gpt:gpt2-124m to step 300 on cpu into runs/default"
        in (messages(caplog)[0])
    )
    assert not messages(caplog, "WARNING")  # a small step: no warning


def test_the_gpts_start_line_names_the_language_model_and_its_preset(caplog):
    caplog.set_level(logging.INFO)
    console.Console(Config(model="gpt"), True, torch.device("cpu"), 1e6, 1024, 0).start(0)
    assert (
        "training the language model gpt:gpt2-124m to step 300 on cpu into runs/default"
        in (messages(caplog)[0])
    )
    assert not messages(caplog, "WARNING")  # a small step: no warning


def test_a_gpt_run_with_tiny_tomls_batch_is_told_its_model_is_large(caplog, monkeypatch):
    """`--config configs/tiny.toml` with a large model: the warning names the model, it does
    not send the run to the file it already uses."""
    monkeypatch.setattr(console, "cpu_matmul_gflops", lambda: 40.0)
    cfg = Config(model="gpt", batch_size=8)
    console.Console(cfg, True, torch.device("cpu"), 6 * 124e6 * 8 * 1024, 1024, 0).start(0)
    (warning,) = messages(caplog, "WARNING")
    assert "configs/tiny.toml" not in warning
    assert warning.endswith(
        "the model (gpt:gpt2-124m) makes it so at batch_size 8: for a try-out choose a "
        "smaller one, or run on a GPU node"
    )


# --------------------------------------------------------------------------- test_cli.py


def test_the_gpts_benchmark_counts_tokens_against_an_inline_loop(single_process, capsys):
    assert main(["benchmark", *TINY_GPT, "bench_warmup=2", "bench_steps=10"]) == 0
    out, err = capsys.readouterr()
    lines = out.strip().splitlines()
    assert len(lines) == 1
    result = json.loads(lines[0])
    # and in words, on stderr
    ratio = f"ratio {result['ratio']:.3f}: the package's training step is "
    assert ratio in err and "than a bare PyTorch loop" in err
    assert ("within the target" in err) == (round(result["ratio"], 3) <= 1.03)  # as printed
    for key in (
        "train_step_median_s",
        "train_tokens_per_s",
        "bare_step_median_s",
        "bare_tokens_per_s",
        "ratio",
        "gflop_per_step_and_rank",
    ):
        assert result[key] > 0
    assert 0 <= result["data_wait_fraction"] < 1
    assert result["steps"] == 10 and result["world_size"] == 1 and result["model"] == "gpt:tiny"
    assert result["dataset"] == "synthetic" and "in-memory tokens" in result["inline_baseline"]
    # one round (a block of each loop); the ratios are of this process's CPU time per step
    assert result["clock"] == "process CPU time" and 0 < result["cpu_share"] <= 1.05
    # the package's step includes the non-finite check's part (TINY_GPT: log_every=1)
    assert result["non_finite_check"] == "loss and gradient norm, read every 1 steps"
    blocks = result["blocks"]
    assert sorted(blocks) == ["bare", "inline", "train"] and len(blocks["train"]) == 1
    assert result["ratio"] == pytest.approx(blocks["train"][0] / blocks["bare"][0])
    assert "compile_on" not in result  # compared only on GPU unless asked
    assert "checkpoint_sync_stall_s" not in result  # likewise


def test_help_lists_generate(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    assert "generate" in capsys.readouterr().out


# --------------------------------------------------------------------- test_error_boundary.py


def test_a_classifier_on_token_shards_is_one_line(capsys, tmp_path):
    data = tmp_path / "bytes"
    (tmp_path / "a.txt").write_text("some text to tokenise as bytes\n" * 200)
    assert main(["make-dataset", "--text", str(tmp_path / "a.txt"), "--out", str(data)]) == 0
    capsys.readouterr()
    args = ["device=cpu", "model=mlp", f"dataset={data}", f"run_dir={tmp_path / 'run'}"]
    assert main(["train", *args]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert "holds tokens data, but model=mlp reads arrays datasets" in err.strip().splitlines()[-1]


def test_the_data_benchmark_takes_ascii_digits_only(capsys):
    from {{ cookiecutter.package_name }}.make_dataset.benchmark import main as data_benchmark

    with pytest.raises(SystemExit) as exit_:
        data_benchmark(["--synthetic-mb", "1", "--tokenizer", "t", "--rounds", "\u0663"])
    assert exit_.value.code == 2
    assert "argument --rounds: expects an integer (ASCII digits)" in capsys.readouterr().err


# U+0663 ARABIC-INDIC DIGIT THREE and U+FF12 FULLWIDTH DIGIT TWO: Python's int() reads 3 and 2
@pytest.mark.parametrize(
    "argv, option, value",
    [
        (["make-dataset", "--out", "d", "--hf", "x", "--workers"], "--workers", "\u0663"),
        (["make-dataset", "--out", "d", "--max-length"], "--max-length", "\uff12"),
        (["train-tokenizer", "--text", "a", "--vocab-size"], "--vocab-size", "\u0663"),
    ],
)
def test_the_language_options_take_ascii_digits_only(capsys, argv, option, value):
    with pytest.raises(SystemExit) as exit_:
        main([*argv, value])
    assert exit_.value.code == 2
    line = argparse_error(capsys)
    assert f"error: argument {option}: " in line and repr(value) in line, line


def test_train_tokenizers_output_name_too_long_is_refused_before_anything_is_made(capsys, tmp_path):
    out = tmp_path / "new" / ("a" * 300)
    with pytest.raises(SystemExit) as exit_:
        main(["train-tokenizer", "--text", "a", "--vocab-size", "300", "--out", str(out)])
    assert exit_.value.code == 2
    line = argparse_error(capsys)
    assert "error: argument --out: " in line and "a name of 300 bytes in it is too long" in line
    assert list(tmp_path.iterdir()) == []


# --------------------------------------------------------------------------- test_config.py


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["preset=tiny", "n_embd=65"], r"n_embd \(65\) must be a multiple of n_head \(2\) \(pre"),
        (["n_head=5"], r"n_embd \(768\) must be a multiple of n_head \(5\)"),
        (["model=mlp", "n_layer=2"], r"'n_layer' belongs to model gpt, but this run trains "),
        (["hidden_dim=8"], r"'hidden_dim' belongs to model mlp, but this run trains model=gpt"),
    ],
)
def test_the_gpts_relations_between_keys_are_checked_at_load(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, ["model=gpt", *overrides])


def test_the_gpts_keys_are_a_section_of_the_config():
    assert Config().gpt == GPTKeys()


def test_the_default_config_file_serves_every_model():
    """Keys of another model at their defaults (configs/default.toml's GPT keys with
    `benchmark --size large`, model=mlp) are not refused."""
    cfg, _ = load_config(REPO / "configs" / "default.toml", ["model=mlp", "hidden_dim=32"])
    assert (cfg.model, cfg.mlp.hidden_dim, cfg.gpt.preset) == ("mlp", 32, "gpt2-124m")


def test_a_saved_gpt_config_round_trips(tmp_path):
    cfg, _ = load_config(None, ['run_dir=with "quotes"', "lr=0.25", "n_embd=48"])
    (tmp_path / "c.toml").write_text(to_toml(cfg))
    assert load_config(tmp_path / "c.toml").config == cfg
    assert to_toml(cfg).endswith(
        '\n\n[gpt]\npreset = "gpt2-124m"\nn_layer = 0\nn_head = 0\n'
        'n_embd = 48\nblock_size = 0\nbias = false\ngelu = "exact"\n'
    )
    assert "hidden_dim" not in to_toml(cfg)  # the run's model's table only


def test_check_resume_of_a_gpt_run(caplog):
    saved = config_record(Config())
    check_resume(saved, Config(mlp=MLPKeys(hidden_dim=7)), 2, 2)  # a model this run does not train
    with pytest.raises(ConfigError, match="n_layer: 0 -> 4"):
        check_resume(saved, Config(gpt=GPTKeys(n_layer=4)), 2, 2)
    check_resume(saved, Config(log_every=3, run_dir="elsewhere"), 2, 2)  # harmless changes
    with pytest.raises(ConfigError, match="batch_size: 16 -> 64"):
        check_resume(saved, Config(batch_size=64), 2, 2)
    check_resume(saved, Config(), 2, 4)  # another world size reshards the checkpoint
    assert "world size 2 -> 4" in caplog.text
    with pytest.raises(ConfigError, match=r"fingerprint aaaa.*\(the files at synthetic were rew"):
        check_resume(saved, Config(), 2, 2, "aaaa" * 16, "bbbb" * 16)
    check_resume(saved, Config(batch_size=64, force_resume=True), 2, 2, "a", "b")
    # a copied run continued on other data: not "rewritten" files, another dataset
    caplog.clear()
    check_resume(saved, Config(dataset="data/other", force_resume=True), 2, 2, "a", "b")
    assert "(another dataset: synthetic -> data/other)" in caplog.text
    assert "rewritten" not in caplog.text


def test_a_gpt_run_dirs_config_is_compared_before_any_checkpoint_is_read(tmp_path):
    save_config(load_config(None, ["preset=tiny"]).config, tmp_path / "config.toml")
    assert '\n[gpt]\npreset = "tiny"\n' in (tmp_path / "config.toml").read_text()
    mlp, _ = load_config(None, ["model=mlp", "lr=0.001"])
    with pytest.raises(ConfigError, match=r"model: 'gpt' -> 'mlp'; lr: 0.0006 -> 0.001;") as err:
        check_run_dir_config(mlp, tmp_path, has_checkpoints=True)
    assert "preset: 'tiny' -> 'gpt2-124m'" in str(err.value)  # the old model's keys as well
    assert "hidden_dim" not in str(err.value)  # at its default: unchanged
    assert "new run_dir" in str(err.value) and "\n" not in str(err.value)
    check_run_dir_config(mlp, tmp_path, has_checkpoints=False)  # nothing to continue
    same, _ = load_config(None, ["gpt.preset=tiny", "log_every=1"])
    check_run_dir_config(same, tmp_path, True)
    (tmp_path / "config.toml").write_text("not = [toml")
    check_run_dir_config(mlp, tmp_path, has_checkpoints=True)  # checked after loading instead


# ------------------------------------------------------------------------ test_init_from.py
UNCHANGED = ["lr=1e-12", "min_lr=1e-12", "weight_decay=0", "warmup_steps=0", "eval_every=0"]
SHORT = ["max_steps=2", "checkpoint_every=2"]


@pytest.mark.parametrize(
    "model, source_model, expected",
    [
        (TINY, TINY_GPT, "has no tensor"),
        (TINY_GPT, TINY, "has no tensor"),
        (
            [*TINY_GPT, "n_embd=64"],
            TINY_GPT,
            "tensor wte.weight is [256, 32], the model's is [256, 64]",
        ),
    ],
    ids=["mlp-from-gpt", "gpt-from-mlp", "other-size"],
)
def test_another_models_weights_are_one_line_and_write_nothing(
    tmp_path, model, source_model, expected, cli
):
    source = tmp_path / "source"
    assert cli(*source_model, *SHORT, "eval_every=0", f"run_dir={source}").returncode == 0
    run_dir = tmp_path / "run"
    done = cli(*model, f"run_dir={run_dir}", f"init_from={source}")
    assert done.returncode == 2, done.stderr[-2000:]
    last = done.stderr.strip().splitlines()[-1]
    assert "Traceback" not in done.stderr and expected in last, last
    assert not run_dir.exists()  # refused before the run directory is made, or the new one removed


def bpe_dataset(tmp_path, name: str, vocab_size: int):
    """A dataset tokenised by a BPE of `vocab_size` ids trained here (300 and 310 ids: both
    padded to 320 rows by the GPT, so only the tokenizer tells them apart)."""
    from {{ cookiecutter.package_name }}.cli import main

    words = "alps node train token shard model batch step lustre cluster".split()
    docs = [" ".join(words[(i * 7 + j) % len(words)] for j in range(30)) for i in range(300)]
    (tmp_path / "docs.txt").write_text("\n".join(docs))
    (tmp_path / "docs.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    tokenizer, data = tmp_path / f"{name}.json", tmp_path / name
    assert main(["train-tokenizer", "--text", str(tmp_path / "docs.txt"), "--vocab-size",
                 str(vocab_size), "--out", str(tokenizer)]) == 0  # fmt: skip
    assert main(["make-dataset", "--hf", str(tmp_path / "docs.jsonl"), "--tokenizer",
                 str(tokenizer), "--out", str(data)]) == 0  # fmt: skip
    return data


def test_a_run_of_another_tokenizer_is_refused_unless_on_purpose(tmp_path, single_process, capsys):
    pytest.importorskip("tokenizers", reason="needs the [data] extra")
    pytest.importorskip("datasets", reason="needs the [data] extra")
    from {{ cookiecutter.package_name }}.cli import main

    first, second = bpe_dataset(tmp_path, "first", 300), bpe_dataset(tmp_path, "second", 310)
    base = [*TINY_GPT, "vocab_size=0", *SHORT, *UNCHANGED]
    assert main([*base, f"dataset={first}", f"run_dir={tmp_path / 'source'}"]) == 0
    new = [*base, f"dataset={second}", f"init_from={tmp_path / 'source'}"]
    capsys.readouterr()
    assert main([*new, f"run_dir={tmp_path / 'refused'}"]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert "was trained on ids of another tokenizer" in last and "init_new_vocabulary" in last
    assert not (tmp_path / "refused").exists()
    assert main([*new, f"run_dir={tmp_path / 'new'}", "init_new_vocabulary=true"]) == 0
    assert "init_new_vocabulary=true: " in capsys.readouterr().err


def test_hsdp_fsdp_and_ddp_train_the_gpt_to_the_same_losses_on_four_ranks(tmp_path):
    """The tiny GPT's blocks sharded by HSDP (2 groups of 2) and FSDP (over 4), or replicated
    by DDP: each rank's loss, step by step, within 1e-5 (_layouts.py)."""
    ranks, output = losses_per_layout(TINY_GPT, tmp_path)
    assert "each block sharded over a group of 2 ranks, 2 replicas" in output
    assert_the_same_losses(ranks)
