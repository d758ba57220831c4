"""The training loop. `train(cfg)` starts a run, or resumes it from the newest checkpoint in
`cfg.run_dir`: the same command does both. Returns the process exit status: 0 finished, 3
(REQUEUE_EXIT_CODE) stopped early with a checkpoint (signal or job end time near).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import random
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from . import checkpoint, distributed, parallel
from .checkpoint import lora
from .checkpoint.initial import WeightSource, initial_source, load_initial_weights, open_initial
from .config.resume import check_resume, check_run_dir_config
from .config.settings import Config, ConfigError, config_record, save_config
from .data import batches as data
from .data.info import Splits
from .data.kinds import open_splits, verify_files
from .data.prefetch import CudaCopier, Prefetcher, StandInCopier
from .distributed import DistEnv
from .models import spec_of
from .models.spec import ModelSpec
from .optim import Schedule, make_optimizer, make_schedule
from .run import lock as rundir_lock
from .run import preemption
from .run.interrupts import SecondSignal
from .run.rundir import RunDir, RunDirError, removed_if_refused, reported
from .telemetry import console, metrics
from .telemetry.profiling import StepProfiler

log = logging.getLogger(__package__)


@dataclass
class Run:
    """Everything a training step needs, built by `build`."""

    cfg: Config
    spec: ModelSpec  # what the run's model is: its task, blocks, context length
    env: DistEnv
    device: torch.device
    model: torch.nn.Module  # what the step calls: DDP-wrapped, FSDP-sharded or plain
    optimizer: torch.optim.Optimizer
    scheduler: Schedule  # the learning rate of each step
    scaler: torch.amp.GradScaler
    autocast_dtype: torch.dtype | None
    source: Splits  # the dataset: its splits, what the model is told about it
    data_on_gpu: bool  # an in-memory dataset moved to the GPU: batches gathered there
    state: checkpoint.TrainState  # step and data position: saved, restored
    np_rng: np.random.Generator  # per-rank numpy RNG for your own augmentations
    flops_per_step: float  # per rank
    memory: dict = dataclasses.field(default_factory=dict)  # host memory around the build, GiB

    def autocast(self):
        if self.autocast_dtype is None:
            return nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    def checkpoint_parts(self) -> dict:
        """What a checkpoint holds, registered once: each part saves and loads itself."""
        return {
            "model": checkpoint.ModelAndOptimizer(self.model, self.optimizer),
            "scheduler": self.scheduler,
            "scaler": self.scaler,
            "train": self.state,
            "rng": checkpoint.RNGState(self.np_rng),
        }


def enable_tf32() -> None:
    """TF32 matmuls on Hopper through the API every library reads: `fp32_precision = "tf32"`
    (torch >= 2.9) would make `torch.get_float32_matmul_precision()` raise in Lightning and
    friends ("mix of the legacy and new APIs"). cuDNN convolutions use TF32 by default."""
    torch.set_float32_matmul_precision("high")


def resolve_precision(cfg: Config, device: torch.device) -> torch.dtype | None:
    precision = cfg.precision
    if precision == "auto":
        precision = "bf16" if device.type == "cuda" else "fp32"
    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": None}[precision]


def build(cfg: Config, env: DistEnv, device: torch.device) -> Run:
    """Data, model, optimizer, wrappers: a new run at step 0 (a checkpoint then loads into it)."""
    if device.type == "cuda" and cfg.tf32:
        enable_tf32()
    dtype = resolve_precision(cfg, device)
    spec = spec_of(cfg)
    source = open_splits(cfg, spec)
    data_on_gpu = data.place_on_gpu(source, device, cfg.data_on_gpu)
    memory = {"rss_before_build_gib": metrics.resident_gib()}
    torch.manual_seed(cfg.seed)  # the same initial weights on every rank
    # weights that are loaded next are not made first (parallel.parameters_on_meta); with
    # cpu_offload FSDP places the shards itself
    loaded_next = bool(initial_source(cfg, spec)) and not cfg.cpu_offload
    with parallel.parameters_on_meta(enabled=loaded_next):
        net = spec.build(cfg, source.info)
    flops = spec.training_flops_per_sample(cfg, net, source.info, data.example_batch(source, cfg))
    flops *= cfg.batch_size * cfg.grad_accum_steps
    bf16 = dtype == torch.bfloat16 and device.type == "cuda"
    model, use_autocast = parallel.parallelize(net, spec, cfg, env.world_size, device, bf16)
    optimizer = make_optimizer(model, cfg, device)
    scheduler = make_schedule(optimizer, cfg)
    scaler = torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)
    # Per-rank randomness (dropout, augmentation) differs between ranks.
    torch.manual_seed(cfg.seed + 1 + env.rank)
    random.seed(cfg.seed + 1 + env.rank)
    np_rng = np.random.default_rng(cfg.seed + 1 + env.rank)
    return Run(
        cfg=cfg,
        spec=spec,
        env=env,
        device=device,
        model=model,
        optimizer=optimizer,
        scheduler=scheduler,
        scaler=scaler,
        autocast_dtype=dtype if use_autocast else None,
        source=source,
        data_on_gpu=data_on_gpu,
        state=checkpoint.TrainState(),
        np_rng=np_rng,
        flops_per_step=flops,
        memory=memory,
    )


def input_pipeline(run: Run, stop_step: int) -> tuple[data.StepBatches, Prefetcher]:
    """Micro-batches from the run's step on, prepared ahead of the step that uses them."""
    cfg, env, device = run.cfg, run.env, run.device
    batches = data.StepBatches(
        run.source, cfg, env.rank, env.world_size, run.state.step, run.state.samples_seen
    )
    on_gpu = run.data_on_gpu
    workers = 0 if on_gpu else data.resolve_num_workers(cfg.num_workers, run.source.decodes)
    stream = data.micro_batches(batches, stop_step, workers, pin=device.type == "cuda")
    if device.type == "cuda" and not on_gpu:
        return batches, Prefetcher(stream, CudaCopier(device))
    # On the GPU already, or training on the CPU (whose cores the step uses): no copy, no thread.
    return batches, Prefetcher(stream, StandInCopier(), threaded=False)


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


