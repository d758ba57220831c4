"""The plain loops `benchmark` compares the package's training step with (commands/benchmark.py
times them): a bare loop on one batch already on the device, the same loop reading each batch
inline from the run's token shards as nanoGPT's get_batch does, and torchvision's reference loop
written plainly over decoded samples (data/plain_loader.py). Each steps the same model with the
same loss and AdamW as the package."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from itertools import count

import torch
from torch.nn.parallel import DistributedDataParallel

from .. import parallel
from ..config.settings import Config
from ..data.batches import map_tensors
from ..data.info import token_batch
from ..data.kinds import KINDS
from ..data.plain_loader import plain_batches, plain_collate, plain_training_set
from ..optim import make_optimizer


@dataclass
class Baseline:
    """The loop the package's step is compared with."""

    key: str  # the prefix of its figures: "bare" or "plain"
    description: str  # the JSON's "baseline"
    step: Callable[[], None]
    wait_s: Callable[[], float] | None = None  # its time spent waiting for input so far
    close: Callable[[], None] = lambda: None


def fresh_model(run) -> torch.nn.Module:
    """The run's model built again from the same seed, compiled as the run's, unwrapped."""
    torch.manual_seed(run.cfg.seed)
    model = run.spec.build(run.cfg, run.source.info)
    if run.cfg.compile:
        parallel.apply_compile(run.spec, model)
    return model.to(run.device)


def loop_model(run) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """The model and optimizer a plain loop steps. With one rank: the run's own, so that every
    loop computes on the same tensors in the same memory (two copies of the tiny GPT measured up
    to 1 % apart on a CPU, from where their tensors lay alone). With several: a copy, unwrapped
    (the run's is DDP-wrapped or sharded)."""
    if run.env.world_size == 1:
        return run.model, run.optimizer
    model = fresh_model(run)
    return model, make_optimizer(model, run.cfg, run.device)


def optimizer_step(model: torch.nn.Module, optimizer, cfg: Config) -> None:
    if cfg.grad_clip > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def mean_loss(task, model: torch.nn.Module, batch, accum: int) -> torch.Tensor:
    """What a plain loop back-propagates per micro-batch: the batch's mean loss over what it
    scores (cross entropy's mean with its ignore_index), over the number of micro-batches."""
    return task.loss(model, batch) / task.count(batch).clamp(min=1) / accum


def bare_loop(run, batch) -> Baseline:
    """Forward, backward and AdamW on one batch that is already on the device."""
    cfg, (model, optimizer) = run.cfg, loop_model(run)

    def step():
        for _ in range(cfg.grad_accum_steps):
            with run.autocast():
                loss = mean_loss(run.spec.task, model, batch, cfg.grad_accum_steps)
            loss.backward()
        optimizer_step(model, optimizer, cfg)

    return Baseline("bare", "bare: one batch already on the device, no data read", step)


def inline_loop(run) -> Baseline | None:
    """The bare loop reading each micro-batch inline from the run's token shards (the kind's
    `inline_windows`: data/tokens.py's read_windows), the same steps' windows as the package,
    copied to the device as nanoGPT does. None: the run's kind has no such reader."""
    cfg, device = run.cfg, run.device
    kind = KINDS.get(run.source.info.kind)
    if kind is None or kind.inline_windows is None:
        return None
    read, block = kind.inline_windows(cfg), run.spec.context_length(cfg)
    model, optimizer = loop_model(run)
    steps = count(run.state.step)

    def to_device(t: torch.Tensor) -> torch.Tensor:
        if device.type == "cuda":
            return t.pin_memory().to(device, non_blocking=True)
        return t

    def step():
        number = next(steps)
        for micro in range(cfg.grad_accum_steps):
            x, y = read(cfg.seed, number, micro, run.env.rank, cfg.batch_size, block)
            batch = token_batch(to_device(x), to_device(y))
            with run.autocast():
                loss = mean_loss(run.spec.task, model, batch, cfg.grad_accum_steps)
            loss.backward()
        optimizer_step(model, optimizer, cfg)

    source = "sliced from the same in-memory tokens"  # dataset=synthetic
    if cfg.dataset != "synthetic":
        source = "read from the same shards (np.memmap)"
    return Baseline("inline", f"inline: each batch {source}, nanoGPT's get_batch", step)


def plain_loop(run, workers: int) -> Baseline:
    """torchvision's reference loop written plainly (data/plain_loader.py): a DataLoader with
    a DistributedSampler, each batch copied to the device, the model in DDP over several ranks;
    the package's AdamW (make_optimizer, not the reference's SGD: the same optimizer on both
    sides), loss and autocast."""
    cfg, env, device = run.cfg, run.env, run.device
    dataset, reads = plain_training_set(run.source, cfg)
    collate = plain_collate(run.source)
    pin = device.type == "cuda"
    batches = plain_batches(dataset, collate, cfg, env.rank, env.world_size, workers, pin)
    model, optimizer = loop_model(run)
    if env.world_size > 1:
        model = DistributedDataParallel(model, device_ids=[device] if pin else None)
    waited = [0.0]

    def step():
        for micro in range(cfg.grad_accum_steps):
            start = time.perf_counter()
            batch = next(batches)
            waited[0] += time.perf_counter() - start
            batch = map_tensors(lambda t: t.to(device, non_blocking=True), batch)
            with parallel.sync_gradients(model, enabled=micro == cfg.grad_accum_steps - 1):
                with run.autocast():
                    loss = mean_loss(run.spec.task, model, batch, cfg.grad_accum_steps)
                loss.backward()
        optimizer_step(model, optimizer, cfg)

    description = (
        f"plain: DataLoader(num_workers={workers}, DistributedSampler, pin_memory={pin}) over "
        f"{reads}, the same transforms, {'DDP, ' * (env.world_size > 1)}AdamW"
    )
    return Baseline("plain", description, step, lambda: waited[0], batches.close)
