"""The training loop. `train(cfg)` starts a run, or resumes it from the newest checkpoint in
`cfg.run_dir`: the same command does both.

Returns the process exit status: 0 finished, 3 (REQUEUE_EXIT_CODE) stopped early with a
checkpoint (signal or job end time near).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import random
import signal
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from . import data, distributed, metrics, preemption
from .checkpoint import (
    Checkpointer,
    CheckpointSchedule,
    check_replicas,
    gather_rng,
    git_commit,
    restore_rng,
)
from .config import Config, check_resume, save_config
from .distributed import DistEnv
from .model import build_model, loss_fn

log = logging.getLogger(__package__)


@dataclass
class Parts:
    """Everything one training step needs, built by `build`."""

    cfg: Config
    env: DistEnv
    device: torch.device
    model: torch.nn.Module  # plain module: checkpoints, evaluation, FLOP counting
    ddp: torch.nn.Module  # DDP-wrapped (or the plain module in a single process)
    forward: torch.nn.Module  # what the step calls: `ddp`, compiled if cfg.compile
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler
    autocast_dtype: torch.dtype | None
    batches: data.Batches
    eval_loader: torch.utils.data.DataLoader
    np_rng: np.random.Generator  # per-rank numpy RNG for your own augmentations
    step: int = 0

    def autocast(self):
        if self.autocast_dtype is None:
            return nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)


def enable_tf32() -> None:
    """TF32 matmuls/convolutions on Hopper. torch >= 2.9 has the `fp32_precision` API and warns
    about the older `allow_tf32` flags."""
    matmul = torch.backends.cuda.matmul
    if hasattr(matmul, "fp32_precision"):
        matmul.fp32_precision = "tf32"
        torch.backends.cudnn.conv.fp32_precision = "tf32"
    else:
        matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True


def lr_factor(cfg: Config, step: int) -> float:
    """Linear warmup to lr, then cosine decay to min_lr at max_steps."""
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    progress = (step - cfg.warmup_steps) / max(1, cfg.max_steps - cfg.warmup_steps)
    cosine = 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))
    return (cfg.min_lr + (cfg.lr - cfg.min_lr) * cosine) / cfg.lr


def make_optimizer(model: torch.nn.Module, cfg: Config, device: torch.device):
    """AdamW; weight decay on matrices only; the fused kernel on CUDA."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=cfg.lr, fused=device.type == "cuda")


def build(cfg: Config, env: DistEnv, device: torch.device, state: dict | None = None) -> Parts:
    """Data, model, optimizer, wrappers; with `state`, continue from that checkpoint."""
    if device.type == "cuda" and cfg.tf32:
        enable_tf32()
    precision = (
        cfg.precision if cfg.precision != "auto" else ("bf16" if device.type == "cuda" else "fp32")
    )
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": None}[precision]

    train_set, eval_set = data.load_datasets(cfg)
    torch.manual_seed(cfg.seed)  # the same initial weights on every rank
    model = build_model(cfg, train_set.num_features, train_set.num_classes)
    if state is not None:
        model.load_state_dict(state["model"])  # into the plain module, before DDP wraps it
    model.to(device)
    optimizer = make_optimizer(model, cfg, device)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(cfg, s))
    scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16")
    if state is not None:
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        scaler.load_state_dict(state["scaler"])

    ddp = model
    if env.world_size > 1:
        ddp = DDP(
            model,
            device_ids=[device.index] if device.type == "cuda" else None,
            gradient_as_bucket_view=True,
        )
    forward = torch.compile(ddp) if cfg.compile else ddp

    workers = data.resolve_num_workers(cfg.num_workers)
    pin = device.type == "cuda"
    train_loader = data.make_loader(
        train_set,
        cfg.batch_size,
        env.rank,
        env.world_size,
        cfg.seed,
        shuffle=True,
        workers=workers,
        pin=pin,
    )
    eval_loader = data.make_loader(
        eval_set,
        cfg.batch_size,
        env.rank,
        env.world_size,
        cfg.seed,
        shuffle=False,
        workers=0,
        pin=pin,
    )
    same_world = state is not None and state["world_size"] == env.world_size
    position = state["data"] if same_world else {"epoch": 0, "batch_in_epoch": 0}
    if state is not None and not same_world:  # only with force_resume
        position = {"epoch": state["data"]["epoch"], "batch_in_epoch": 0}
        log.warning(
            "world size changed: data restarts at the beginning of epoch %d and the "
            "random states are reseeded",
            position["epoch"],
        )
    batches = data.Batches(train_loader, **position)

    # Per-rank randomness (dropout, augmentation) differs between ranks.
    torch.manual_seed(cfg.seed + 1 + env.rank)
    random.seed(cfg.seed + 1 + env.rank)
    np_rng = np.random.default_rng(cfg.seed + 1 + env.rank)
    if same_world:
        restore_rng(state["rng"][env.rank], train_loader.generator, np_rng)

    return Parts(
        cfg,
        env,
        device,
        model,
        ddp,
        forward,
        optimizer,
        scheduler,
        scaler,
        dtype,
        batches,
        eval_loader,
        np_rng,
        step=state["step"] if state else 0,
    )


