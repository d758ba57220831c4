"""LoRA on `model=hf` (lora_rank > 0): the base stays bit-for-bit hf_model's, the adapters and
their optimizer state are all that trains and all that checkpoints hold; FSDP on two CPU ranks
resumes bit-exactly after kill -9 (the HF model's resume test: the frozen base is read again
from hf_model, the adapters and AdamW from the checkpoint); the merged export loads in
transformers without peft, the adapter export in peft, both with the package's logits; bad input
is one line."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from conftest import (
    Ranks,
    assert_same_training_state,
    kill_9_then_resume,
    load_checkpoint,
    one_line,
)

transformers = pytest.importorskip("transformers", reason="needs the [hf] extra")
peft = pytest.importorskip("peft", reason="needs the [lora] extra")

from test_hf_model import args, make_model  # noqa: E402 - after the extras are known

LLAMA_TARGETS = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}


def test_only_the_adapters_train_and_the_base_stays_bit_for_bit(tmp_path, single_process):
    """The run's model as training.build makes it and its base from hf_model: it starts as the
    base model (B = 0), eight steps on one batch (learnt: the loss falls) move the adapters,
    no base tensor, and the optimizer holds the adapters only; the benchmark's sizes count
    them."""
    from {{ cookiecutter.package_name }} import distributed
    from {{ cookiecutter.package_name }}.checkpoint.start import load_start, open_start
    from {{ cookiecutter.package_name }}.commands.benchmark import verdict
    from {{ cookiecutter.package_name }}.config.settings import load_config
    from {{ cookiecutter.package_name }}.models import spec_of
    from {{ cookiecutter.package_name }}.models.lora import state_sizes
    from {{ cookiecutter.package_name }}.training import build, step

    original = make_model("llama", tmp_path / "model")
    extra = ("lora_rank=4", "lr=1e-2", "min_lr=1e-2")
    cfg = load_config(None, args(tmp_path / "model", tmp_path / "run", *extra)).config
    with distributed.process_group(cfg.dist_timeout_s, cfg.cpu_threads, cfg.device) as (env, dev):
        start = open_start(cfg, spec_of(cfg), "")  # a new run: its base opened
        run = build.build(cfg, env, dev, start)
        load_start(start, run.model, run.spec, cfg, run.source.info)
        before = {n: p.detach().clone() for n, p in run.model.named_parameters()}
        adapters = {n for n, p in run.model.named_parameters() if p.requires_grad}
        assert adapters and all(".lora_A." in n or ".lora_B." in n for n in adapters)
        assert {n.split(".")[-4] for n in adapters} == LLAMA_TARGETS  # the default: every one
        _, inputs = build.input_pipeline(run, 1)
        batch = next(inputs)
        inputs.close()
        with torch.no_grad():
            inputs = batch["inputs"]
            torch.testing.assert_close(run.model(inputs), original(inputs).logits)
        losses = [step.train_step(run, iter([batch])).item() for _ in range(8)]
        after = dict(run.model.named_parameters())
        optimized = {id(p) for group in run.optimizer.param_groups for p in group["params"]}
        optimized_params = [after[n] for n in adapters]
        sizes = state_sizes(run.model)
    assert losses[-1] < losses[0] - 0.5, losses
    for name, value in before.items():
        if name in adapters:
            if ".lora_B." in name:  # B starts at zero (the base's function), then moves
                assert not torch.equal(after[name], value), name
        else:
            assert torch.equal(after[name], value), f"base tensor {name} changed"
    assert optimized == {id(after[n]) for n in adapters}
    trained, full = (sum(p.numel() for p in ps) for ps in (optimized_params, original.parameters()))
    assert sizes["lora_optimizer_state_gib"] == 8 * trained / 2**30
    assert sizes["full_checkpoint_gib"] == 12 * full / 2**30
    assert "LoRA: AdamW state" in verdict({"ratio": 1.0, "device": "cpu", **sizes})


def test_kill_9_hsdp_resumes_bit_exactly_and_checkpoints_hold_the_adapters(tmp_path, cli):
    """HSDP on two ranks (FSDP2 on a 2-D mesh, one group of 2; frozen base and adapters sharded
    together), dropout on the adapters:
    killed and started again, the run ends identical to an uninterrupted one; its checkpoints
    hold the adapters and their AdamW state, no base tensor; a resume on another base is
    refused in one line."""
    make_model("llama", tmp_path / "model")
    real = ["max_steps=12", "checkpoint_every=4", "lr=1e-2", "min_lr=1e-3", "log_every=1",
            "preempt_check_every=1", "parallelism=hsdp", "lora_rank=4", "lora_dropout=0.1",
            "lora_targets=q_proj,down_proj"]  # fmt: skip
    reference = tmp_path / "reference"
    ranks = Ranks(args(tmp_path / "model", reference, *real), tmp_path / "logs0")
    assert ranks.wait() == [0, 0], ranks.log(0)[-3000:]
    run_dir = tmp_path / "run"
    argv = args(tmp_path / "model", run_dir, *real)
    kill_9_then_resume(argv, run_dir, tmp_path / "logs", kill_at=6, final=12)
    assert_same_training_state(reference, run_dir, 12)

    saved = load_checkpoint(run_dir, 12)
    names = set(saved["model"]["model"])
    assert len(names) == 2 * 2 * 2  # 2 layers x (q_proj, down_proj) x (A, B)
    assert all(".lora_A." in n or ".lora_B." in n for n in names)
    assert set(saved["model"]["optim"]["state"]) == names
    assert json.loads(saved["train"]["extra"])["lora_base"]["hf_model"] == str(
        (tmp_path / "model").resolve()
    )

    make_model("llama", tmp_path / "model", std=0.2)  # the same architecture, other weights
    done = cli(*args(tmp_path / "model", run_dir, *real, "parallelism=ddp"))  # hsdp: 2 ranks
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "adapters were trained on the base model" in done.stderr.strip().splitlines()[-1]


def package_logits(run_dir, ids):
    """The package's own model of the run (adapters unmerged), its base from hf_model."""
    from {{ cookiecutter.package_name }}.checkpoint.export import load_model_state
    from {{ cookiecutter.package_name }}.config.settings import saved_config
    from {{ cookiecutter.package_name }}.data.info import saved_data_info
    from {{ cookiecutter.package_name }}.models import spec_of

    values, adapters = load_model_state(run_dir, merge_adapters=False)
    cfg = saved_config(values)
    model = spec_of(cfg).build(cfg, saved_data_info(values, run_dir)).eval()
    base = transformers.AutoModelForCausalLM.from_pretrained(cfg.hf.hf_model).state_dict()
    ours = {name.replace(".base_layer.", "."): name for name in model.state_dict()}
    model.load_state_dict({ours["hf." + k]: v for k, v in base.items()} | adapters)
    with torch.no_grad():
        return model(ids)