def main_rank() -> bool:
    """Whether this process is rank 0, before the process group exists."""
    return distributed.resolve_env().rank == 0


def train(cfg: Config, origins: dict[str, str] | None = None) -> int:
    initial = None  # a new run's initial weights, read and refused before the run dir is touched
    if not checkpoint.complete_steps(RunDir(cfg.run_dir).checkpoints):
        initial = open_initial(cfg, spec_of(cfg), cfg.run_dir)
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
        with hold_run_dir(RunDir(cfg.run_dir), env) as lock:
            return run_training(cfg, env, device, flag, lock, initial, origins)


def run_identity(cfg: Config) -> dict:
    """What every rank of one run must agree on: the resolved config, with the run directory
    and the dataset as absolute paths (the same directory spelled two ways is one)."""
    values = dataclasses.asdict(cfg)
    for key in ("run_dir", "dataset", "init_from"):
        if values[key] and values[key] != "synthetic":
            values[key] = str(Path(values[key]).resolve())
    return values


def check_ranks_agree(what: str, values: dict) -> None:
    """Every rank's `values` equal rank 0's, or every rank stops with one line naming the first
    rank that differs and its keys (ranks given different arguments would train on silently,
    write a checkpoint none can load, or hang in a collective)."""
    gathered = distributed.all_gather_object(values)
    for rank, other in enumerate(gathered):
        keys = sorted(k for k in values if other.get(k) != gathered[0].get(k))
        if keys:
            shown = "; ".join(f"{k}: {gathered[0].get(k)!r} vs {other.get(k)!r}" for k in keys[:5])
            raise ConfigError(
                f"rank {rank}'s {what} differs from rank 0's ({shown}): every rank must run the "
                "same run; check the arguments the launcher gives each rank"
            )


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


def check_unchanged(cfg: Config, env: DistEnv) -> None:
    """Before DCP reads anything: a changed model or resume-relevant key on a run directory with
    checkpoints is refused with the list of changes (rank 0 reads, every rank learns it)."""
    error = None
    if env.is_main:
        run_dir = RunDir(cfg.run_dir)
        try:
            has_checkpoints = bool(checkpoint.complete_steps(run_dir.checkpoints))
            check_run_dir_config(cfg, run_dir, has_checkpoints)
        except ConfigError as err:
            error = str(err)
    error = distributed.broadcast_object(error)
    if error:
        raise ConfigError(error)


def resume(run: Run, ckpt: checkpoint.CheckpointManager, initial: WeightSource | None) -> None:
    """Load the newest good checkpoint into the run, refusing one from a different run; a new
    run loads its `initial` weights (checkpoint.initial.open_initial) instead."""
    check_ranks_agree("dataset", {"fingerprint": run.source.info.fingerprint})
    verify_files(run.source, run.env.rank, run.env.world_size)  # every shard, read in full
    check_unchanged(run.cfg, run.env)
    lora.load_base(run.model, run.spec, run.cfg, run.source.info, initial)  # LoRA: each start
    step = ckpt.load_latest()
    if step is None and initial is not None:
        loaded, memory = load_initial_weights(
            run.model, run.spec, run.cfg, run.source.info, initial
        )
        run.state.extra["init_from"] = loaded  # recorded in every checkpoint of the run
        run.memory |= memory
        log.info(
            "starting a new run in %s from the weights of %s (this rank's host memory: %.2f "
            "GiB before the build, peak %.2f GiB after loading; the weights: %.2f GiB)",
            *(run.cfg.run_dir, loaded),
            *(run.memory[k] for k in ("rss_before_build_gib", "peak_rss_gib", "model_gib")),
        )
        return
    if step is None:
        log.info("starting a new run in %s", run.cfg.run_dir)
        return
    extra = run.state.extra
    check_resume(
        extra["config"],
        run.cfg,
        extra["world_size"],
        run.env.world_size,
        extra.get("data_fingerprint"),
        run.source.info.fingerprint,
    )
    log.warning(
        "RESUMING %s from checkpoint step %d (written by torch %s, commit %s)",
        *(run.cfg.run_dir, step, extra.get("torch_version"), extra.get("git_commit")),
    )


