"""One rank of the multi-rank checkpoint tests (test_checkpoint_dcp.py), gloo on CPU.

    python tests/_ckpt_driver.py save|load DIR     (RANK, WORLD_SIZE, MASTER_ADDR/PORT set;
                                                    without them: one process, no group)

save: train a replicated (DDP), an HSDP (FSDP2 on a world x 1 mesh: every rank a replica of
shards of one rank) and an FSDP2 model, checkpoint steps 2 and 4 (FSDP asynchronously, the
others synchronously), record what a resumed run must reproduce, then start an async save of
step 6 and SIGKILL itself before it can complete.
load: load the newest checkpoint of each (and the HSDP one into FSDP: another layout and shard
size) and record what it restored.
Records go to DIR/out/<mode>-w<world>-<kind>-rank<r>.pt for the test to compare.
"""

from __future__ import annotations

import copy
import os
import random
import signal
import sys
from datetime import timedelta
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP

from {{ cookiecutter.package_name }}.checkpoint import (
    CheckpointManager,
    ModelAndOptimizer,
    RNGState,
    TrainState,
    check_replicas,
)


def build(kind: str, world: int):
    torch.manual_seed(0)  # the same initial weights on every rank
    blocks = [
        torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Dropout(0.25))
        for _ in range(3)
    ]
    model = torch.nn.Sequential(*blocks, torch.nn.Linear(16, 4))
    if kind in ("fsdp", "hsdp"):
        shape = (world,) if kind == "fsdp" else (world, 1)
        names = None if kind == "fsdp" else ("replicate", "shard")
        mesh = init_device_mesh("cpu", shape, mesh_dim_names=names)
        for block in blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
    elif world > 1:
        model = DDP(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0 / (1 + s))
    return model, optimizer, scheduler


def train_step(model, optimizer, scheduler, step: int, rank: int) -> None:
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(1000 * step + rank))
    model(x).square().mean().backward()  # dropout: depends on the torch RNG state
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)


def full_state(model, optimizer) -> dict:
    """Unsharded model and optimizer state on CPU (complete on rank 0)."""
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model_sd, optim_sd = get_state_dict(model, optimizer, options=options)
    return copy.deepcopy({"model": model_sd, "optim": optim_sd})  # not the live parameters


def draws(np_rng) -> dict:
    return {"torch": torch.rand(4), "python": random.random(), "numpy": np_rng.random()}


def main(mode: str, root: Path) -> None:
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    if "MASTER_ADDR" in os.environ:
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
            rank=rank,
            world_size=world,
            timeout=timedelta(seconds=60),
        )
    out = root / "out"
    out.mkdir(parents=True, exist_ok=True)

    def record(kind: str, **values) -> None:
        torch.save(values, out / f"{mode}-w{world}-{kind}-rank{rank}.pt")

    # (checkpoint directory, how this run wraps the model, async saves)
    runs = [("ddp", "ddp", False), ("hsdp", "hsdp", False), ("fsdp", "fsdp", True)]
    if not dist.is_initialized():  # one process without a process group
        runs = [("single", "ddp", False)]
    if mode == "load":
        runs.append(("hsdp", "fsdp", False))  # an HSDP checkpoint into FSDP's one dimension
    if mode == "load" and world == 1:
        runs.append(("fsdp", "plain", False))  # an FSDP checkpoint into an unwrapped model
    if mode == "load" and world == 2:
        runs.append(("single", "ddp", False))  # written by one process without a group
        runs.append(("corrupt", "ddp", False))  # step 4 damaged by the test
    managers = []
    for directory, kind, async_save in runs:
        model, optimizer, scheduler = build(kind, world)
        torch.manual_seed(10 + rank)  # per-rank randomness, as the training loop seeds it
        random.seed(10 + rank)
        np_rng = np.random.default_rng(10 + rank)
        train = TrainState()
        parts = {
            "app": ModelAndOptimizer(model, optimizer),
            "scheduler": scheduler,
            "train": train,
            "rng": RNGState(np_rng, seed=3),
        }
        manager = CheckpointManager(root / directory, parts, keep=3, async_save=async_save)
        managers.append(manager)
        name = f"{directory}-into-{kind}"
        if mode == "save":
            for step in range(1, 5):
                train_step(model, optimizer, scheduler, step, rank)
                if step % 2 == 0:
                    if kind == "ddp":
                        check_replicas(model)
                    train.step, train.extra = step, {"world_size": world}
                    manager.save(step)
            manager.wait()
            resumed = {"step": 4, "state": full_state(model, optimizer), "draws": draws(np_rng)}
        else:
            step = manager.load_latest()
            resumed = {"step": step, "state": full_state(model, optimizer), "draws": draws(np_rng)}
            resumed["rng_note"] = parts["rng"].note
            resumed["extra"] = train.extra
        train_step(model, optimizer, scheduler, 5, rank)
        resumed["after"] = full_state(model, optimizer)
        if mode == "load" and kind == "ddp" and world == 2:  # replicas made to diverge
            with torch.no_grad():
                next(model.parameters()).add_(float(rank))
            try:
                check_replicas(model)
            except RuntimeError as err:
                resumed["replicas"] = str(err)
        record(name, **resumed)
    if mode == "save" and dist.is_initialized():  # killed after async_save returned, before
        # the write is complete
        train.step = 6
        managers[-1].save(6)
        os.kill(os.getpid(), signal.SIGKILL)
    for manager in managers:
        manager.close()
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