@pytest.mark.parametrize("arch", ["llama", "gpt2"])  # gpt2: Conv1D layers store W transposed
def test_merged_export_in_transformers_and_adapter_export_in_peft(arch, tmp_path, cli):
    """Llama trained with DDP on two ranks, GPT-2 in one process."""
    make_model(arch, tmp_path / "model")
    run_dir = tmp_path / "run"
    extra = ["lora_rank=4", "lora_alpha=8", "lr=1e-2", "min_lr=1e-2", "max_steps=4"]
    train = args(tmp_path / "model", run_dir, *extra, "checkpoint_every=4")
    if arch == "llama":
        ranks = Ranks([*train, "parallelism=ddp"], tmp_path / "logs")
        assert ranks.wait() == [0, 0], ranks.log(0)[-3000:]
    else:
        done = cli(*train)
        assert done.returncode == 0, done.stderr[-2000:]
    for kind in ("hf", "peft"):
        done = cli("export", f"run_dir={run_dir}", "--format", kind, "--out", str(tmp_path / kind))
        assert done.returncode == 0, done.stderr[-2000:]
    ids = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(3))
    ours = package_logits(run_dir, ids)
    base = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "model").eval()
    with torch.no_grad():
        assert (base(ids).logits - ours).abs().max() > 1e-3  # the adapters changed the model
    # the merged directory is a plain transformers model: no peft in a fresh interpreter
    check = (
        "import sys, torch, transformers; sys.modules['peft'] = None; "
        f"m = transformers.AutoModelForCausalLM.from_pretrained({str(tmp_path / 'hf')!r}); "
        "ids = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(3)); "
        f"torch.save(m.eval()(ids).logits.detach(), {str(tmp_path / 'merged.pt')!r})"
    )
    loaded = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True)
    assert loaded.returncode == 0, loaded.stderr[-2000:]
    merged = torch.load(tmp_path / "merged.pt")
    torch.testing.assert_close(merged, ours, rtol=0, atol=1e-4)
    adapted = peft.PeftModel.from_pretrained(base, tmp_path / "peft").eval()
    with torch.no_grad():
        torch.testing.assert_close(adapted(input_ids=ids).logits, ours, rtol=0, atol=1e-5)


@pytest.mark.parametrize(
    "extra, expected",
    [
        (["model=gpt", "lora_rank=4"], "config key 'lora_rank' belongs to model hf"),
        (
            ["lora_rank=4", "lora_targets=q_proj,c_attn"],
            "no linear layer named c_attn; theirs are down_proj, gate_proj, k_proj, o_proj, "
            "q_proj, up_proj, v_proj",
        ),
        (["lora_alpha=32"], "'lora_alpha' is set but lora_rank is 0"),
        (["lora_rank=4", "hf_weights=random"], "trains adapters on hf_model's own weights"),
    ],
)
def test_bad_lora_settings_are_one_line(tmp_path, extra, expected, single_process, capsys):
    from {{ cookiecutter.package_name }}.cli import main

    make_model("llama", tmp_path / "model")
    capsys.readouterr()  # transformers' progress bar while writing it
    assert main(args(tmp_path / "model", tmp_path / "run", *extra)) == 2
    assert expected in one_line(capsys)
    assert not (tmp_path / "run").exists()


def test_without_peft_the_line_names_the_extra(tmp_path, monkeypatch):
    from {{ cookiecutter.package_name }}.config.settings import ConfigError, load_config

    make_model("llama", tmp_path / "model")
    monkeypatch.setitem(sys.modules, "peft", None)  # `import peft` now fails
    with pytest.raises(ConfigError, match=r"lora_rank > 0 needs .* peft .*\.\[lora\]'"):
        load_config(None, args(tmp_path / "model", tmp_path / "run", "lora_rank=4"))