def train_step(p: Parts) -> tuple[torch.Tensor, float]:
    """One optimizer step over `grad_accum_steps` micro-batches. Returns the mean loss (a device
    tensor: reading it would synchronise) and the seconds spent waiting for data."""
    accum = p.cfg.grad_accum_steps
    loss_total, data_wait = None, 0.0
    for micro in range(accum):
        start = time.perf_counter()
        x, y = next(p.batches)
        x = x.to(p.device, non_blocking=True)
        y = y.to(p.device, non_blocking=True)
        data_wait += time.perf_counter() - start
        # Gradients are all-reduced only on the last micro-batch (forward and backward must
        # both be inside no_sync for the others).
        last = micro == accum - 1
        with nullcontext() if last or p.ddp is p.model else p.ddp.no_sync():
            with p.autocast():
                loss = loss_fn(p.forward(x), y)
                if accum > 1:
                    loss = loss / accum
            p.scaler.scale(loss).backward()
        loss_total = loss.detach() if loss_total is None else loss_total + loss.detach()
    if p.cfg.grad_clip > 0:
        p.scaler.unscale_(p.optimizer)
        torch.nn.utils.clip_grad_norm_(p.model.parameters(), p.cfg.grad_clip)
    p.scaler.step(p.optimizer)
    p.scaler.update()
    p.optimizer.zero_grad(set_to_none=True)
    p.scheduler.step()
    return loss_total, data_wait


@torch.no_grad()
def evaluate(p: Parts) -> dict:
    """Loss and accuracy on the held-out set; every rank evaluates its shard (all ranks take
    part, so no rank waits alone in a collective)."""
    p.model.eval()
    totals = torch.zeros(3, device=p.device)  # loss sum, correct, count
    for x, y in p.eval_loader:
        x, y = x.to(p.device, non_blocking=True), y.to(p.device, non_blocking=True)
        with p.autocast():
            out = p.model(x)
        count = torch.tensor(float(len(y)), device=p.device)
        correct = (out.argmax(1) == y).sum().float()
        totals += torch.stack([loss_fn(out, y, reduction="sum"), correct, count])
    p.model.train()
    loss_sum, correct, count = distributed.all_reduce(totals).tolist()
    return {"eval_loss": loss_sum / max(count, 1), "eval_acc": correct / max(count, 1)}


def save_checkpoint(p: Parts, ckpt: Checkpointer, step: int, commit: str | None) -> float:
    check_replicas(p.model)
    rng = gather_rng(p.batches.loader.generator, p.np_rng)  # collective: every rank's states
    state = {
        "model": p.model.state_dict(),  # unwrapped and uncompiled: no "module."/"_orig_mod."
        "optimizer": p.optimizer.state_dict(),
        "scheduler": p.scheduler.state_dict(),
        "scaler": p.scaler.state_dict(),
        "step": step,
        "data": p.batches.state_dict(),
        "rng": rng,
        "config": dataclasses.asdict(p.cfg),
        "world_size": p.env.world_size,
        "git_commit": commit,
        "torch_version": str(torch.__version__),  # a plain str loads with weights_only
        "time": time.time(),
    }
    return ckpt.save(state, step)


