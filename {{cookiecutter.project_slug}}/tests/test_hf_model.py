"""`model=hf`: a transformers causal LM from a directory (GPT-2, Llama, Qwen2 here: tiny ones
with large random weights, made offline) trains with FSDP and DDP on two CPU ranks from its
pretrained weights, checkpoints, reshards to one rank, and exports a directory whose logits under
transformers are the original model's (lr=1e-12: the weights barely move). Its bit-exact resume
after kill -9 with FSDP: test_lora.py (the same Llama, with adapters); the GPT's: test_resume.py.
The commands one process runs are run in this one (the `cli` fixture)."""

from __future__ import annotations

import json

import pytest
import torch
from _language import TINY_GPT
from conftest import Ranks, checkpoint_steps, load_checkpoint, two_ranks

transformers = pytest.importorskip("transformers", reason="needs the [hf] extra")

# Llama and Qwen2 take the same settings: two layers, grouped-query attention (2 heads, 1 KV)
LLAMA_LIKE = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    vocab_size=256,
    max_position_embeddings=64,
)
CONFIGS = {
    "gpt2": lambda: transformers.GPT2Config(
        n_layer=2, n_head=2, n_embd=32, n_positions=64, vocab_size=256
    ),
    "llama": lambda: transformers.LlamaConfig(**LLAMA_LIKE),
    "qwen2": lambda: transformers.Qwen2Config(**LLAMA_LIKE),
}


def make_model(arch: str, path, std: float = 0.3):
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(CONFIGS[arch]())
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0.0, std)
    model.save_pretrained(path)
    return model.eval()


def args(model_dir, run_dir, *extra: str) -> list[str]:
    return [
        "device=cpu", "model=hf", f"hf_model={model_dir}", "hf_context_length=32",
        "dataset=synthetic", "vocab_size=256", "batch_size=2", "max_steps=2",
        "checkpoint_every=2", "eval_every=0", "lr=1e-12", "min_lr=1e-12", "weight_decay=0",
        "warmup_steps=0", "num_workers=0", "cpu_threads=1", "async_checkpoint=false",
        f"run_dir={run_dir}", *extra,
    ]  # fmt: skip


def logits(model, ids):
    with torch.no_grad():
        return model(ids).logits


@pytest.mark.parametrize(
    "arch, ranks, layout", [("gpt2", 2, "fsdp"), ("llama", 2, "hsdp"), ("qwen2", 1, "fsdp")]
)
def test_fsdp_on_two_ranks_from_pretrained_then_export(arch, ranks, layout, tmp_path, cli):
    """Qwen2 (Llama's layers with biases on q, k and v) in one process: what FSDP's sharding
    and gathering adds, the other two show; Llama's under HSDP (its 2-D mesh: one group of the
    node's 2 ranks)."""
    original = make_model(arch, tmp_path / "model")
    run_dir = tmp_path / "run"
    # activation checkpointing too: each decoder layer gets its masks and position embeddings,
    # and the names exported are transformers' own
    train = args(
        tmp_path / "model", run_dir, f"parallelism={layout}", "activation_checkpointing=true"
    )
    if ranks == 2:
        both = Ranks(train, tmp_path / "logs")
        assert both.wait() == [0, 0], both.log(0)[-3000:]
        log = both.log(0)
    else:
        done = cli(*train)
        assert done.returncode == 0, done.stderr[-2000:]
        log = done.stderr
    assert "from the weights of" in log and checkpoint_steps(run_dir) == [2]
    out = tmp_path / "export"
    done = cli("export", f"run_dir={run_dir}", "--format", "hf", "--out", out)
    assert done.returncode == 0, done.stderr[-2000:]
    exported = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    ids = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(logits(exported, ids), logits(original, ids), rtol=0, atol=1e-4)


def test_ddp_then_one_rank_resumes_the_two_rank_checkpoint(tmp_path, cli):
    make_model("llama", tmp_path / "model")
    run_dir = tmp_path / "run"
    ranks = Ranks(args(tmp_path / "model", run_dir, "parallelism=ddp"), tmp_path / "logs")
    assert ranks.wait() == [0, 0], ranks.log(0)[-3000:]
    more = args(tmp_path / "model", run_dir, "max_steps=4", "checkpoint_every=2")
    done = cli(*more)
    # max_steps is part of the schedule: continuing to 4 is a changed run, and said so
    assert done.returncode == 2 and "max_steps: 2 -> 4" in done.stderr
    again = cli(*args(tmp_path / "model", run_dir))
    assert (
        again.returncode == 0 and "RESUMING" in again.stderr and "world size 2 -> 1" in again.stderr
    )


@pytest.mark.parametrize(
    "extra, expected",
    [
        (
            ["vocab_size=300"],
            "the dataset's vocabulary has 300 tokens but hf_model's embedding has 256",
        ),
        (["hf_context_length=100"], "reads at most 64 tokens"),
    ],
)
def test_a_model_that_does_not_fit_the_data_is_one_line(tmp_path, extra, expected, cli):
    make_model("qwen2", tmp_path / "model")
    done = cli(*args(tmp_path / "model", tmp_path / "run", *extra))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert expected in done.stderr.strip().splitlines()[-1]


def resave(path, out, rename) -> None:
    """The model directory `path` again in `out`, each tensor under rename(name) (or left out
    where that is None), as older or other writers store it."""
    from safetensors.torch import load_file, save_file

    out.mkdir()
    (out / "config.json").write_text((path / "config.json").read_text())
    tensors = load_file(path / "model.safetensors")
    renamed = {rename(name): t for name, t in tensors.items() if rename(name) is not None}
    save_file(renamed, out / "model.safetensors", metadata={"format": "pt"})


