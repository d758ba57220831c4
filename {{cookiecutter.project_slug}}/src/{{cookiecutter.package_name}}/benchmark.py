"""`python -m <pkg> benchmark`: the package's training step against a bare
forward/backward/optimizer loop on the same model and batch size; prints one JSON line.

The bare loop does the same math (autocast, loss, backward, clipping, AdamW) on one batch that
is already on the device; the package step adds what a real run needs (the input pipeline, the
schedule, loss bookkeeping, DDP/FSDP when there are several ranks). `ratio` is the overhead
(goal: <= 1.03). On CUDA, time is measured with a synchronisation at the ends of each block of
steps only, so the CPU can run ahead as it does in training. MFU is model FLOPs per second over
`peak_tflops`; `data_wait_fraction` is the share of the package's time spent waiting for input.
After the JSON line (stdout), one sentence on stderr says what the ratio means.
With `bench_compare_compile=true` the other `compile` setting is measured too, and with
`bench_checkpoint=true` what a checkpoint of this model costs training: the stall of a
synchronous save (its whole write) against the stall of an asynchronous one. A run that starts
from weights (`init_from`, `model=hf`) loads them first, and the line says how much host memory
this rank held at its peak (`peak_rss_gib`) beside the model's size (`model_gib`):
loading is sharded, so with FSDP on N ranks the peak grows by about model_gib / N.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import statistics
import sys
import time
from pathlib import Path

import torch

from . import checkpoint, distributed
from .checkpoint.initial import load_initial_weights, open_initial
from .config.settings import Config
from .distributed import DistEnv
from .optim import make_optimizer
from .train import build, input_pipeline, parallel, train_step

BLOCK = 5  # steps per timed block; blocks of the two loops alternate

# `benchmark --size large`: the 75M-parameter MLP whose input once stalled an H100.
SIZES = {
    "default": [],
    "large": [
        "model=mlp",
        "num_features=1024",
        "hidden_dim=8192",
        "batch_size=4096",
        "synthetic_samples=65536",
        "eval_samples=4096",
    ],
}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _block_time(step, device: torch.device, n: int) -> float:
    """Seconds per step over `n` steps, synchronised at the ends only."""
    _sync(device)
    start = time.perf_counter()
    for _ in range(n):
        step()
    _sync(device)
    return (time.perf_counter() - start) / n


def measure(cfg: Config, env: DistEnv, device: torch.device) -> dict:
    """Warmup, then `bench_steps` steps of each loop in alternating blocks; the figures."""
    run = build(cfg, env, device)
    initial = open_initial(cfg, run.spec)  # init_from, model=hf's pretrained weights
    if initial is not None:
        run.memory |= load_initial_weights(run.model, run.spec, cfg, run.source.info, initial)[1]
    total = cfg.bench_warmup + cfg.bench_steps + BLOCK
    _, inputs = input_pipeline(run, total + 1)
    try:
        batch = next(inputs)
        torch.manual_seed(cfg.seed)
        bare_model = run.spec.build(cfg, run.source.info)
        if cfg.compile:
            parallel.apply_compile(run.spec, bare_model)
        bare_model.to(device)
        bare_opt = make_optimizer(bare_model, cfg, device)

        def bare_step():
            for _ in range(cfg.grad_accum_steps):
                with run.autocast():
                    loss = run.spec.task.loss(bare_model, batch) / cfg.grad_accum_steps
                loss.backward()
            if cfg.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(bare_model.parameters(), cfg.grad_clip)
            bare_opt.step()
            bare_opt.zero_grad(set_to_none=True)

        def package_step():
            train_step(run, inputs)
            run.state.step += 1

        for step in (package_step, bare_step):
            _block_time(step, device, max(cfg.bench_warmup, 1))
        ours, bare = [], []
        wait_before = inputs.wait_s
        for _ in range(max(1, cfg.bench_steps // BLOCK)):  # alternating: noise hits both alike
            ours.append(_block_time(package_step, device, BLOCK))
            bare.append(_block_time(bare_step, device, BLOCK))
        wait = inputs.wait_s - wait_before
        saves = measure_checkpoint(run, cfg) if wanted(cfg.bench_checkpoint, device) else {}
    finally:
        inputs.close()
    ours_s, bare_s = statistics.median(ours), statistics.median(bare)
    units = run.spec.task.unit
    per_step = cfg.batch_size * cfg.grad_accum_steps * env.world_size
    per_step *= run.spec.units_per_sample(cfg)
    result = {
        "model": run.spec.label(cfg),
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "world_size": env.world_size,
        "parallelism": cfg.parallelism,
        "compile": cfg.compile,
        "threads": torch.get_num_threads(),
        "batch_size": cfg.batch_size,
        "grad_accum_steps": cfg.grad_accum_steps,
        "steps": len(ours) * BLOCK,
        "train_step_median_s": ours_s,
        "bare_step_median_s": bare_s,
        f"train_{units}_per_s": per_step / ours_s,
        f"bare_{units}_per_s": per_step / bare_s,
        "ratio": ours_s / bare_s,
        "data_wait_fraction": wait / (sum(ours) * BLOCK),
        "gflop_per_step_and_rank": run.flops_per_step / 1e9,
        **run.memory,  # host memory before the build and, when weights were loaded, after
    }
    if device.type == "cuda":
        peak = cfg.peak_tflops * 1e12
        result["mfu"] = run.flops_per_step / ours_s / peak
        result["bare_mfu"] = run.flops_per_step / bare_s / peak
        result["peak_mem_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
    return result | saves


def wanted(setting: str, device: torch.device) -> bool:
    return setting == "true" or (setting == "auto" and device.type == "cuda")


def measure_checkpoint(run, cfg: Config) -> dict:
    """Two saves of the run's checkpoint (model, optimizer, ...) each way, under run_dir (the
    file system training writes to); the second is timed: the first allocates buffers."""
    directory = Path(cfg.run_dir) / "benchmark-checkpoints"
    result = {}
    for mode in ("sync", "async"):
        ckpt = checkpoint.CheckpointManager(
            directory / mode,
            run.checkpoint_parts(),
            keep=1,
            async_save=mode == "async",
            timeout_s=cfg.dist_timeout_s,
        )
        try:
            for step in (1, 2):
                run.state.step = step
                stall = ckpt.save(step).stall_s
                (done,) = ckpt.wait()
        finally:
            ckpt.close()
        result[f"checkpoint_{mode}_stall_s"] = stall
        result[f"checkpoint_{mode}_write_s"] = done.write_s
        result["checkpoint_gib"] = done.bytes / 2**30
    result["checkpoint_async_stall_fraction"] = (
        result["checkpoint_async_stall_s"] / result["checkpoint_sync_write_s"]
    )
    distributed.barrier()
    if run.env.is_main:
        shutil.rmtree(directory, ignore_errors=True)
    return result


def benchmark(cfg: Config) -> dict:
    with distributed.process_group(cfg.dist_timeout_s, cfg.cpu_threads, cfg.device) as (env, dev):
        result = measure(cfg, env, dev)
        if wanted(cfg.bench_compare_compile, dev):
            other_cfg = dataclasses.replace(cfg, compile=not cfg.compile, bench_checkpoint="false")
            other = measure(other_cfg, env, dev)
            on, off = (result, other) if cfg.compile else (other, result)
            keys = ("train_step_median_s", "bare_step_median_s", "ratio", "mfu", "bare_mfu")
            result["compile_on"] = {k: on[k] for k in keys if k in on}
            result["compile_off"] = {k: off[k] for k in keys if k in off}
    return result if env.is_main else {}


TARGET_RATIO = 1.03  # the package's step at most 3% slower than a bare loop


def verdict(result: dict) -> str:
    """The JSON line in one plain sentence."""
    ratio = result["ratio"]
    slower = f"{(ratio - 1) * 100:.1f}% slower" if ratio > 1 else f"{(1 - ratio) * 100:.1f}% faster"
    within = "within" if ratio <= TARGET_RATIO else "above"
    sentence = (
        f"ratio {ratio:.3f}: the package's training step is {slower} than a bare PyTorch loop "
        f"on the same model and batch ({within} the target of {TARGET_RATIO})"
    )
    if ratio > TARGET_RATIO and result["device"] == "cpu":
        sentence += (
            "; on a CPU with a small model the fixed cost per step weighs more than on a GPU"
        )
    if "mfu" in result:
        sentence += f"; MFU {result['mfu']:.1%} of peak_tflops"
    return sentence + "."


def main(cfg: Config) -> int:
    result = benchmark(cfg)
    if result:
        print(json.dumps(result), flush=True)
        print(verdict(result), file=sys.stderr, flush=True)
    return 0