def train(cfg: Config) -> int:
    # The signal handlers go first: a signal during start-up (which can take minutes at scale)
    # then stops the run at its first agreement step instead of killing it.
    with (
        preemption.PreemptionFlag() as flag,
        distributed.process_group(cfg.dist_timeout_s, cfg.cpu_threads) as (env, device),
    ):
        return run(cfg, env, device, flag)


def run(cfg: Config, env: DistEnv, device: torch.device, flag: preemption.PreemptionFlag) -> int:
    run_dir = Path(cfg.run_dir)
    if env.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
        preemption.remove_requeue_marker(run_dir)
    ckpt = Checkpointer(run_dir / "checkpoints", cfg.keep_checkpoints, env.is_main)
    state = ckpt.load_latest()
    if state is not None:
        check_resume(state["config"], cfg, state["world_size"], env.world_size)
        log.warning(
            "RESUMING %s from checkpoint step %d (%s, written by torch %s, commit %s)",
            run_dir,
            state["step"],
            ckpt.path(state["step"]).name,
            state["torch_version"],
            state["git_commit"],
        )
    else:
        log.info("starting a new run in %s", run_dir)
    if env.is_main:
        save_config(cfg, run_dir / "config.toml")

    p = build(cfg, env, device, state)
    del state
    step = p.step
    sample_x, sample_y = p.batches.loader.dataset.__getitems__(range(cfg.batch_size))
    flops = metrics.count_flops(p.model, sample_x.to(device), sample_y.to(device), loss_fn)
    meter = metrics.Metrics(
        run_dir,
        is_main=env.is_main,
        world=env.world_size,
        samples_per_step=cfg.batch_size * cfg.grad_accum_steps,
        flops_per_step=flops * cfg.grad_accum_steps,
        peak_flops=cfg.peak_tflops * 1e12,
        device=device,
        max_steps=cfg.max_steps,
    )
    schedule = CheckpointSchedule(cfg.checkpoint_every, cfg.mtbf_hours)
    deadline = preemption.Deadline.from_env(cfg.end_time_margin_s)
    commit = git_commit()
    log.info(
        "model %.3f M parameters, %.3g GFLOP per step and rank; checkpoints %s",
        sum(t.numel() for t in p.model.parameters()) / 1e6,
        flops / 1e9,
        schedule.describe(),
    )

    last_check, last_check_step = time.perf_counter(), step
    while step < cfg.max_steps:
        loss, data_wait = train_step(p)
        step += 1
        meter.update(loss, data_wait)
        if step % cfg.log_every == 0 or step == cfg.max_steps:
            meter.log(step, p.scheduler.get_last_lr()[0], p.batches.epoch)
        if cfg.eval_every and step % cfg.eval_every == 0:
            meter.write({"kind": "eval", "step": step, **evaluate(p)})
            meter.restart_clock()

        stop = save = False
        if step % cfg.preempt_check_every == 0 and step < cfg.max_steps:
            now = time.perf_counter()
            step_s = (now - last_check) / max(step - last_check_step, 1)
            last_check, last_check_step = now, step
            near_end = deadline.near(step_s * cfg.preempt_check_every, schedule.save_s or 0)
            stop, save = preemption.agree(
                flag.requested or near_end, schedule.due_by_time(), device
            )
        if stop or save or schedule.due_by_steps(step) or step == cfg.max_steps:
            seconds = save_checkpoint(p, ckpt, step, commit)
            schedule.record_save(seconds)
            meter.write({"kind": "checkpoint", "step": step, "save_s": seconds})
            log.info(
                "checkpoint step %d written in %.2f s; next: %s",
                step,
                seconds,
                schedule.describe(),
            )
            meter.restart_clock()
            last_check = time.perf_counter()
        if stop:
            if flag.requested:
                reason = f"received {signal.Signals(flag.received).name}"
            elif near_end:
                reason = "SLURM_JOB_END_TIME near"
            else:
                reason = "another rank asked to stop"
            if env.is_main:
                preemption.write_requeue_marker(run_dir, f"step {step}: {reason}")
            log.warning(
                "stopping at step %d (%s); checkpoint written, exiting with %d to be requeued",
                step,
                reason,
                preemption.REQUEUE_EXIT_CODE,
            )
            return preemption.REQUEUE_EXIT_CODE

    if env.is_main:
        preemption.remove_requeue_marker(run_dir)
    log.info("training finished at step %d", step)
    return 0
