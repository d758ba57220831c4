"""One optimizer step over a step's micro-batches, and the evaluation of held-out batches.

The loss of a step is the mean over the targets the whole global batch scores, however it is
split into ranks and micro-steps (torchtitan's way, for pretraining, fine-tuning on answers and
LoRA alike): every micro-batch's scored targets are counted before the first forward, the ranks'
counts added by one all-reduce, and each micro-batch back-propagates its summed loss times
world / that count (DDP and FSDP average the ranks' gradients: the world size undoes that).
"""

from __future__ import annotations

import functools

import torch
import torch.distributed as dist

from .. import parallel
from ..data import batches as data
from ..data.prefetch import Prefetcher
from .build import Run


def train_step(run: Run, inputs: Prefetcher) -> torch.Tensor:
    """One optimizer step over `grad_accum_steps` micro-batches. Returns what this rank
    back-propagated, summed (a device tensor: reading it would synchronise); averaged over the
    ranks, as the metrics do, it is the global batch's mean loss. The clipped gradient norm is
    left in `run.grad_norm` (a device tensor; None without clipping)."""
    task, accum = run.spec.task, run.cfg.grad_accum_steps
    batches = [next(inputs) for _ in range(accum)]
    scale = per_target_scale([task.count(batch) for batch in batches])
    total = None
    for micro, batch in enumerate(batches):
        # Gradients are reduced only on the last micro-batch (forward and backward of the
        # others both run without gradient sync).
        with parallel.sync_gradients(run.model, enabled=micro == accum - 1):
            with run.autocast():
                loss = task.loss(run.model, batch) * scale
            run.scaler.scale(loss).backward()
        total = loss.detach() if total is None else total + loss.detach()
    if run.cfg.grad_clip > 0:
        run.scaler.unscale_(run.optimizer)
        norm = torch.nn.utils.clip_grad_norm_(run.model.parameters(), run.cfg.grad_clip)
        # checked with the loss (telemetry/health.py); fp16's GradScaler skips inf steps itself
        run.grad_norm = None if run.scaler.is_enabled() else norm
    run.scaler.step(run.optimizer)
    run.scaler.update()
    run.optimizer.zero_grad(set_to_none=True)
    run.scheduler.step()
    run.buffers.sync()  # BatchNorm's running statistics: rank 0's, whichever rank saves
    return total


def per_target_scale(counts: list[torch.Tensor]) -> torch.Tensor:
    """world / the targets that every rank's micro-batches score together (`counts`: this
    rank's, each a device tensor): one all-reduce, on the device (no host sync)."""
    count = sum(counts[1:], counts[0])
    world = 1
    if dist.is_initialized():
        dist.all_reduce(count)
        world = dist.get_world_size()
    return world / count.clamp(min=1)


@torch.no_grad()
def evaluate(run: Run, eval_set: data.EvalSet) -> dict[str, float]:
    """The task's sums (loss, count, ...) over every rank's held-out samples (`EvalSet.sums`):
    the task's `report` makes its figures of them."""
    run.model.eval()
    score = functools.partial(run.spec.task.score, run.model)
    sums = eval_set.sums(score, run.device, run.autocast)
    run.model.train()
    return sums
