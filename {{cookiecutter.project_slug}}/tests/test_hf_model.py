"""`model=hf`: a transformers causal LM from a directory (GPT-2, Llama, Qwen2 here: tiny ones
with large random weights, made offline) trains with FSDP and DDP on two CPU ranks from its
pretrained weights, checkpoints, reshards to one rank, and exports a directory whose logits under
transformers are the original model's (lr=1e-12: the weights barely move)."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest
import torch
from conftest import (
    PACKAGE,
    REPO,
    TIMEOUT_S,
    Ranks,
    assert_same_training_state,
    checkpoint_steps,
    clean_env,
)

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


def make_model(arch: str, path):
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(CONFIGS[arch]())
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0.0, 0.3)
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


@pytest.mark.parametrize("arch", sorted(CONFIGS))
def test_fsdp_on_two_ranks_from_pretrained_then_export(arch, tmp_path):
    original = make_model(arch, tmp_path / "model")
    run_dir = tmp_path / "run"
    # activation checkpointing too: each decoder layer gets its masks and position embeddings,
    # and the names exported are transformers' own
    extra = ("parallelism=fsdp", "activation_checkpointing=true")
    ranks = Ranks(args(tmp_path / "model", run_dir, *extra), tmp_path / "logs")
    assert ranks.wait() == [0, 0], ranks.log(0)[-3000:]
    assert "from the weights of" in ranks.log(0) and checkpoint_steps(run_dir) == [2]
    out = tmp_path / "export"
    done = subprocess.run(
        [sys.executable, "-m", PACKAGE, "export", f"run_dir={run_dir}", "--format", "hf",
         "--out", str(out)],
        cwd=REPO, env=clean_env(), capture_output=True, text=True, timeout=TIMEOUT_S,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    exported = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    ids = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(logits(exported, ids), logits(original, ids), rtol=0, atol=1e-4)


def test_ddp_then_one_rank_resumes_the_two_rank_checkpoint(tmp_path):
    make_model("llama", tmp_path / "model")
    run_dir = tmp_path / "run"
    ranks = Ranks(args(tmp_path / "model", run_dir, "parallelism=ddp"), tmp_path / "logs")
    assert ranks.wait() == [0, 0], ranks.log(0)[-3000:]
    more = args(tmp_path / "model", run_dir, "max_steps=4", "checkpoint_every=2")
    done = subprocess.run(
        [sys.executable, "-m", PACKAGE, *more], cwd=REPO, env=clean_env(),
        capture_output=True, text=True, timeout=TIMEOUT_S,
    )  # fmt: skip
    # max_steps is part of the schedule: continuing to 4 is a changed run, and said so
    assert done.returncode == 2 and "max_steps: 2 -> 4" in done.stderr
    again = subprocess.run(
        [sys.executable, "-m", PACKAGE, *args(tmp_path / "model", run_dir)], cwd=REPO,
        env=clean_env(), capture_output=True, text=True, timeout=TIMEOUT_S,
    )  # fmt: skip
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
def test_a_model_that_does_not_fit_the_data_is_one_line(tmp_path, extra, expected):
    make_model("qwen2", tmp_path / "model")
    done = subprocess.run(
        [sys.executable, "-m", PACKAGE, *args(tmp_path / "model", tmp_path / "run", *extra)],
        cwd=REPO, env=clean_env(), capture_output=True, text=True, timeout=TIMEOUT_S,
    )  # fmt: skip
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert expected in done.stderr.strip().splitlines()[-1]


def test_kill_9_then_the_same_command_resumes_bit_exactly(tmp_path):
    """FSDP on two ranks, a real learning rate: killed at step 27 and started again, the run
    ends with model, optimizer, schedule and RNG states identical to an uninterrupted one."""
    make_model("qwen2", tmp_path / "model")
    real = ["max_steps=40", "checkpoint_every=10", "keep_checkpoints=2", "lr=1e-2", "min_lr=1e-3",
            "log_every=1", "preempt_check_every=1", "parallelism=fsdp"]  # fmt: skip
    reference = tmp_path / "reference"
    ranks = Ranks(args(tmp_path / "model", reference, *real), tmp_path / "logs0")
    assert ranks.wait() == [0, 0], ranks.log(0)[-3000:]
    run_dir = tmp_path / "run"
    ranks = Ranks(args(tmp_path / "model", run_dir, *real), tmp_path / "logs1")
    ranks.wait_for_step(run_dir, 27)
    ranks.send(signal.SIGKILL)
    ranks.wait()
    assert max(checkpoint_steps(run_dir)) < 40
    again = Ranks(args(tmp_path / "model", run_dir, *real), tmp_path / "logs2")
    assert again.wait() == [0, 0], again.log(0)[-3000:]
    assert "RESUMING" in again.log(0)
    assert_same_training_state(reference, run_dir, 40)
