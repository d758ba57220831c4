"""`python -m <pkg> benchmark`: the package's training step against a plain loop on the same
model and batch size; prints one JSON line, then one sentence on stderr. docs/training.md
("Benchmark") says what each figure means and what was measured.

The plain loop (`"baseline"` in the line) depends on the data: batches drawn or gathered from
memory (token windows, arrays) are compared with a bare loop on one batch already on the device
(it reads no data; token windows also with `inline`, the bare loop reading each batch from the
same shards as nanoGPT's get_batch does); decoded samples (images) with torchvision's reference
train.py written plainly (data/plain_loader.py), the same AdamW on both sides (the loops:
training/baselines.py). The loops run in rounds of one block each, in turning order; each ratio
is the median over the rounds of the package's block over the other loop's block of the same
round (paired_ratio), timed by this process's CPU time on a CPU without loader processes, else
by the wall clock (on CUDA with a synchronisation at the ends of each block only). `ratio` goal:
<= 1.03; `inline_ratio`: <= 1.00. With one rank every loop steps the run's own model and
optimizer.
`bench_compare_compile=true` measures the other `compile` setting too; `bench_checkpoint=true`
what a checkpoint costs training (a synchronous save's stall against an asynchronous one's).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import shutil
import statistics
import sys
from pathlib import Path

import torch

from .. import checkpoint, distributed
from ..checkpoint import adapters
from ..checkpoint.start import load_start, open_start
from ..config.settings import Config
from ..data.batches import DRAW_AHEAD_STEPS, draws_ahead, resolve_num_workers
from ..data.plain_loader import (
    PREFETCH_FACTOR,
)
from ..distributed import DistEnv
from ..models import spec_of
from ..telemetry.timing import Blocks, paired_ratio, round_quartiles
from ..training.baselines import Baseline, bare_loop, inline_loop, plain_loop
from ..training.build import build, input_pipeline
from ..training.step import train_step
from .arguments import add_config_arguments

BLOCK = 5  # steps per timed block; the loops' blocks alternate in rounds

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


def measure(cfg: Config, env: DistEnv, device: torch.device) -> dict:
    """Warmup, then `bench_steps` steps of each loop in alternating blocks; the figures."""
    start = open_start(cfg, spec_of(cfg), "")  # init_from, model=hf's pretrained weights
    run = build(cfg, env, device, start)
    run.memory |= load_start(start, run.model, run.spec, cfg, run.source.info)[2]
    # decoded samples: against a DataLoader loop; batches drawn or gathered: against a bare one
    decoded = run.source.decodes and run.source.draw is None
    workers = resolve_num_workers(cfg.num_workers, run.source.decodes)
    # While one loop runs, the other's loader fills its queue (PREFETCH_FACTOR batches per
    # process): blocks are long beside that, so most of their steps wait as in training.
    block = max(BLOCK, 4 * PREFETCH_FACTOR * workers) if decoded else BLOCK
    if draws_ahead(run.source) and workers == 0:
        # Token windows and arrays are read DRAW_AHEAD_STEPS steps at a time without loader
        # processes: a block of as many steps holds exactly one read, so its time per step is
        # the true mean (a median of shorter blocks would skip the blocks that read).
        block = DRAW_AHEAD_STEPS
    blocks, warmup = -(-cfg.bench_steps // block), cfg.bench_warmup  # whole blocks, rounded up
    _, inputs = input_pipeline(run, warmup + blocks * block + 2)
    baseline, inline = None, None
    try:
        # the inline loop draws the windows of the package's steps from here on
        inline = inline_loop(run)  # None: the kind has no inline reader
        baseline = plain_loop(run, workers) if decoded else bare_loop(run, next(inputs))

        kept: list[torch.Tensor] = []  # the non-finite check's values since its last read

        def package_step():
            loss = train_step(run, inputs)
            run.state.step += 1
            # the check's part of a training step (telemetry/health.py): the loss and gradient
            # norm kept on the device, read every log_every steps (where training reads them
            # with the log line's own values: here a read of its own, an upper bound)
            kept.extend([loss] if run.grad_norm is None else [loss, run.grad_norm])
            if run.state.step % cfg.log_every == 0:
                if not math.isfinite(torch.stack(kept).sum().item()):
                    raise RuntimeError(f"benchmark: a NaN or inf by step {run.state.step}")
                kept.clear()

        loops = [package_step, baseline.step] + ([inline.step] if inline else [])
        for step in loops:
            Blocks().time(step, device, warmup)
        times = [Blocks() for _ in loops]
        wait_before = inputs.wait_s
        their_wait_before = baseline.wait_s() if baseline.wait_s else 0.0
        for number in range(blocks):  # rounds of one block each, in turn: ABC, CBA, ABC, ...
            order = list(zip(loops, times, strict=True))
            for step, taken in order if number % 2 == 0 else order[::-1]:
                taken.time(step, device, block)
        wait = inputs.wait_s - wait_before
        saves = measure_checkpoint(run, cfg) if wanted(cfg.bench_checkpoint, device) else {}
    finally:
        inputs.close()
        if baseline is not None:
            baseline.close()
    # The ratios' clock: on a CPU with no loader processes every loop's work is this process's,
    # and its CPU time is its wall time on a quiet machine, unchanged by other processes taking
    # the cores (measured: two busy processes beside the tiny GPT scattered the wall-clock ratio
    # from 0.75 to 1.10, the CPU-time ratio from 1.00 to 1.04). Elsewhere (a GPU, loader
    # processes: the waits are the point) the wall clock.
    by_cpu = device.type == "cpu" and workers == 0
    clocked = [t.cpu if by_cpu else t.wall for t in times]
    ours, theirs = times[0].wall, times[1].wall
    ours_s, their_s = statistics.median(ours), statistics.median(theirs)
    units, other = run.spec.task.unit, baseline.key
    per_step = cfg.batch_size * cfg.grad_accum_steps * env.world_size
    per_step *= run.spec.units_per_sample(cfg)
    result = {
        "model": run.spec.label(cfg),
        "dataset": cfg.dataset,
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "world_size": env.world_size,
        "parallelism": cfg.parallelism,
        "compile": cfg.compile,
        "threads": torch.get_num_threads(),
        "batch_size": cfg.batch_size,
        "grad_accum_steps": cfg.grad_accum_steps,
        "steps": len(ours) * block,
        "block_steps": block,
        "baseline": baseline.description,
        "train_step_median_s": ours_s,
        f"{other}_step_median_s": their_s,
        f"train_{units}_per_s": per_step / ours_s,
        f"{other}_{units}_per_s": per_step / their_s,
        "ratio": paired_ratio(clocked[0], clocked[1]),
        "ratio_quartiles": round_quartiles(clocked[0], clocked[1]),
        "data_wait_fraction": wait / (sum(ours) * block),
        **inline_figures(inline, times[2:], clocked, per_step, units),
        "clock": "process CPU time" if by_cpu else "wall",
        # in the package's step: each step's loss (and clipped norm) kept, read every log_every
        "non_finite_check": f"loss and gradient norm, read every {cfg.log_every} steps",
        "blocks": dict(zip(["train", other, "inline"][: len(loops)], clocked, strict=True)),
        "gflop_per_step_and_rank": run.flops_per_step / 1e9,
        **run.memory,  # host memory before the build and, when weights were loaded, after
        **adapters.state_sizes(run.model),  # an adapter's state beside full fine-tuning's
    }
    if baseline.wait_s:
        their_wait = baseline.wait_s() - their_wait_before
        result |= {
            "num_workers": workers,
            f"{other}_data_wait_fraction": their_wait / (sum(theirs) * block),
        }
    if device.type == "cpu":  # how much of the wall time this process computed
        result["cpu_share"] = sum(times[0].cpu) / sum(ours)
    if device.type == "cuda":
        peak = cfg.peak_tflops * 1e12
        result["mfu"] = run.flops_per_step / ours_s / peak
        result[f"{other}_mfu"] = run.flops_per_step / their_s / peak
        result["peak_mem_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
    return result | saves


def inline_figures(
    inline: Baseline | None, times: list[Blocks], clocked: list, per_step, units
) -> dict:
    """The inline-reading loop's figures, when it ran (token windows)."""
    if inline is None:
        return {}
    inline_s = statistics.median(times[0].wall)
    return {
        "inline_baseline": inline.description,
        "inline_step_median_s": inline_s,
        f"inline_{units}_per_s": per_step / inline_s,
        "inline_ratio": paired_ratio(clocked[0], clocked[2]),
    }


