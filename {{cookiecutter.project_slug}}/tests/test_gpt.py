"""The GPT: configuration, causal attention, parameter and FLOP counts, sampling, and learning."""

import time

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from {{ cookiecutter.package_name }} import models, parallel
from {{ cookiecutter.package_name }}.data import tokens
from {{ cookiecutter.package_name }}.data.info import token_batch
from {{ cookiecutter.package_name }}.make_dataset import text_files
from {{ cookiecutter.package_name }}.models import gpt, spec


def tiny(**overrides) -> gpt.GPT:
    torch.manual_seed(0)
    return gpt.GPT(gpt.gpt_config("tiny", 256, **overrides))


def test_presets_overrides_and_padded_vocabulary():
    cfg = gpt.gpt_config("gpt2-124m", 50257)
    assert (cfg.n_layer, cfg.n_head, cfg.n_embd, cfg.block_size) == (12, 12, 768, 1024)
    assert cfg.vocab_size == 50304 and cfg.vocab_size % 64 == 0
    assert [gpt.padded_vocab(v) for v in (1, 64, 65, 256)] == [64, 64, 128, 256]
    cfg = gpt.gpt_config("tiny", 256, n_layer=3, block_size=0, n_embd=None, dropout=0.1)
    assert (cfg.n_layer, cfg.block_size, cfg.n_embd, cfg.dropout) == (3, 64, 64, 0.1)
    with pytest.raises(ValueError, match="n_embd .65. must be a multiple of n_head .2."):
        gpt.gpt_config("tiny", 256, n_embd=65)
    with pytest.raises(ValueError, match="unknown GPT preset 'gpt5'; choose one of tiny"):
        gpt.gpt_config("gpt5", 256)
    with pytest.raises(ValueError, match="unknown GPT setting 'n_layers'"):
        gpt.gpt_config("tiny", 256, n_layers=4)
    with pytest.raises(ValueError, match="n_layer must be a positive integer"):
        gpt.gpt_config("tiny", 256, n_layer=-1)
    with pytest.raises(ValueError, match="vocab_size"):
        gpt.gpt_config("tiny", 0)


def test_embeddings_are_tied_and_counted_once():
    model = tiny()
    assert model.lm_head.weight is model.wte.weight
    unique = {id(p): p.numel() for p in model.parameters()}
    assert gpt.num_params(model, exclude_position_embeddings=False) == sum(unique.values())
    assert gpt.num_params(model) == sum(unique.values()) - 64 * 64  # minus wpe (block x embd)


def test_activation_checkpointing_keeps_the_names_and_the_gradients():
    """Recomputing each block in backward changes neither the state-dict names (checkpoints and
    exports are the same with the setting on or off) nor the gradients."""
    plain, checkpointed = tiny(), tiny()
    parallel.apply_activation_checkpointing(models.MODELS["gpt"], checkpointed)
    assert list(checkpointed.state_dict()) == list(plain.state_dict())
    x = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(0))
    for model in (plain, checkpointed):
        F.cross_entropy(model(x).flatten(0, 1), x.flatten()).backward()
    for (name, a), b in zip(plain.named_parameters(), checkpointed.parameters(), strict=True):
        torch.testing.assert_close(b.grad, a.grad, rtol=0, atol=0, msg=name)


def test_gpt2_124m_has_124m_parameters():
    # On the meta device: shapes only, no memory, no time.
    with torch.device("meta"):
        model = gpt.GPT(gpt.gpt_config("gpt2-124m", 50257))
        with_bias = gpt.GPT(gpt.gpt_config("gpt2-124m", 50257, bias=True))
    assert gpt.num_params(model) == 123_587_328  # without the 1024 x 768 position embedding
    assert gpt.num_params(model, exclude_position_embeddings=False) == 124_373_760
    assert gpt.num_params(with_bias) == 123_689_472  # nanoGPT's "123.69M" (GPT-2 had biases)


def test_flops_per_token_is_6n_plus_12ldt():
    model = tiny()
    # wte 256*64 + 2 blocks * (2 LayerNorms 2*64 + qkv 64*192 + proj 64*64 + MLP 2*64*256)
    # + final LayerNorm 64
    n = 256 * 64 + 2 * (2 * 64 + 64 * 192 + 64 * 64 + 2 * 64 * 256) + 64
    assert gpt.num_params(model) == n == 115_008
    assert gpt.flops_per_token(model.config, n) == 6 * 115_008 + 12 * 2 * 64 * 64 == 788_352
    cfg = gpt.gpt_config("gpt2-124m", 50257)
    assert gpt.flops_per_token(cfg, 123_587_328) == 854_770_176  # ~0.85 GFLOP per token


def test_gpt2_initialisation_scales_the_residual_projections():
    model = gpt.GPT(gpt.gpt_config("tiny", 256, n_layer=8, n_embd=256, n_head=4))
    block = model.blocks[0]
    assert abs(block.mlp.c_fc.weight.std().item() - 0.02) < 0.001
    assert abs(block.mlp.c_proj.weight.std().item() - 0.02 / 4) < 0.0005  # 1/sqrt(2 * 8)
    assert abs(block.attn.c_proj.weight.std().item() - 0.02 / 4) < 0.0005


def future_leaks(model: gpt.GPT) -> bool:
    """Does changing token 10 change any logit before position 10?"""
    idx = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(1))
    changed = idx.clone()
    changed[:, 10] = (idx[:, 10] + 1) % 256
    with torch.no_grad():
        a, b = model(idx), model(changed)
    assert not torch.equal(a[:, 10:], b[:, 10:])  # the changed token itself matters
    return not torch.equal(a[:, :10], b[:, :10])


