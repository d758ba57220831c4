"""`model=hf`: the run keeps the architecture it trains (a copy of hf_model's config.json in the
run directory, which resume, evaluate and export read, the source edited or gone), and a source
that is not the model its config.json describes is refused in one line: tensors the model does
not have, an output layer a tied config would drop, an encoder, a symlink loop, custom code
(without a question on the terminal). Tiny models made offline."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="needs the [hf] extra")
pytest.importorskip("safetensors", reason="needs the [hf] extra")

from {{ cookiecutter.package_name }}.cli import main  # noqa: E402

LLAMA = dict(
    hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
    num_key_value_heads=1, vocab_size=256, max_position_embeddings=64,
)  # fmt: skip


def llama(path, **settings):
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA | settings))
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0.0, 0.3)
    model.save_pretrained(path)
    return model


def args(model_dir, run_dir, *extra: str) -> list[str]:
    return [
        "device=cpu", "model=hf", f"hf_model={model_dir}", "hf_context_length=32",
        "dataset=synthetic", "vocab_size=256", "batch_size=2", "max_steps=2", "eval_batches=2",
        "checkpoint_every=2", "eval_every=0", "lr=1e-12", "min_lr=1e-12", "weight_decay=0",
        "warmup_steps=0", "num_workers=0", "cpu_threads=1", "async_checkpoint=false",
        f"run_dir={run_dir}", *extra,
    ]  # fmt: skip


def edit_config(directory, **changes) -> None:
    path = directory / "config.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | changes, indent=2))


def refused(argv, capsys) -> str:
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    return err.strip().splitlines()[-1]


def evaluated(run, capsys) -> float:
    capsys.readouterr()
    assert main(["evaluate", f"run_dir={run}"]) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])["eval_loss"]


def test_the_run_keeps_the_architecture_it_trains(tmp_path, single_process, capsys):
    source, run = tmp_path / "model", tmp_path / "run"
    llama(source)
    edit_config(source, dtype="bfloat16")  # as hub models say; the run trains in float32
    assert main(args(source, run)) == 0
    kept = json.loads((run / "hf_model" / "config.json").read_text())
    assert kept == json.loads((source / "config.json").read_text())
    loss = evaluated(run, capsys)

    # another writer's version, a trailing slash: the same model, the run resumes
    edit_config(source, transformers_version="0.0.1", architectures=["LlamaForCausalLM"])
    assert main(args(f"{source}/", run)) == 0
    assert "RESUMING" in capsys.readouterr().err

    # a setting that changes the function: refused, named; evaluate keeps the run's own
    edit_config(source, rms_norm_eps=0.5)
    last = refused(args(source, run), capsys)
    assert "rms_norm_eps: 1e-06 -> 0.5" in last and "hf_model's config.json" in last
    assert evaluated(run, capsys) == loss

    # the source gone: resume, evaluate and export read the run's copy
    shutil.rmtree(source)
    assert main(args(source, run)) == 0 and "RESUMING" in capsys.readouterr().err
    assert evaluated(run, capsys) == loss
    out = tmp_path / "export"
    assert main(["export", f"run_dir={run}", "--format", "hf", "--out", str(out)]) == 0
    exported = json.loads((out / "config.json").read_text())
    assert exported["rms_norm_eps"] == kept["rms_norm_eps"]
    assert exported["dtype"] == "float32"  # the tensors' (the source said bfloat16)


@pytest.mark.parametrize("case", ["layers", "untied", "encoder", "loop", "init_from"])
def test_a_source_that_is_not_its_model_is_one_line(tmp_path, single_process, capsys, case):
    source, run = tmp_path / "model", tmp_path / "run"
    extra = []
    if case == "layers":  # config.json says 1 layer, the file holds 2
        llama(source)
        edit_config(source, num_hidden_layers=1)
        expected = "not in the model its config.json describes"
    if case == "untied":  # an output layer of its own under tie_word_embeddings=true
        llama(source, tie_word_embeddings=False)
        edit_config(source, tie_word_embeddings=True)
        expected = "its files hold an output layer (lm_head.weight)"
    if case == "encoder":  # BERT's attention sees the tokens it is to predict
        transformers.BertConfig(
            hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64
        ).save_pretrained(source)
        expected = "holds a 'bert' encoder"
    if case == "loop":
        source.symlink_to(source)
        expected = f"config key 'hf_model': {source}"
    if case == "init_from":  # another model's weights: the setting named, the run dir not left
        llama(source)
        llama(tmp_path / "other", rms_norm_eps=0.5)
        extra = [f"init_from={tmp_path / 'other'}"]
        expected = "its config.json is not the run's model's: rms_norm_eps: 1e-06 -> 0.5"
    last = refused(args(source, run, *extra), capsys)
    assert expected in last, last
    assert not run.exists()


def test_a_model_of_custom_code_is_refused_without_asking(
    tmp_path, single_process, capsys, no_terminal
):
    """A config.json whose auto_map names code of its own, for a model_type transformers does
    not know: one line, and transformers neither asks on the terminal nor runs the code."""
    source, run = tmp_path / "model", tmp_path / "run"
    llama(source)
    code = {"AutoConfig": "alps_code.Config", "AutoModelForCausalLM": "alps_code.Model"}
    edit_config(source, model_type="alps-llama", auto_map=code)
    (source / "alps_code.py").write_text(f"open({str(source / 'RAN')!r}, 'w').close()\n")
    last = refused(args(source, run), capsys)
    assert no_terminal == [], no_terminal
    assert f"{source / 'config.json'} names custom code (auto_map)" in last, last
    assert "trust_remote_code=False" in last
    assert not (source / "RAN").exists() and not run.exists()


def test_init_from_another_writers_copy_of_the_model_is_accepted(tmp_path, single_process):
    """config.json differing only where the function does not (the writer's version, the dtype
    the files are stored in)."""
    llama(tmp_path / "model")
    shutil.copytree(tmp_path / "model", tmp_path / "copy")
    edit_config(tmp_path / "copy", transformers_version="0.0.1", dtype="bfloat16")
    argv = args(tmp_path / "model", tmp_path / "run", f"init_from={tmp_path / 'copy'}")
    assert main(argv) == 0
