"""GPT-2 in, Hugging Face out: a GPT2LMHeadModel's weights start a run of the package's GPT
(`init_from=DIR`), and `export --format hf` writes a directory transformers loads, with the
dataset's tokenizer. Offline: tiny models made here with large weights (std 0.5), so that a
wrong mapping (a missing transpose of a square matrix, a swapped bias) changes every logit."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from _language import TINY_GPT, validation_windows

transformers = pytest.importorskip("transformers", reason="needs the [hf] extra")
pytest.importorskip("safetensors", reason="needs the [hf] extra")

from {{ cookiecutter.package_name }}.checkpoint import load_model_state  # noqa: E402
from {{ cookiecutter.package_name }}.checkpoint.export_hf import export_hf  # noqa: E402
from {{ cookiecutter.package_name }}.cli import main  # noqa: E402
from {{ cookiecutter.package_name }}.config.settings import saved_config  # noqa: E402
from {{ cookiecutter.package_name }}.data.info import saved_data_info  # noqa: E402
from {{ cookiecutter.package_name }}.data.tokens import (  # noqa: E402
    SYNTHETIC_TOKENS,
    TokenDataset,
)
from {{ cookiecutter.package_name }}.models import spec_of  # noqa: E402

GPT2 = ["bias=true", "gelu=tanh"]  # GPT-2's architecture options
UNCHANGED = ["lr=1e-12", "min_lr=1e-12", "weight_decay=0", "warmup_steps=0", "eval_every=0"]
SHORT = ["max_steps=2", "checkpoint_every=2", "dropout=0.0"]


def tiny_gpt2(path, vocab_size=256):
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=2, n_head=2, n_embd=32, n_positions=32, vocab_size=vocab_size
    )
    model = transformers.GPT2LMHeadModel(config)
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0.0, 0.5)
    model.save_pretrained(path)
    return model.eval()


def package_logits(run_dir, ids):
    values, state = load_model_state(run_dir)
    cfg = saved_config(values)
    model = spec_of(cfg).build(cfg, saved_data_info(values, run_dir))
    model.load_state_dict(state)
    with torch.no_grad():
        return model.eval()(ids)


def hf_logits(path, ids):
    model = transformers.AutoModelForCausalLM.from_pretrained(path).eval()
    with torch.no_grad():
        return model(ids).logits


def evaluated(args: list[str], capsys) -> dict:
    """`evaluate`'s JSON line, run in this process."""
    capsys.readouterr()
    assert main(["evaluate", *args]) == 0
    return json.loads(capsys.readouterr().out)


def transformers_loss(model, ids, block: int) -> float:
    """transformers' logits on the windows evaluate scores (`validation_windows`), their mean
    cross entropy (by hand: a GPT-2 of n_positions=block cannot read block + 1 tokens)."""
    windows, labels = validation_windows(ids, block)
    with torch.no_grad():
        logits = model.eval()(windows[:, :-1]).logits
    return F.cross_entropy(logits.flatten(0, 1), labels[:, 1:].flatten()).item()


def test_padding_rows_never_enter_the_loss(tmp_path, single_process, capsys):
    """A GPT-2 of 500 ids whose logits are all strongly negative (as OpenAI's GPT-2's are): the
    GPT pads its embedding to 512 rows, zeros past GPT-2's; logits of 0 for those 12 rows
    would dominate the softmax (the issue's 39.04 against transformers' 7.84). The package's
    evaluate gives transformers' loss on the same windows."""
    original = tiny_gpt2(tmp_path / "gpt2", vocab_size=500)
    direction = torch.nn.functional.normalize(torch.randn(32), dim=0)
    with torch.no_grad():  # every logit about -9: the final hidden state opposes every row
        original.transformer.wte.weight += 3.0 * direction
        original.transformer.ln_f.weight.fill_(0.1)
        original.transformer.ln_f.bias.copy_(-3.0 * direction)
    original.save_pretrained(tmp_path / "gpt2")
    ids = torch.randint(0, 500, (1, 32), generator=torch.Generator().manual_seed(0))
    assert original(ids).logits.max() < -2
    run = tmp_path / "run"
    args = [*TINY_GPT, *GPT2, *SHORT, *UNCHANGED, "vocab_size=500", f"run_dir={run}",
            f"init_from={tmp_path / 'gpt2'}"]  # fmt: skip
    assert main(args) == 0
    result = evaluated([f"run_dir={run}", "device=cpu"], capsys)
    seed = saved_config(load_model_state(run)[0]).seed
    val = TokenDataset.synthetic(500, SYNTHETIC_TOKENS, seed).val[0]
    assert result["scored_tokens"] == len(val) - 1
    expected = transformers_loss(original, val, 32)
    assert result["eval_loss"] == pytest.approx(expected, rel=1e-5)