def started_with(run_dir, model) -> None:
    """The run's first checkpoint holds `model`'s weights, tensor by tensor (lr=1e-12)."""
    state = load_checkpoint(run_dir, 2)["model"]["model"]
    expected = {"hf." + name: t for name, t in model.state_dict().items()}
    assert set(state) == set(expected)
    for name, tensor in expected.items():
        torch.testing.assert_close(state[name], tensor, rtol=0, atol=1e-9, msg=name)


def test_files_in_other_layouts_load_or_are_refused_in_one_line(tmp_path, cli):
    """GPT-2 as older files store it (no `transformer.` prefix) is read tensor by tensor;
    Mixtral (one tensor per expert in the files, a fused one in the module) through
    transformers' loader; a file lacking a weight is refused, not initialised at random."""
    gpt2 = make_model("gpt2", tmp_path / "gpt2")
    resave(tmp_path / "gpt2", tmp_path / "old", lambda name: name.removeprefix("transformer."))
    done = cli(*args(tmp_path / "old", tmp_path / "run-old"))
    assert done.returncode == 0, done.stderr[-2000:]
    started_with(tmp_path / "run-old", gpt2)

    CONFIGS["mixtral"] = lambda: transformers.MixtralConfig(
        **LLAMA_LIKE, num_local_experts=2, num_experts_per_tok=1
    )
    mixtral = make_model("mixtral", tmp_path / "mixtral")
    done = cli(*args(tmp_path / "mixtral", tmp_path / "run-mixtral"))
    assert done.returncode == 0, done.stderr[-2000:]
    started_with(tmp_path / "run-mixtral", mixtral)

    resave(tmp_path / "mixtral", tmp_path / "cut", lambda n: None if "norm" in n else n)
    done = cli(*args(tmp_path / "cut", tmp_path / "run-cut"))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "has no weights for model.layers.0.input_layernorm.weight" in done.stderr
    assert checkpoint_steps(tmp_path / "run-cut") == []


# Build a run and load its initial weights, nothing else: the figures as one JSON line
LOAD_ONLY = """
import json, sys
from {{ cookiecutter.package_name }}.checkpoint.start import load_start, open_start
from {{ cookiecutter.package_name }}.config.settings import load_config
from {{ cookiecutter.package_name }}.distributed import process_group
from {{ cookiecutter.package_name }}.models import spec_of
from {{ cookiecutter.package_name }}.training.build import build
cfg, _ = load_config(None, sys.argv[1:])
start = open_start(cfg, spec_of(cfg), "")
with process_group(cfg.dist_timeout_s, cfg.cpu_threads, cfg.device) as (env, device):
    run = build(cfg, env, device, start)
    memory = load_start(start, run.model, run.spec, cfg, run.source.info)[2]
    print(json.dumps(run.memory | memory))
"""


def test_loading_is_sharded_no_rank_holds_the_whole_model(tmp_path):
    """A 119M-parameter Llama (0.44 GiB) on two FSDP ranks: built on the meta device, each
    rank reads its half of each tensor, so its host memory grows by about half the weights
    (plus the modules themselves); reading the whole model would grow it by all of them."""
    config = transformers.LlamaConfig(
        hidden_size=1024, intermediate_size=2816, num_hidden_layers=8, num_attention_heads=8,
        num_key_value_heads=8, vocab_size=8192, max_position_embeddings=64,
        tie_word_embeddings=False,
    )  # fmt: skip
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / "model")
    argv = [*args(tmp_path / "model", tmp_path / "run"), "parallelism=fsdp"]
    ranks = two_ranks([argv, argv], program=("-c", LOAD_ONLY))
    assert [proc.returncode for proc, _, _ in ranks] == [0, 0], ranks[0][2][-3000:]
    for figures in (json.loads(out.strip().splitlines()[-1]) for _, out, _ in ranks):
        assert 0.44 < figures["model_gib"] < 0.45
        grown = figures["peak_rss_gib"] - figures["rss_before_build_gib"]
        assert grown < 0.8 * figures["model_gib"], figures


def test_the_benchmark_says_how_much_memory_loading_took(tmp_path, cli):
    make_model("llama", tmp_path / "model")
    bench = ["benchmark", *args(tmp_path / "model", tmp_path / "run"), "bench_steps=5"]
    done = cli(*bench)
    assert done.returncode == 0, done.stderr[-2000:]
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    assert figures["model"] == "hf:llama:model" and figures["ratio"] > 0
    assert 0 < figures["rss_before_build_gib"] < figures["peak_rss_gib"]
    assert 0 < figures["model_gib"] < 1e-3


def test_a_first_loss_far_above_chance_is_named(tmp_path, cli):
    """Weights of std 3 (a broken initialisation): the first loss is many times ln(256), the
    loss of uniform predictions, and the run says so; the package's GPT says nothing."""
    make_model("llama", tmp_path / "broken", std=3.0)
    done = cli(*args(tmp_path / "broken", tmp_path / "run"))
    assert done.returncode == 0, done.stderr[-2000:]
    assert "times the 5.55 of uniform predictions (ln of 256 outputs)" in done.stderr
    gpt = cli(*TINY_GPT, f"run_dir={tmp_path / 'gpt'}", "max_steps=2")
    assert gpt.returncode == 0 and "uniform predictions" not in gpt.stderr
