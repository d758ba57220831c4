"""Epochs: passes over the training split, counted in samples of the sample stream
(data/batches.py), whose position a checkpoint saves (`samples_seen`).

`epochs=N` sets the run's length: the first step whose samples complete N passes is the last, so
a new run has ceil(N x samples / global batch) steps, and a resume on another number of ranks
(another global batch) ends where the same N passes end. The epoch of a step is samples seen /
samples: fractional (1.50 is half-way through the second pass), the same on any number of ranks.
`eval_every` and `checkpoint_every` in epochs ("1epoch", "0.5epochs") fall on the step that
completes each such part. Token windows are drawn at random positions (no sample stream): there
they are refused in one line, and log lines have no epoch.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from fractions import Fraction

from ..config.settings import Config, ConfigError
from ..config_keys import Interval, parse_every, parse_interval
from .build import Run

log = logging.getLogger(__name__.split(".")[0])


class Epochs:
    """The epoch arithmetic of one training session: `samples` in the training split (None: a
    kind with no sample stream), `per_step` samples of every rank per optimizer step."""

    def __init__(self, samples: int | None, per_step: int):
        self.samples, self.per_step = samples, per_step

    @classmethod
    def of(cls, run: Run) -> Epochs:
        cfg = run.cfg
        samples = None if run.source.draw is not None else len(run.source.train)
        return cls(samples, cfg.batch_size * cfg.grad_accum_steps * run.env.world_size)

    def epoch(self, samples_seen: int) -> float | None:
        """How many passes `samples_seen` samples make (None: no sample stream)."""
        return None if self.samples is None else samples_seen / self.samples

    def last_step(self, epochs: int, step: int, samples_seen: int) -> int:
        """The step whose samples complete `epochs` passes, from `step` at `samples_seen`."""
        left = max(0, epochs * self.samples - samples_seen)
        return step + -(-left // self.per_step)

    def due(self, interval: Interval, step: int, before: int, after: int) -> bool:
        """Whether `interval` (eval_every's) falls on `step`, whose samples are (before, after]."""
        if interval.steps:
            return step % interval.steps == 0
        return self.completes(interval.epochs, before, after)

    def field(self, epoch: float | None) -> dict:
        """A metrics record's epoch field (none without a sample stream)."""
        return {} if epoch is None else {"epoch": epoch}

    def completes(self, every: float, before: int, after: int) -> bool:
        """Whether the samples (before, after] complete a part of `every` epochs."""
        if not every or self.samples is None:
            return False
        part = Fraction(repr(every)) * self.samples  # 0.1 as typed, not as a binary float
        return math.floor(after / part) > math.floor(before / part)


def require_samples(cfg: Config, epochs: Epochs) -> None:
    """A key in epochs on a kind with no sample stream: one line naming it."""
    given = [f"epochs={cfg.epochs}"] if cfg.epochs else []
    if parse_every(cfg.eval_every).epochs:
        given.append(f"eval_every={cfg.eval_every}")
    if parse_interval(cfg.checkpoint_every).epochs:
        given.append(f"checkpoint_every={cfg.checkpoint_every}")
    if given and epochs.samples is None:
        raise ConfigError(
            f"{', '.join(given)}: epochs need a dataset of samples; this dataset's training "
            "batches are token windows drawn at random positions (no passes over it): give "
            "steps instead (max_steps=N, eval_every=N, checkpoint_every=N)"
        )


def settle_length(run: Run) -> Config:
    """The run's config with its length in steps: max_steps worked out from `epochs` (when set)
    at the run's step and data position, just loaded; said on the main rank with the steps per
    epoch. Given to the run (`run.cfg`, the schedule's) and recorded in its checkpoints."""
    cfg, state = run.cfg, run.state
    epochs = Epochs.of(run)
    require_samples(cfg, epochs)
    if cfg.epochs:
        # a resume continues from its step: the passes left, at this session's global batch
        last = epochs.last_step(cfg.epochs, state.step, state.samples_seen)
        cfg = dataclasses.replace(cfg, max_steps=last)
        run.cfg = run.scheduler.cfg = cfg
        run.scheduler.load_state_dict(run.scheduler.state_dict())  # this step's learning rate
    if epochs.samples is not None and run.env.is_main:
        per_epoch = epochs.samples / epochs.per_step
        log.info(
            "%d training samples, %d per step (batch_size %d x grad_accum_steps %d x %d "
            "rank(s)): %.4g steps per epoch; %s%d steps in all, %.3g epochs",
            *(epochs.samples, epochs.per_step, cfg.batch_size, cfg.grad_accum_steps),
            run.env.world_size,
            per_epoch,
            f"epochs={cfg.epochs}: " if cfg.epochs else "max_steps: ",
            cfg.max_steps,
            epochs.epoch(state.samples_seen + (cfg.max_steps - state.step) * epochs.per_step),
        )
    if cfg.warmup_steps >= cfg.max_steps and run.env.is_main:
        log.warning(
            "warmup_steps=%d is not below the run's %d steps: the learning rate never reaches "
            "lr=%g (set warmup_steps=%d, a tenth of the run, or so)",
            *(cfg.warmup_steps, cfg.max_steps, cfg.lr, max(1, cfg.max_steps // 10)),
        )
    return cfg
