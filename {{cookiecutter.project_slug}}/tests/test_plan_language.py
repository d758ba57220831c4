"""`plan` of the language models: the tiny GPT's model states and activations equal a real step's
on the CPU, and a Llama 3 8B built from its config.json alone (no weights) needs a sharded layout
on two nodes. The MLP's cases and the command's: test_plan.py."""

import json

import torch
from _language import TINY_GPT
from _plan import saved_activation_bytes, states_after_one_step

from {{ cookiecutter.package_name }}.config.settings import load_config
from {{ cookiecutter.package_name }}.distributed import DistEnv
from {{ cookiecutter.package_name }}.training import plan
from {{ cookiecutter.package_name }}.training.build import build

# Llama 3 8B's architecture (meta-llama/Meta-Llama-3-8B's config.json): 8.03e9 parameters
LLAMA_3_8B = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-05,
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
    "hidden_act": "silu",
    "torch_dtype": "bfloat16",
}


def test_the_gpts_states_and_activations_equal_a_real_steps(single_process):
    """The tied embedding counted once, the padded vocabulary, attention's
    saved tensors (the CPU's flash kernel, as the plan assumes a GPU's). Without dropout: with
    it the CPU's attention falls back to the math kernel, which keeps the (T x T) weights that a
    GPU's flash kernel does not (the plan's figure is the GPU's)."""
    cfg = load_config(None, [*TINY_GPT, "precision=fp32", "dropout=0.0"]).config
    run = build(cfg, DistEnv(0, 1, 0, 1, "localhost", 0, "single"), torch.device("cpu"))
    activations = saved_activation_bytes(run)
    planned = plan.measure_model(cfg)
    assert plan.model_state_bytes(planned, 1) == states_after_one_step(run)
    assert planned.activations == activations > 0
    # checkpointed: each block's input instead of all it saves, plus one block recomputing
    assert planned.activations > planned.checkpointed


def test_llama_3_8b_from_its_config_json_needs_a_sharded_layout_on_two_nodes(cli, tmp_path):
    model = tmp_path / "llama-3-8b"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(LLAMA_3_8B))
    args = ("model=hf", f"hf_model={model}", "batch_size=1", "hf_context_length=8192")
    result = cli("plan", *args, "nodes=2", "--json")
    assert result.returncode == 0, result.stderr
    planned = json.loads(result.stdout)
    assert abs(planned["parameters"] - 8.03e9) < 0.01 * 8.03e9
    rows = {(r["parallelism"], r["activation_checkpointing"]): r for r in planned["layouts"]}
    assert len(rows) == 6 and all(r["gpus"] == 8 for r in rows.values())
    # DDP: 16 bytes per parameter of weights, gradients and AdamW states alone, 120 GiB
    assert not rows["ddp", False]["fits"] and not rows["ddp", True]["fits"]
    assert rows["ddp", False]["weights_gib"] + rows["ddp", False]["optimizer_gib"] > 89
    assert rows["fsdp", False]["fits"] and rows["hsdp", True]["fits"]
    assert planned["recommended"]["parallelism"] in ("hsdp", "fsdp")
    # HSDP: each NIC carries the all-reduce of a quarter of the gradients, FSDP's every gather
    assert rows["hsdp", False]["slingshot_gib"] < rows["fsdp", False]["slingshot_gib"] / 1.5