def test_gpt2_weights_start_a_run_and_leave_as_gpt2(tmp_path, single_process):
    original = tiny_gpt2(tmp_path / "gpt2")
    run = tmp_path / "run"
    args = [
        *TINY_GPT,
        *GPT2,
        *SHORT,
        *UNCHANGED,
        f"run_dir={run}",
        f"init_from={tmp_path / 'gpt2'}",
    ]
    # with activation checkpointing: the names in and out are the model's own all the same
    assert main([*args, "activation_checkpointing=true"]) == 0
    ids = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = original(ids).logits
    # the package's GPT holds GPT-2's function (to float32 rounding and lr=1e-12 steps)
    torch.testing.assert_close(package_logits(run, ids), expected, rtol=0, atol=1e-4)
    assert main(["export", f"run_dir={run}", "--format", "hf", "--out", str(tmp_path / "out")]) == 0
    torch.testing.assert_close(hf_logits(tmp_path / "out", ids), expected, rtol=0, atol=1e-4)


def test_a_gpt_of_its_own_exports_with_its_tokenizer_and_in_shards(
    tmp_path, single_process, capsys
):
    """A GPT trained from scratch (no biases, exact GELU) on a BPE dataset: transformers loads
    the export (zero biases, gelu), its logits are the package's, its tokenizer the dataset's,
    and evaluate's loss is transformers' on the export (its vocabulary of under 300 ids is
    padded to 320 rows in the GPT: the padding rows enter no softmax). A dataset made with
    another tokenizer of the same size (two ids swapped) is refused by evaluate."""
    pytest.importorskip("datasets", reason="needs the [data] extra")
    tokenizers = pytest.importorskip("tokenizers", reason="needs the [data] extra")
    words = "alps node train token shard model batch step lustre cluster".split()
    docs = [" ".join(words[(i * 7 + j) % len(words)] for j in range(30)) for i in range(300)]
    (tmp_path / "docs.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    (tmp_path / "docs.txt").write_text("\n".join(docs))
    tok = tmp_path / "tokenizer.json"
    assert main(["train-tokenizer", "--text", str(tmp_path / "docs.txt"), "--vocab-size", "300",
                 "--out", str(tok)]) == 0  # fmt: skip
    data = tmp_path / "data"
    assert main(["make-dataset", "--hf", str(tmp_path / "docs.jsonl"), "--tokenizer", str(tok),
                 "--out", str(data)]) == 0  # fmt: skip
    run = tmp_path / "run"
    args = [*TINY_GPT, "vocab_size=0", f"dataset={data}", *SHORT, f"run_dir={run}"]
    assert main(args) == 0
    out = tmp_path / "out"
    export_hf(run, out, max_shard_bytes=40_000)  # a tiny shard size: several files and an index
    assert (out / "model.safetensors.index.json").is_file()
    assert len(list(out.glob("model-*-of-*.safetensors"))) > 1
    config = json.loads((out / "config.json").read_text())
    assert config["activation_function"] == "gelu" and config["vocab_size"] < 320
    ids = torch.randint(
        0, config["vocab_size"], (2, 32), generator=torch.Generator().manual_seed(2)
    )
    ours = package_logits(run, ids)[..., : config["vocab_size"]]
    torch.testing.assert_close(hf_logits(out, ids), ours, rtol=0, atol=1e-4)
    text = "alps node train token"
    loaded = transformers.AutoTokenizer.from_pretrained(out)
    assert loaded(text)["input_ids"] == tokenizers.Tokenizer.from_file(str(tok)).encode(text).ids
    result = evaluated([f"run_dir={run}", "device=cpu"], capsys)
    val = np.concatenate([np.asarray(shard) for shard in TokenDataset.open(data).val])
    exported = transformers.AutoModelForCausalLM.from_pretrained(out)
    assert result["eval_loss"] == pytest.approx(transformers_loss(exported, val, 32), rel=1e-5)

    swapped = json.loads(tok.read_text())  # the same size, two ids exchanged
    vocab = swapped["model"]["vocab"]
    first, second = sorted(vocab, key=vocab.get)[-2:]
    vocab[first], vocab[second] = vocab[second], vocab[first]
    (tmp_path / "swapped.json").write_text(json.dumps(swapped))
    other = tmp_path / "other"
    assert main(["make-dataset", "--hf", str(tmp_path / "docs.jsonl"), "--tokenizer",
                 str(tmp_path / "swapped.json"), "--out", str(other)]) == 0  # fmt: skip
    capsys.readouterr()
    assert main(["evaluate", f"run_dir={run}", f"dataset={other}", "device=cpu"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "trained on data made with the tokenizer sha256:" in err


CASES = ["gelu", "bias", "layers", "vocab", "truncated", "no_weights"]
CASES += ["rows", "by_layer", "unscaled"]  # the file's own shapes, settings the GPT lacks


@pytest.mark.parametrize("case", CASES)
def test_a_gpt2_that_is_not_the_configured_model_is_one_line(
    tmp_path, single_process, case, capsys
):
    tiny_gpt2(tmp_path / "gpt2")
    args = [
        *TINY_GPT,
        *GPT2,
        *SHORT,
        f"run_dir={tmp_path / 'run'}",
        f"init_from={tmp_path / 'gpt2'}",
    ]
    weights = tmp_path / "gpt2" / "model.safetensors"
    expected = {
        "gelu": "set gelu=tanh",
        "bias": "GPT-2 has biases: set bias=true",
        "layers": "its n_layer is 2, the run's n_layer is 3",
        "vocab": "its vocab_size is 256, the run's vocab_size (the dataset's or the config's)",
        "truncated": f"{weights}: cannot read the weights",
        "no_weights": "has no model.safetensors",
        "rows": "transformer.wte.weight has 200 rows but its config.json's vocab_size is 256",
        "by_layer": "its scale_attn_by_inverse_layer_idx is True: the GPT implements only False",
        "unscaled": "its scale_attn_weights is False: the GPT implements only True",
    }[case]
    settings = {"by_layer": {"scale_attn_by_inverse_layer_idx": True},
                "unscaled": {"scale_attn_weights": False}}.get(case, {})  # fmt: skip
    config = tmp_path / "gpt2" / "config.json"
    config.write_text(json.dumps(json.loads(config.read_text()) | settings))
    if case == "rows":  # fewer embedding rows than config.json's vocab_size
        from safetensors.torch import load_file, save_file

        tensors = load_file(weights)
        tensors["transformer.wte.weight"] = tensors["transformer.wte.weight"][:200].clone()
        save_file(tensors, weights, metadata={"format": "pt"})
    if case == "truncated":
        weights.write_bytes(weights.read_bytes()[:1000])
    if case == "no_weights":
        weights.unlink()
    change = {"gelu": ["gelu=exact"], "bias": ["bias=false"], "layers": ["n_layer=3"],
              "vocab": ["vocab_size=320"]}.get(case, [])  # fmt: skip
    assert main([*args, *change]) == 2
    err = capsys.readouterr().err
    assert expected in err.strip().splitlines()[-1] and "Traceback" not in err, err
    assert not list((tmp_path / "run").glob("checkpoints/step-*"))


def test_a_gpt_of_a_shorter_context_reads_the_first_positions(tmp_path, single_process, capsys):
    """GPT-2's 32 positions, a run of block_size=16: the position table is cut (as nanoGPT's
    crop_block_size), the log says so and names the model by its source."""
    original = tiny_gpt2(tmp_path / "gpt2")
    run = tmp_path / "run"
    args = [*TINY_GPT, *GPT2, *SHORT, *UNCHANGED, "block_size=16", f"run_dir={run}",
            f"init_from={tmp_path / 'gpt2'}"]  # fmt: skip
    assert main(args) == 0
    err = capsys.readouterr().err
    assert "transformer.wpe.weight cut from 32 to 16 rows" in err
    assert "gpt:gpt2 (init_from, preset tiny)" in err and "gpt:tiny," not in err
    ids = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = original(ids).logits
    torch.testing.assert_close(package_logits(run, ids), expected, rtol=0, atol=1e-4)
