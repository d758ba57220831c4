"""Exact resume on CPU ranks (gloo): after kill -9 with HSDP on 4 ranks (FSDP2 on a 2 x 2 mesh:
the code every sharded layout shares, tested on the MLP every training workload keeps) and after
a preemption signal to one of 2 DDP ranks; the same losses under HSDP, FSDP and DDP; resharding
(a 4-rank HSDP checkpoint continued by FSDP on 2 ranks and by DDP on 1); HSDP's refusals.

Each interrupted run must end with model, optimizer, schedule and RNG state bit-identical to the
uninterrupted reference run (same seeds, same world size; gloo on CPU is deterministic).
"""

import hashlib
import re
import shutil
import signal

import pytest
import torch
from _layouts import assert_the_same_losses, losses_per_layout
from conftest import (
    HSDP_4,
    TINY,
    Ranks,
    assert_same_training_state,
    checkpoint_steps,
    kill_9_then_resume,
    last_logged_step,
    train_ranks,
)

from {{ cookiecutter.package_name }} import parallel
from {{ cookiecutter.package_name }}.config.settings import ConfigError, load_config

FINAL = 80


def test_reference_run_finished(reference_run):
    assert checkpoint_steps(reference_run) == [60, 70, 80]  # keep_checkpoints=3
    assert (reference_run / "config.toml").exists()
    assert not (reference_run / "REQUEUE").exists()
    assert not (reference_run / "LOCK").exists()  # released at the end


def test_a_blow_up_on_two_ranks_stops_both_and_keeps_the_last_checkpoint(reference_run, tmp_path):
    """The reference run continued at lr 1000 throughout (force_resume): a NaN or inf within a
    few steps, found at the next log step (every step in TINY); both ranks exit 4, rank 0 says it
    in one line, and the step-80 checkpoint is byte for byte what it was, with none after it."""
    run_dir = tmp_path / "run"
    shutil.copytree(reference_run, run_dir)
    last = run_dir / "checkpoints" / f"step-{FINAL:08d}"

    def digest() -> dict[str, str]:
        files = sorted(p for p in last.rglob("*") if p.is_file())
        return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}

    before = digest()
    extra = ["max_steps=100", "lr=1000", "min_lr=1000", "force_resume=true", "dropout=0"]
    ranks = train_ranks(run_dir, tmp_path / "logs", extra)
    assert ranks.wait() == [4, 4], ranks.tails()  # once rank 1 alone ended with 1: its log
    (line,) = [line for line in ranks.log(0).splitlines() if " ERROR " in line]
    pattern = r"diverged: (gradient norm|loss) (nan|inf) at step (\d+) \((ranks?) [0-9, ]+\)"
    found = re.search(pattern + r"; stopped at step (\d+) with no checkpoint of it", line)
    assert found and int(found[3]) > FINAL and found[3] == found[5], line
    assert f"its checkpoint of step {FINAL}" in line
    assert " ERROR " not in ranks.log(1) and "Traceback" not in ranks.log(0) + ranks.log(1)
    assert checkpoint_steps(run_dir) == [60, 70, FINAL] and digest() == before
    assert not (run_dir / "REQUEUE").exists()


def kill_mid_run_then_resume(reference, tmp_path, extra, world, kill_at, final):
    run_dir = tmp_path / "run"
    argv = [*TINY, f"run_dir={run_dir}", *extra]
    kill_9_then_resume(argv, run_dir, tmp_path / "logs", kill_at, final, world)
    assert_same_training_state(reference, run_dir, final)


def test_hsdp_kill_9_then_same_command_resumes_exactly(hsdp_reference_run, tmp_path):
    """What a kill leaves on disk does not depend on the layout (DDP's exact resume: the
    signal's test below); HSDP's 4 ranks hold the most kinds of state: shards and replicas."""
    kill_mid_run_then_resume(hsdp_reference_run, tmp_path, HSDP_4, world=4, kill_at=15, final=30)


def test_hsdp_fsdp_and_ddp_train_the_same_losses_on_four_ranks(tmp_path):
    """The same model, data and per-rank dropout on 4 ranks: HSDP (2 groups of 2), FSDP over
    all 4 and DDP train the same losses (_layouts.py; the GPT's: test_language_runs.py)."""
    ranks, output = losses_per_layout(TINY, tmp_path)
    assert "each block sharded over a group of 2 ranks, 2 replicas" in output
    assert_the_same_losses(ranks)