def open_checkpoints(
    run: Run, initial: WeightSource | None, origins: dict[str, str] | None
) -> checkpoint.CheckpointManager:
    """The run's checkpoints with the newest good one loaded (or a new run's initial weights),
    and the run recorded in them and in config.toml (with where its values came from:
    `origins`, load_config's)."""
    cfg, env, run_dir = run.cfg, run.env, RunDir(run.cfg.run_dir)
    ckpt = checkpoint.CheckpointManager(
        run_dir.checkpoints,
        run.checkpoint_parts(),
        keep=cfg.keep_checkpoints,
        async_save=cfg.async_checkpoint == "true"
        or (cfg.async_checkpoint == "auto" and run.device.type == "cuda"),
        timeout_s=cfg.dist_timeout_s,  # a node lost during a save: the same wait as in training
    )
    resume(run, ckpt, initial)
    # the dataset recorded as an absolute path: evaluate and generate find it from any directory
    where = cfg.dataset if cfg.dataset == "synthetic" else os.path.abspath(cfg.dataset)
    recorded = dataclasses.replace(cfg, dataset=where)
    lora.record_base(run.state.extra, cfg)  # a LoRA run's base, named in every checkpoint
    run.state.extra.update(
        # data_info: what `generate` and `export` need to rebuild the model without the data
        config=config_record(recorded) | {"data_info": dataclasses.asdict(run.source.info)},
        world_size=env.world_size,
        data_fingerprint=run.source.info.fingerprint,
        git_commit=checkpoint.git_commit(),
        torch_version=str(torch.__version__),
    )
    if env.is_main:
        with reported(f"cannot write {run_dir.config}"):
            save_config(recorded, run_dir.config, origins)
    return ckpt


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
    initial: WeightSource | None,
    origins: dict[str, str] | None,
) -> int:
    run_dir = RunDir(cfg.run_dir)
    run = build(cfg, env, device)
    ckpt = open_checkpoints(run, initial, origins)
    start = run.state.step
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
    per_sample = run.spec.units_per_sample(cfg)
    units = cfg.batch_size * cfg.grad_accum_steps * per_sample  # in the task's unit
    meter = metrics.Metrics(run_dir, env, cfg, run.spec.task, run.flops_per_step, units, start)
    log.info(
        "%s, %.3g GFLOP per step and rank; checkpoints %s",
        run.spec.label(cfg),
        run.flops_per_step / 1e9,
        schedule.describe(),
    )
    report = console.Console(cfg, env.is_main, device, run.flops_per_step, per_sample, start)
    report.start(run.state.samples_seen)
    profiler = StepProfiler(cfg.profile_steps, cfg.profile_memory, env.rank, device, run_dir)
    try:
        for step in range(start + 1, cfg.max_steps + 1):
            with profiler.step(step):  # a no-op outside profile_steps
                loss = train_step(run, inputs)
            if step == 1:  # a new run: far above chance, the initialisation is likely broken
                report.first_loss(loss.item(), run.spec.task.chance_loss(run.source.info))
            run.state.step = step
            run.state.samples_seen = batches.samples_seen(step)
            meter.update(loss, inputs)
            if step % cfg.log_every == 0 or step == cfg.max_steps:
                meter.log(step, run.scheduler.get_last_lr()[0])
                if lock is not None:
                    lock.refresh()  # heartbeat: a live holder is not taken over
            if cfg.eval_every and step % cfg.eval_every == 0:
                result = run.spec.task.report(evaluate(run, eval_set))
                meter.write({"kind": "eval", "step": step, **result})
                report.evaluated(step, result, run.state.samples_seen)
                meter.restart_clock()
            decision = policy.poll(step)
            if decision.save:
                schedule.record_save(ckpt.save(step).stall_s)
                meter.restart_clock()
                policy.restart_clock(step)
            record_written(ckpt.poll(), schedule, meter)
            if decision.stop:
                # the checkpoint must be complete before the job gives up its nodes
                record_written(ckpt.wait(), schedule, meter)
                if env.is_main:  # torchrun turns exit 3 into 1: the marker tells the script
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