def test_attention_is_causal(monkeypatch):
    model = tiny().eval()
    assert not future_leaks(model)

    # The check catches a model that attends to the future.
    sdpa = F.scaled_dot_product_attention

    def bidirectional(q, k, v, **kwargs):
        return sdpa(q, k, v, **{**kwargs, "is_causal": False})

    monkeypatch.setattr(F, "scaled_dot_product_attention", bidirectional)
    assert future_leaks(model)


def test_forward_shape_and_context_limit():
    model = tiny()
    assert model(torch.zeros(3, 64, dtype=torch.long)).shape == (3, 64, 256)
    with pytest.raises(ValueError, match="65 tokens is longer than the model's block_size 64"):
        model(torch.zeros(1, 65, dtype=torch.long))


def test_the_language_model_loss_is_float32_cross_entropy():
    logits = torch.randn(2, 5, 64).bfloat16()
    targets = torch.randint(0, 64, (2, 5))
    loss = spec.cross_entropy(logits, targets)
    assert loss.dtype == torch.float32
    expected = F.cross_entropy(logits.float().view(10, 64), targets.view(10))
    assert torch.allclose(loss, expected)
    per_token = spec.cross_entropy(logits, targets, reduction="none")
    assert per_token.shape == (10,) and torch.allclose(per_token.mean(), expected)  # per token


def test_sample_length_greedy_top_k_and_context_cropping():
    model = tiny(block_size=16).train()
    prompt = torch.tensor([list(b"def main(") * 3])  # 27 tokens: longer than the context
    out = spec.sample(model, prompt, 20, 16, generator=torch.Generator().manual_seed(0))
    assert out.shape == (1, 47) and torch.equal(out[:, :27], prompt)
    assert model.training  # the mode is restored
    greedy = spec.sample(model, prompt, 20, 16, temperature=0)
    top1 = spec.sample(model, prompt, 20, 16, top_k=1, generator=torch.Generator().manual_seed(5))
    assert torch.equal(greedy, top1)
    again = spec.sample(model, prompt, 20, 16, generator=torch.Generator().manual_seed(0))
    assert torch.equal(out, again)
    small = spec.sample(model, prompt, 50, 16, temperature=2.0, vocab_size=5)
    assert small[:, 27:].max() < 5  # padding rows of the vocabulary are never sampled


def unigram_entropy(data: np.ndarray) -> float:
    p = np.bincount(data, minlength=256) / len(data)
    p = p[p > 0]
    return float(-(p * np.log(p)).sum())


def mean_loss(model, batch: dict) -> torch.Tensor:
    """The language model task's loss of a batch over the targets it scores: its mean."""
    return spec.LANGUAGE_MODEL.loss(model, batch) / spec.LANGUAGE_MODEL.count(batch)


def prefix_loss(model: gpt.GPT, x: torch.Tensor, y: torch.Tensor) -> float:
    """Mean next-token loss with each position predicted from its prefix alone (the model never
    sees a later token, whatever its attention does): how the model is used when sampling."""
    with torch.no_grad():
        losses = [
            spec.cross_entropy(model(x[:, : t + 1])[:, -1], y[:, t]) for t in range(x.shape[1])
        ]
    return torch.stack(losses).mean().item()


# The slowest test of the package (~20-40 s on one core): a real language model learns.
def test_tiny_gpt_learns_python_source_well_below_the_unigram_entropy(tmp_path):
    torch.set_num_threads(1)
    torch.manual_seed(0)
    chosen, size = [], 0
    for path in text_files.stdlib_files()[::3]:  # ~1.5 MB spread over the whole standard library
        chosen.append(path)
        size += path.stat().st_size
        if size > 1_500_000:
            break
    text_files.write_text_dataset(chosen, tmp_path / "ds", val_fraction=0.02)
    data = tokens.TokenDataset.open(tmp_path / "ds")
    model = gpt.GPT(gpt.gpt_config("tiny", data.vocab_size))
    block = model.config.block_size
    steps, batch, lr = 400, 32, 5e-3
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    start = time.perf_counter()
    for step in range(steps):
        for group in opt.param_groups:  # 20 warm-up steps, then cosine down to lr / 10
            decay = 0.1 + 0.45 * (1 + np.cos(np.pi * step / steps))
            group["lr"] = lr * min(1.0, (step + 1) / 20) * decay
        windows = data.train_batch(
            seed=0, step=step, micro=0, rank=0, batch_size=batch, block_size=block
        )
        loss = mean_loss(model, windows)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    seconds = time.perf_counter() - start

    # Validation windows read straight from the shard file, independent of train_batch: a model
    # trained on wrongly shifted targets does not predict the next byte here.
    val = np.fromfile(tmp_path / "ds" / "val-00000.bin", dtype="<u2").astype(np.int64)
    starts = np.arange(64) * block
    windows = torch.from_numpy(val[starts[:, None] + np.arange(block + 1)])
    x, y = windows[:, :-1], windows[:, 1:]
    model.eval()
    with torch.no_grad():
        teacher_forced = mean_loss(model, token_batch(x, y)).item()
    honest = prefix_loss(model, x, y)
    unigram = unigram_entropy(val)
    print(
        f"\n{steps} steps in {seconds:.1f} s: train loss {loss.item():.3f}, val loss "
        f"{honest:.3f} nats (teacher-forced {teacher_forced:.3f}), unigram entropy {unigram:.3f}"
    )
    assert abs(teacher_forced - honest) < 1e-3  # causal: the whole window gives the same losses
    assert honest < unigram - 0.3  # measured: 2.34 vs 2.87 nats
