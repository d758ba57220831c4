"""Non-finite values stop a run. A loss or a gradient norm that is NaN or inf means the weights
are (or are about to be) garbage: training on would log `loss nan` to the end, exit 0 and save
checkpoints a resume carries on from. torchtitan and Megatron stop on them; so does this.

The check costs no device synchronisation of its own: each step's loss and clipped gradient norm
are kept as device tensors (metrics.py) and added into the reduction the log line already reads
every `log_every` steps, and checked again, with the model's parameters, before every checkpoint
(a save reads the state back anyway). So a bad step is found at the next log or save step, at
most `log_every - 1` steps later, and never after a checkpoint of its state was written. The
ranks learn it from the same all-reduce and stop together; exit status NON_FINITE_EXIT_CODE
(not 3: the job script must not requeue a run that would diverge again from the same state).
"""

from __future__ import annotations

import math

import torch

from .. import distributed

# 0 done, 1 failure, 2 bad input, 3 stopped to be requeued (run/preemption.py), 4 this
NON_FINITE_EXIT_CODE = 4


class NonFinite(RuntimeError):
    """Training found a NaN or inf; `shown`: this rank reports it (rank 0), the others exit
    with the same status in silence."""

    exit_code = NON_FINITE_EXIT_CODE

    def __init__(self, message: str, shown: bool):
        super().__init__(message)
        self.shown = shown


def local_value(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's part of a value that may be a DTensor (FSDP2's gradient norm, its shards):
    a non-finite part makes the whole non-finite, and the check adds the ranks' parts."""
    to_local = getattr(tensor, "to_local", None)
    return to_local() if to_local is not None else tensor


def parameters_sum(model: torch.nn.Module) -> torch.Tensor:
    """The sum of every value of this rank's parameters (FSDP2: its shards), a device scalar:
    non-finite when any value is (weights that large are broken too). Before a checkpoint only:
    it catches what no loss or norm showed yet (grad_clip=0: an inf gradient makes the weights
    NaN in the optimizer's step, and only the next step's loss would tell)."""
    sums = [local_value(p.detach()).sum(dtype=torch.float32) for p in model.parameters()]
    return torch.stack(sums).sum() if sums else torch.zeros(())


def first_bad(name: str, steps: range, values: list[torch.Tensor]) -> list[tuple[int, str]]:
    """[(step, "loss nan")] for the first of `steps` whose value (a device scalar) is not
    finite, or []; reads them to the host: only once a check has failed."""
    for step, value in zip(steps, values, strict=True):
        number = float(value)
        if not math.isfinite(number):
            return [(step, f"{name} {number}")]
    return []


def bad_parameter(model: torch.nn.Module, step: int) -> list[tuple[int, str]]:
    """This rank's first parameter holding a NaN or inf, as `stop` names it."""
    for name, p in model.named_parameters():
        if not bool(torch.isfinite(local_value(p.detach())).all()):
            return [(step, f"parameter {name} not finite")]
    return []


def stop(step: int, found: list[tuple[int, str]], model, last_good: str, shown: bool) -> None:
    """Raise NonFinite on every rank (collective): one line naming the first bad step and the
    ranks where it showed, from each rank's `found` ([(step, "loss nan")]); where no loss or
    norm showed it, the first parameter that holds it (`model`). `last_good`: which checkpoint
    holds the last good state, in words; `shown`: this rank says it."""
    everyone = distributed.all_gather_object(found)
    if not any(everyone) and model is not None:
        everyone = distributed.all_gather_object(bad_parameter(model, step))
    seen = [(item, rank) for rank, items in enumerate(everyone) for item in items]
    cause = f"a non-finite value by step {step}"
    if seen:
        (first_step, what), _ = min(seen)
        ranks = sorted({rank for item, rank in seen if item == (first_step, what)})
        who = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))}"
        cause = f"{what} at step {first_step} ({who})"
    raise NonFinite(
        f"training diverged: {cause}; stopped at step {step} with no checkpoint of it "
        f"({last_good}); lower lr or raise warmup_steps; not requeued",
        shown,
    )
