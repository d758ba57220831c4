"""`benchmark` on token windows: the package's step against the bare loop (one batch, no data
read) and against the loop that reads each batch inline from the same shards (nanoGPT's
get_batch); and the package's own inline input, which draws several steps' windows at once."""

import json
import shutil

import numpy as np
import pytest
import torch
from _language import TINY_GPT

from {{ cookiecutter.package_name }} import distributed
from {{ cookiecutter.package_name }}.cli import main
from {{ cookiecutter.package_name }}.config.settings import load_config
from {{ cookiecutter.package_name }}.data import batches as data
from {{ cookiecutter.package_name }}.data.kinds import open_splits
from {{ cookiecutter.package_name }}.data.tokens import TokenDataset, read_windows
from {{ cookiecutter.package_name }}.make_dataset import text_files
from {{ cookiecutter.package_name }}.models import spec_of
from {{ cookiecutter.package_name }}.training import baselines
from {{ cookiecutter.package_name }}.training.build import build


@pytest.fixture(scope="module")
def token_shards(tmp_path_factory):
    """30,000 byte tokens (i % 251: windows at different positions differ) in shards of 4096."""
    root = tmp_path_factory.mktemp("bench-tokens")
    np.save(root / "ids.npy", np.arange(30000) % 251)
    text_files.write_token_dataset(
        root / "ids.npy", 256, root / "ds", shard_tokens=4096, min_val_tokens=2000
    )
    return root / "ds"


def tokens_run(dataset, *extra):
    cfg = load_config(None, [*TINY_GPT, f"dataset={dataset}", *extra]).config
    return cfg, open_splits(cfg, spec_of(cfg))


def test_the_inline_loop_reads_the_packages_windows_from_the_shards(token_shards, tmp_path):
    cfg, source = tokens_run(token_shards)
    copy = tmp_path / "ds"
    shutil.copytree(token_shards, copy)
    dataset = TokenDataset.open(copy)
    for step, micro in ((0, 0), (3, 1), (17, 0)):
        x, y = read_windows(dataset, cfg.seed, step, micro, 0, cfg.batch_size, 32)
        expected = source.draw(cfg.seed, step, micro, 0, cfg.batch_size)
        assert torch.equal(x, expected["inputs"]) and torch.equal(y, expected["targets"])
    # It reads the files at every batch: other tokens on disk are other batches, and a shard
    # gone is an error (its windows are not held in memory).
    for shard in copy.glob("train-*.bin"):
        shard.write_bytes(np.zeros(len(np.fromfile(shard, np.uint16)), np.uint16).tobytes())
    x, _ = read_windows(dataset, cfg.seed, 0, 0, 0, cfg.batch_size, 32)
    assert not x.any()
    next(copy.glob("train-*.bin")).unlink()
    with pytest.raises(FileNotFoundError):
        read_windows(dataset, cfg.seed, 0, 0, 0, cfg.batch_size, 32)


def test_with_one_rank_the_loops_step_the_runs_own_model(token_shards, single_process):
    """Two copies of one model can differ in speed by where their tensors lie: with one rank the
    bare and inline loops step the run's model and optimizer, so a ratio compares loops only."""
    cfg, _ = tokens_run(token_shards, "device=cpu")
    with distributed.process_group(cfg.dist_timeout_s, 1, "cpu") as (env, device):
        run = build(cfg, env, device)
        batch = run.source.draw(cfg.seed, 0, 0, 0, cfg.batch_size)
        for loop in (baselines.bare_loop(run, batch), baselines.inline_loop(run)):
            before = [p.detach().clone() for p in run.model.parameters()]
            steps_before = [float(s.get("step", 0)) for s in run.optimizer.state.values()]
            loop.step()
            after = list(run.model.parameters())
            assert all(not torch.equal(b, a) for b, a in zip(before, after, strict=True))
            assert [float(s["step"]) for s in run.optimizer.state.values()] != steps_before


def test_the_benchmark_compares_token_runs_with_the_inline_loop_too(
    token_shards, single_process, capsys
):
    argv = ["benchmark", *TINY_GPT, f"dataset={token_shards}", "bench_warmup=1", "bench_steps=10"]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    result = json.loads(out)
    assert result["baseline"].startswith("bare:") and "no data read" in result["baseline"]
    assert "np.memmap" in result["inline_baseline"]
    assert result["inline_step_median_s"] > 0 and result["inline_tokens_per_s"] > 0
    # one round: the ratio of the package's block to the inline loop's (CPU time per step)
    blocks = result["blocks"]
    assert result["inline_ratio"] == pytest.approx(blocks["train"][0] / blocks["inline"][0])
    assert "a bare PyTorch loop on the same model and batch that reads no data" in err
    sentence = f"ratio {result['inline_ratio']:.3f} against that loop reading each batch"
    meets = "meets" if round(result["inline_ratio"], 3) <= 1.0 else "misses"
    assert sentence in err and f"nanoGPT's way ({meets} its target of 1.00)" in err


def test_inline_input_draws_the_windows_of_several_steps_at_once(token_shards, monkeypatch):
    """Without loader processes the micro-batches are those of one draw each, in the same order,
    from any start step; the draws are made DRAW_AHEAD_STEPS steps at a time."""
    cfg, source = tokens_run(token_shards)  # grad_accum_steps=2
    calls = []
    draw_many = source.draw_many
    monkeypatch.setattr(source, "draw_many", lambda *a: calls.append(a[1]) or draw_many(*a))
    batches = data.StepBatches(source, cfg, 0, 1, start_step=3, samples_seen=0)
    inline = list(data.micro_batches(batches, 26, workers=0, pin=False))
    assert len(inline) == 23 * 2
    for k, batch in enumerate(inline):
        step, micro = divmod(k, 2)
        expected = source.draw(cfg.seed, 3 + step, micro, 0, cfg.batch_size)
        assert batch.keys() == expected.keys() == {"inputs", "targets"}
        assert all(torch.equal(batch[name], expected[name]) for name in batch)
    steps = data.DRAW_AHEAD_STEPS
    assert [keys[0] for keys in calls] == [(3, 0), (3 + steps, 0), (3 + 2 * steps, 0)]
