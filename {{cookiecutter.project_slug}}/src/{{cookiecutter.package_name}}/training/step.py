"""One optimizer step over a step's micro-batches, and the evaluation of held-out batches."""

from __future__ import annotations

import functools

import torch

from .. import parallel
from ..data import batches as data
from ..data.prefetch import Prefetcher
from .build import Run


def train_step(run: Run, inputs: Prefetcher) -> torch.Tensor:
    """One optimizer step over `grad_accum_steps` micro-batches. Returns the mean loss as a
    device tensor (reading it would synchronise)."""
    accum = run.cfg.grad_accum_steps
    loss_total, counts = None, []  # counts: of a task whose loss is a (sum, count) pair
    for micro in range(accum):
        batch = next(inputs)
        # Gradients are reduced only on the last micro-batch (forward and backward of the
        # others both run without gradient sync).
        with parallel.sync_gradients(run.model, enabled=micro == accum - 1):
            with run.autocast():
                loss = parallel.micro_loss(run.spec.task.loss(run.model, batch), accum, counts)
            run.scaler.scale(loss).backward()
        loss_total = loss.detach() if loss_total is None else loss_total + loss.detach()
    if counts:
        loss_total = parallel.divide_by_global_count(run.model, loss_total, sum(counts))
    if run.cfg.grad_clip > 0:
        run.scaler.unscale_(run.optimizer)
        torch.nn.utils.clip_grad_norm_(run.model.parameters(), run.cfg.grad_clip)
    run.scaler.step(run.optimizer)
    run.scaler.update()
    run.optimizer.zero_grad(set_to_none=True)
    run.scheduler.step()
    return loss_total


@torch.no_grad()
def evaluate(run: Run, eval_set: data.EvalSet) -> dict[str, float]:
    """The task's sums (loss, count, ...) over every rank's held-out samples (`EvalSet.sums`):
    the task's `report` makes its figures of them."""
    run.model.eval()
    score = functools.partial(run.spec.task.scores, run.model)
    sums = eval_set.sums(score, run.device, run.autocast)
    run.model.train()
    return sums
