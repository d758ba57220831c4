"""Checkpoints across ranks (gloo on CPU): written by 2 ranks, loaded by 1 and by 2 (replicated
DDP model, FSDP2 `fully_shard` model, HSDP's 2-D mesh, and HSDP's checkpoint into FSDP), an
async save killed before it completed is skipped,
and every rank's random states come back. The ranks run tests/_ckpt_driver.py."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import assert_identical, free_port, rank_env

from {{ cookiecutter.package_name }} import checkpoint

TESTS = Path(__file__).resolve().parent
DRIVER = TESTS / "_ckpt_driver.py"
TIMEOUT_S = 120  # two ranks save and load a few times


def launch(mode: str, root: Path, world: int) -> list[tuple[int, str]]:
    """Run `world` driver ranks; (exit status, output) of each."""
    port, procs = free_port(), []
    for rank in range(world):
        env = rank_env(rank, world, port)
        procs.append(
            subprocess.Popen(
                [sys.executable, str(DRIVER), mode, str(root)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    try:
        return [(p.wait(TIMEOUT_S), p.stdout.read()) for p in procs]
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        pytest.fail(f"{mode} with {world} ranks did not finish in {TIMEOUT_S} s")


def record(root: Path, name: str) -> dict:
    return torch.load(root / "out" / f"{name}.pt", weights_only=False)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Checkpoints by one process (no group) and by 2 ranks, then loads with 1 and 2 ranks."""
    root = tmp_path_factory.mktemp("dcp")
    sys.path.insert(0, str(TESTS))
    import _ckpt_driver

    with pytest.MonkeyPatch.context() as mp:
        for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
            mp.delenv(key, raising=False)
        _ckpt_driver.main("save", root)  # in this process, without a process group
    logs = {}
    for mode, world, expected in (("save", 2, -9), ("load", 1, 0), ("load", 2, 0)):
        if mode == "load" and world == 2:  # damage a file that rank 1 verifies, rank 0 wrote
            shutil.copytree(root / "ddp", root / "corrupt")
            shard = root / "corrupt" / "step-00000004" / "__0_0.distcp"
            data = bytearray(shard.read_bytes())
            data[len(data) // 2 : len(data) // 2 + 256] = b"\xff" * 256
            shard.write_bytes(bytes(data))
        results = launch(mode, root, world)
        logs[mode, world] = [output for _, output in results]
        statuses = [status for status, _ in results]
        assert statuses == [expected] * world, f"{mode} x{world}: {statuses}\n{results[0][1]}"
    return root, logs


def test_killed_async_save_is_skipped(runs):
    root, logs = runs
    killed = root / "fsdp" / "step-00000006"
    assert killed.is_dir() and not checkpoint.is_complete(killed), "the kill came too late"
    for world in (1, 2):
        assert "skipping incomplete checkpoint" in logs["load", world][0]
        assert killed.name in logs["load", world][0]
        assert record(root, f"load-w{world}-fsdp-into-fsdp-rank0")["step"] == 4
    assert checkpoint.complete_steps(root / "fsdp") == [2, 4]


@pytest.mark.parametrize(
    "name",
    ["ddp-into-ddp", "fsdp-into-fsdp", "fsdp-into-plain", "hsdp-into-hsdp", "hsdp-into-fsdp"],
)
def test_two_rank_checkpoint_loads_with_one_rank(runs, name):
    root, logs = runs
    saved = record(root, f"save-w2-{name.split('-')[0]}-into-{name.split('-')[0]}-rank0")
    loaded = record(root, f"load-w1-{name}-rank0")
    assert loaded["step"] == 4 and loaded["extra"] == {"world_size": 2}
    assert_identical(saved["state"], loaded["state"])
    assert_identical(saved["draws"], loaded["draws"], "rank 0 random draws")
    assert loaded["rng_note"] is None


@pytest.mark.parametrize("name", ["ddp-into-ddp", "fsdp-into-fsdp", "hsdp-into-hsdp"])
def test_two_rank_checkpoint_resumes_bit_identically_with_two_ranks(runs, name):
    root, _ = runs
    for rank in (0, 1):
        saved = record(root, f"save-w2-{name}-rank{rank}")
        loaded = record(root, f"load-w2-{name}-rank{rank}")
        assert loaded["step"] == 4
        assert_identical(saved["draws"], loaded["draws"], f"rank {rank} random draws")
        assert_identical(saved["after"], loaded["after"], f"rank {rank} after one more step")
        if rank == 0:
            assert_identical(saved["state"], loaded["state"])


def test_hsdp_checkpoint_loads_into_fsdp_with_two_ranks(runs):
    """Written on a 2 x 1 mesh (replicas), read on FSDP's one dimension of 2 (shards)."""
    root, _ = runs
    saved = record(root, "save-w2-hsdp-into-hsdp-rank0")
    loaded = record(root, "load-w2-hsdp-into-fsdp-rank0")
    assert loaded["step"] == 4
    assert_identical(saved["state"], loaded["state"])


def test_one_process_checkpoint_loads_with_two_ranks_and_reseeds_the_new_rank(runs):
    root, logs = runs
    saved = record(root, "save-w1-single-into-ddp-rank0")
    first, second = (record(root, f"load-w2-single-into-ddp-rank{r}") for r in (0, 1))
    assert_identical(saved["state"], first["state"])
    assert_identical(saved["draws"], first["draws"], "rank 0 random draws")
    assert first["rng_note"] is None
    assert "rank 1 has none and is reseeded" in second["rng_note"]
    assert "reseeded" in logs["load", 2][1]
    assert not torch.equal(second["draws"]["torch"], first["draws"]["torch"])


def test_load_model_state_assembles_the_shards(runs):
    root, _ = runs
    config, state = checkpoint.load_model_state(root / "fsdp")
    saved = record(root, "save-w2-fsdp-into-fsdp-rank0")
    assert config == {}  # the driver saves no config
    assert_identical(saved["state"]["model"], state, "model")


def test_corrupt_file_found_by_another_rank_skips_the_checkpoint_on_all(runs):
    root, logs = runs
    for rank in (0, 1):
        assert record(root, f"load-w2-corrupt-into-ddp-rank{rank}")["step"] == 2
    assert "__0_0.distcp does not match its sha256" in logs["load", 2][0]


def test_diverged_replicas_are_refused(runs):
    root, _ = runs
    for rank in (0, 1):
        loaded = record(root, f"load-w2-ddp-into-ddp-rank{rank}")
        assert "model replicas differ between ranks" in loaded["replicas"]
