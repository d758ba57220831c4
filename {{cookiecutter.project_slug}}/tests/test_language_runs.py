"""The GPT's cases of the shared tests (those run on conftest.py's TINY, the classifier every
training workload keeps): what only a language model has, its token windows, its presets and
sizes, its vocabulary and the tokens its lines count."""

import json

import pytest
from _language import TINY_GPT
from conftest import TINY, one_line
from test_run_integrity import small_disk  # noqa: F401 - a fixture

from {{ cookiecutter.package_name }}.checkpoint import export_model
from {{ cookiecutter.package_name }}.cli import main


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


def test_a_full_disk_is_named_by_the_hugging_face_export(small_disk, tmp_path, single_process, capsys):  # noqa: F811
    """transformers' writer on a full disk: the cause and the place in one line, nothing left."""
    run_dir = tmp_path / "run"
    assert main([*TINY_GPT, "max_steps=2", "checkpoint_every=2", f"run_dir={run_dir}"]) == 0
    capsys.readouterr()
    disk = small_disk(64)  # less than the model
    assert main(["export", f"run_dir={run_dir}", "--format", "hf", "--out", str(disk / "hf")])
    assert f"No space left on device: {disk}" in one_line(capsys)
    assert [p for p in disk.rglob("*")] == []