def test_hsdp_checkpoint_resumes_under_fsdp_on_two_ranks_and_ddp_on_one(
    hsdp_reference_run, tmp_path, cli
):
    """Resharding across layouts: the 4-rank HSDP run's step-10 checkpoint continued by FSDP
    on 2 ranks and by DDP on 1 (in this process), no force; that the tensors come back
    exactly whatever the layout: test_checkpoint_dcp.py."""
    runs = {}
    for name in ("fsdp", "ddp"):
        run_dir = tmp_path / name
        shutil.copytree(hsdp_reference_run, run_dir)
        for step in (20, 30):
            shutil.rmtree(run_dir / "checkpoints" / f"step-{step:08d}")
        runs[name] = run_dir
    argv = [*TINY, "max_steps=30", "eval_every=0"]
    fsdp = Ranks([*argv, f"run_dir={runs['fsdp']}", "parallelism=fsdp"], tmp_path / "logs")
    ddp = cli("train", *argv, f"run_dir={runs['ddp']}", "parallelism=ddp")
    assert fsdp.wait() == [0, 0], fsdp.log(0)[-3000:]
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    for run_dir, log, world in ((runs["fsdp"], fsdp.log(0), 2), (runs["ddp"], ddp.stderr, 1)):
        assert "from checkpoint step 10" in log and f"world size 4 -> {world}" in log
        assert checkpoint_steps(run_dir)[-1] == 30 and last_logged_step(run_dir) == 30


def test_hsdp_refuses_in_one_line_what_it_cannot_shard(tmp_path, cli):
    """On one rank (nothing to shard or replicate; the run directory is not made), a world that
    is not a multiple of the shard groups, hsdp_shard with another layout, fp16."""
    run_dir = tmp_path / "run"
    cases = [
        (["parallelism=hsdp"], "hsdp on one rank has nothing to shard or replicate; train on"),
        (["parallelism=fsdp", "hsdp_shard=2"], "'hsdp_shard' applies to parallelism=hsdp, but"),
        (["parallelism=hsdp", "precision=fp16"], "fp16 is not supported with hsdp; use bf16"),
    ]
    for overrides, message in cases:
        refused = cli("train", *TINY, f"run_dir={run_dir}", *overrides)
        assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
        (line,) = [line for line in refused.stderr.splitlines() if " INFO " not in line]
        assert message in line
        assert not run_dir.exists()
    cfg = load_config(None, ["parallelism=hsdp"]).config
    assert parallel.mesh_shape(cfg, 8, 4) == (2, 4)  # hsdp_shard=0: a node's ranks
    with pytest.raises(ConfigError, match=r"world size 6 is not a multiple of hsdp_shard=0, the 4"):
        parallel.check_layout(cfg, 6, 4)
    cfg = load_config(None, ["parallelism=hsdp", "hsdp_shard=4"]).config
    with pytest.raises(ConfigError, match=r"world size 2 is not a multiple of hsdp_shard=4"):
        parallel.check_layout(cfg, 2, 2)


def test_hsdp_places_each_parameter_on_a_replicate_x_shard_mesh(tmp_path):
    """apply_fsdp with a (replicate, shard) shape: the parameters are DTensors replicated on
    the first dimension and sharded by rows on the second (one process: a 1 x 1 mesh)."""
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor, Replicate, Shard

    from {{ cookiecutter.package_name }}.models import mlp

    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 4))
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        parallel.apply_fsdp(mlp.SPEC, model, torch.device("cpu"), False, False, (1, 1))
        for param in model.parameters():
            assert isinstance(param, DTensor)
            assert param.placements == (Replicate(), Shard(0))
            assert param.device_mesh.mesh_dim_names == ("replicate", "shard")
    finally:
        dist.destroy_process_group()


def test_signal_to_one_rank_stops_all_with_one_checkpoint_and_resumes(reference_run, tmp_path):
    run_dir = tmp_path / "run"
    extra = ["checkpoint_every=0"]  # no periodic checkpoints: the only one is the preemption's
    ranks = train_ranks(run_dir, tmp_path / "logs1", extra)
    ranks.wait_for_step(run_dir, 30)
    assert ranks.running()
    ranks.send(signal.SIGUSR1, ranks=[1])  # USR2, the job scripts' signal: the Slurm tests
    assert ranks.wait() == [3, 3], ranks.log(0)[-3000:]

    steps = checkpoint_steps(run_dir)
    assert len(steps) == 1 and 30 <= steps[0] < FINAL
    marker = (run_dir / "REQUEUE").read_text()
    assert marker.startswith(f"step {steps[0]}:")
    for rank in (0, 1):
        assert f"stopping at step {steps[0]}" in ranks.log(rank)
    assert "received SIGUSR1" in ranks.log(1)
    assert "another rank asked to stop" in ranks.log(0)

    again = train_ranks(run_dir, tmp_path / "logs2", extra)
    assert again.wait() == [0, 0], again.log(0)[-3000:]
    assert not (run_dir / "REQUEUE").exists()
    assert_same_training_state(reference_run, run_dir, FINAL)