def wanted(setting: str, device: torch.device) -> bool:
    return setting == "true" or (setting == "auto" and device.type == "cuda")


def measure_checkpoint(run, cfg: Config) -> dict:
    """Two saves of the run's checkpoint (model, optimizer, ...) each way, under run_dir (the
    file system training writes to); the second is timed: the first allocates buffers."""
    run_dir = Path(cfg.run_dir)
    made_run_dir = not run_dir.exists()  # removed again afterwards, when this made it
    directory = run_dir / "benchmark-checkpoints"
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
        if made_run_dir:
            with contextlib.suppress(OSError):  # not empty: something else wrote there
                run_dir.rmdir()
    return result


def benchmark(cfg: Config) -> dict:
    with distributed.process_group(cfg.dist_timeout_s, cfg.cpu_threads, cfg.device) as (env, dev):
        result = measure(cfg, env, dev)
        if wanted(cfg.bench_compare_compile, dev):
            other_cfg = dataclasses.replace(cfg, compile=not cfg.compile, bench_checkpoint="false")
            other = measure(other_cfg, env, dev)
            on, off = (result, other) if cfg.compile else (other, result)
            loop = baseline_key(result)
            keys = ("train_step_median_s", f"{loop}_step_median_s", "ratio", "mfu", f"{loop}_mfu")
            keys += ("inline_step_median_s", "inline_ratio")
            result["compile_on"] = {k: on[k] for k in keys if k in on}
            result["compile_off"] = {k: off[k] for k in keys if k in off}
    return result if env.is_main else {}


