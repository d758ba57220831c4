"""The training loop. `train(cfg)` starts a run, or resumes it from the newest checkpoint in
`cfg.run_dir`: the same command does both. Returns the process exit status: 0 finished, 3
(REQUEUE_EXIT_CODE) stopped early with a checkpoint (signal or job end time near); a NaN or inf
loss raises telemetry.health.NonFinite (exit status 4, no checkpoint). The run is
built by build.py, started by start.py and stepped by step.py.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import torch

from .. import checkpoint, distributed, parallel
from ..checkpoint.start import Start, open_start
from ..config.settings import Config, ConfigError
from ..config_keys import parse_every
from ..data import batches as data
from ..distributed import DistEnv
from ..models import spec_of
from ..run import lock as rundir_lock
from ..run import preemption
from ..run.interrupts import SecondSignal
from ..run.rundir import RunDir, RunDirError, removed_if_refused
from ..telemetry import console, metrics
from ..telemetry.profiling import StepProfiler
from .build import build, input_pipeline
from .epochs import Epochs
from .start import check_ranks_agree, open_checkpoints
from .step import evaluate, train_step

log = logging.getLogger(__name__.split(".")[0])


def main_rank() -> bool:
    """Whether this process is rank 0, before the process group exists."""
    return distributed.resolve_env().rank == 0


def train(cfg: Config, origins: dict[str, str] | None = None) -> int:
    # what the run starts from, read (and refused) before the run directory is touched
    start = open_start(cfg, spec_of(cfg), cfg.run_dir)
    # The signal handlers go first: a signal during start-up (which can take minutes at scale)
    # then stops the run at its first agreement step instead of killing it.
    with (
        preemption.PreemptionFlag(
            SecondSignal(cfg.run_dir, checkpoint.complete_steps, is_main=main_rank())
        ) as flag,
        distributed.process_group(cfg.dist_timeout_s, cfg.cpu_threads, cfg.device) as (
            env,
            device,
        ),
    ):
        check_ranks_agree("configuration", run_identity(cfg))  # before anything is written
        parallel.check_layout(cfg, env.world_size, env.local_world_size)
        with hold_run_dir(RunDir(cfg.run_dir), env) as lock:
            return run_training(cfg, env, device, flag, lock, start, origins)


def run_identity(cfg: Config) -> dict:
    """What every rank of one run must agree on: the resolved config, with the run directory
    and the dataset as absolute paths (the same directory spelled two ways is one)."""
    values = dataclasses.asdict(cfg)
    for key in ("run_dir", "dataset", "init_from"):
        if values[key] and values[key] != "synthetic":
            values[key] = str(Path(values[key]).resolve())
    return values


@contextmanager
def hold_run_dir(run_dir: RunDir, env: DistEnv) -> Iterator[object | None]:
    """Rank 0 checks that the run directory can be written and holds `<run_dir>/LOCK` for the
    whole run (a second job started on it stops here); every rank learns the outcome."""
    refusals = (ConfigError, data.DatasetError)  # bad input: the command line exits 2
    with removed_if_refused(run_dir, env.is_main, refusals), ExitStack() as stack:
        lock, error = None, None
        if env.is_main:
            try:
                run_dir.create()
                lock = stack.enter_context(rundir_lock.hold(run_dir))
                run_dir.prepare()
            except RunDirError as err:  # busy, read-only, full, a file where a folder belongs
                error = str(err)
        error = distributed.broadcast_object(error)
        if error:
            raise RunDirError(error)
        if env.is_main:
            preemption.remove_requeue_marker(run_dir)  # ours now: a stale marker must go
        yield lock


def record_written(done: list, schedule: preemption.CheckpointSchedule, meter) -> None:
    """Log the checkpoints whose writing completed: the stall the loop paid, the write time."""
    for stats in done:
        schedule.record_write(stats.write_s)
        meter.write({"kind": "checkpoint", **dataclasses.asdict(stats)})
        log.info(
            "checkpoint step %d complete: training stalled %.2f s, written in %.2f s%s",
            stats.step,
            stats.stall_s,
            stats.write_s,
            " (in the background)" if stats.asynchronous else "",
        )


def run_training(
    cfg: Config,
    env: DistEnv,
    device: torch.device,
    flag,
    lock,
    start: Start,
    origins: dict[str, str] | None,
) -> int:
    run_dir = RunDir(cfg.run_dir)
    run = build(cfg, env, device, start)
    ckpt = open_checkpoints(run, start, origins)
    cfg, start = run.cfg, run.state.step  # its length settled: max_steps from epochs=N
    eval_set = data.eval_batches(
        run.source, cfg.batch_size, env.rank, env.world_size, cfg.eval_batches
    ).keep()
    batches, inputs = input_pipeline(run, cfg.max_steps)
    schedule = preemption.CheckpointSchedule(cfg.checkpoint_every, cfg.mtbf_hours)
    policy = preemption.StopPolicy(
        flag,
        preemption.Deadline.from_env(cfg.end_time_margin_s),
        schedule,
        cfg.preempt_check_every,
        cfg.max_steps,
        device,
    )
    epochs, evals = Epochs.of(run), parse_every(cfg.eval_every)
    per_sample = run.spec.units_per_sample(cfg)
    units = cfg.batch_size * cfg.grad_accum_steps * per_sample  # in the task's unit

    def units_seen(samples: int) -> int:  # tokens (not padding) or samples: what was read
        return batches.units_seen(samples, per_sample)

    meter = metrics.Metrics(
        run_dir,
        env,
        cfg,
        run.spec.task,
        run.flops_per_step,
        units,
        start,
        lambda step: units_seen(batches.samples_seen(step)),
    )
    log.info(
        "%s, %.3g GFLOP per step and rank; checkpoints %s",
        run.spec.label(cfg),
        run.flops_per_step / 1e9,
        schedule.describe(),
    )
    if run.source.notes and env.is_main:
        log.info("%s", run.source.notes)
    report = console.Console(
        cfg, env.is_main, device, run.flops_per_step, per_sample, start, units_seen
    )
    report.start(run.state.samples_seen)
    profiler = StepProfiler(cfg.profile_steps, cfg.profile_memory, env.rank, device, run_dir)
    try:
        for step in range(start + 1, cfg.max_steps + 1):
            with profiler.step(step):  # a no-op outside profile_steps
                loss = train_step(run, inputs)
            if step == 1:  # a new run: far above chance, the initialisation is likely broken
                report.first_loss(loss.item(), run.spec.task.chance_loss(run.source.info))
            run.state.step = step
            seen_before, run.state.samples_seen = run.state.samples_seen, batches.samples_seen(step)
            epoch = epochs.epoch(run.state.samples_seen)
            meter.update(loss, inputs, run.grad_norm)  # a NaN or inf stops the run at a log
            # the first step's line at once: the time per step and the run's ETA
            if step % cfg.log_every == 0 or step in (start + 1, cfg.max_steps):
                meter.log(step, run.scheduler.get_last_lr()[0], epoch)
                if lock is not None:
                    lock.refresh()  # heartbeat: a live holder is not taken over
            if epochs.due(evals, step, seen_before, run.state.samples_seen):
                sums = evaluate(run, eval_set)
                result = run.spec.task.report(sums)
                meter.write({"kind": "eval", "step": step, **epochs.field(epoch), **result})
                report.evaluated(step, result, run.state.samples_seen, sums["count"], epoch)
                meter.restart_clock()
            decision = policy.poll(step)
            by_epochs = epochs.completes(schedule.every_epochs, seen_before, run.state.samples_seen)
            if decision.save or by_epochs:
                meter.check_finite(step, run.model)  # never a checkpoint of a diverged state
                schedule.record_save(ckpt.save(step).stall_s)
                meter.restart_clock()
                policy.restart_clock(step)
            record_written(ckpt.poll(), schedule, meter)
            if decision.stop:
                # the checkpoint must be complete before the job gives up its nodes
                record_written(ckpt.wait(), schedule, meter)
                if env.is_main:  # the job script's sign, whatever status a launcher reports
                    preemption.write_requeue_marker(run_dir, f"step {step}: {decision.reason}")
                log.warning(
                    "stopping at step %d (%s); checkpoint written, exiting with %d to be requeued",
                    step,
                    decision.reason,
                    preemption.REQUEUE_EXIT_CODE,
                )
                report.summary(step, run.state.samples_seen, ckpt.path(step), decision.reason)
                return preemption.REQUEUE_EXIT_CODE
        record_written(ckpt.wait(), schedule, meter)
    finally:
        profiler.close()
        inputs.close()
        meter.close()
        ckpt.close()
    if env.is_main:
        preemption.remove_requeue_marker(run_dir)
    report.summary(cfg.max_steps, run.state.samples_seen, ckpt.path(cfg.max_steps))
    return 0