TARGET_RATIO = 1.03  # the package's step at most 3% slower than a bare loop
TARGET_INLINE_RATIO = 1.00  # and no slower than a loop that reads its batches inline
LOADED_CPU_SHARE = 0.9  # below this share of the wall time computing, the machine was shared
SLOW_INPUT_FRACTION = 0.05  # a step waiting longer than this for its input: the input is slow


def baseline_key(result: dict) -> str:
    return "plain" if "plain_step_median_s" in result else "bare"


def verdict(result: dict) -> str:
    """The JSON line in one plain sentence."""
    ratio = round(result["ratio"], 3)  # judged as printed
    slower = f"{(ratio - 1) * 100:.1f}% slower" if ratio > 1 else f"{(1 - ratio) * 100:.1f}% faster"
    within = "within" if ratio <= TARGET_RATIO else "above"
    if baseline_key(result) == "plain":
        than = (
            "the plain torchvision-style loop (a DataLoader with a DistributedSampler over the "
            "same images, the same transforms, model, loss and optimizer)"
        )
    else:
        than = "a bare PyTorch loop on the same model and batch that reads no data (it reuses one)"
    sentence = (
        f"ratio {ratio:.3f}: the package's training step is {slower} than {than} "
        f"({within} the target of {TARGET_RATIO})"
    )
    waited = result.get("data_wait_fraction", 0.0)
    if ratio > TARGET_RATIO and waited > SLOW_INPUT_FRACTION:
        sentence += f"; the package's step waited {waited:.0%} of its time for its input"
    elif ratio > TARGET_RATIO and result["device"] == "cpu":
        sentence += (
            "; on a CPU with a small model the fixed cost per step weighs more than on a GPU"
        )
    if "inline_ratio" in result:
        inline = round(result["inline_ratio"], 3)
        meets = "meets" if inline <= TARGET_INLINE_RATIO else "misses"
        sentence += (
            f"; ratio {inline:.3f} against that loop reading each batch inline, nanoGPT's way "
            f"({meets} its target of {TARGET_INLINE_RATIO:.2f})"
        )
    if result.get("clock", "wall") != "wall" and result["cpu_share"] < LOADED_CPU_SHARE:
        sentence += (
            f"; other processes held the cores {1 - result['cpu_share']:.0%} of the time (the "
            "ratios are of each loop's CPU time, which they disturb far less than the wall clock)"
        )
    if "plain_data_wait_fraction" in result:
        sentence += (
            f"; waiting for input: the package {result['data_wait_fraction']:.1%} of its step "
            f"time, the plain loop {result['plain_data_wait_fraction']:.1%}"
        )
    if "mfu" in result:
        sentence += f"; MFU {result['mfu']:.1%} of peak_tflops"
    return sentence + adapters.describe_sizes(result) + "."


def add_arguments(cmd: argparse.ArgumentParser) -> None:
    from ..models import MODELS

    add_config_arguments(cmd)
    cmd.add_argument(
        "--size",
        choices=("default", "large"),
        default="default",
        help="large: the 75M-parameter MLP (model=mlp, 1024 -> 8192 -> 8192)",
    )
    cmd.add_argument("--model", choices=tuple(MODELS), help="same as model=...")
{%- if cookiecutter.workload in ("all", "language") %}
    cmd.add_argument("--preset", help="same as preset=..., e.g. gpt2-124m")
{%- endif %}


def run(args: argparse.Namespace) -> int:
    from ..config.settings import load_config

    extra = SIZES[args.size] + [f"model={args.model}"] * bool(args.model)
{%- if cookiecutter.workload in ("all", "language") %}
    extra += [f"preset={args.preset}"] * bool(args.preset)
{%- endif %}
    return main(load_config(args.config, extra + args.overrides).config)


def main(cfg: Config) -> int:
    result = benchmark(cfg)
    if result:
        print(json.dumps(result), flush=True)
        print(verdict(result), file=sys.stderr, flush=True)
    return 0
