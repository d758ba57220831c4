"""`python -m <pkg> benchmark`: the package's training step against a bare
forward/backward/optimizer loop on the same model and batch size; prints one JSON line.

The bare loop does the same math (autocast, loss, backward, clipping, AdamW) on one batch that
is already on the device; the package step adds what a real run needs (the data loader, the
schedule, loss bookkeeping, DDP when there are several ranks). The ratio is the overhead.
"""

from __future__ import annotations

import json
import statistics
import time

import torch

from . import distributed
from .config import Config
from .distributed import DistEnv
from .model import loss_fn
from .train import build, make_optimizer, train_step


def _timed(step, device: torch.device, n: int) -> list[float]:
    times = []
    for _ in range(n):
        start = time.perf_counter()
        step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
    return times


def benchmark(cfg: Config) -> dict:
    with distributed.process_group(cfg.dist_timeout_s, cfg.cpu_threads) as (env, device):
        result = measure(cfg, env, device)
    return result if env.is_main else {}


def measure(cfg: Config, env: DistEnv, device: torch.device) -> dict:
    """Warmup, then `bench_steps` steps of each loop, alternating; the JSON record."""
    p = build(cfg, env, device)
    x, y = next(p.batches)
    x, y = x.to(device), y.to(device)
    bare_model = p.model
    bare_opt = make_optimizer(bare_model, cfg, device)

    def bare_step():
        for _ in range(cfg.grad_accum_steps):
            with p.autocast():
                loss = loss_fn(bare_model(x), y) / cfg.grad_accum_steps
            loss.backward()
        if cfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(bare_model.parameters(), cfg.grad_clip)
        bare_opt.step()
        bare_opt.zero_grad(set_to_none=True)

    def package_step():
        train_step(p)

    _timed(package_step, device, cfg.bench_warmup)
    _timed(bare_step, device, cfg.bench_warmup)
    ours, bare = [], []
    for _ in range(cfg.bench_steps):  # alternating: busy neighbours slow both alike
        ours += _timed(package_step, device, 1)
        bare += _timed(bare_step, device, 1)
    accum = cfg.grad_accum_steps
    samples = cfg.batch_size * accum * env.world_size
    result = {
        "device": str(device),
        "world_size": env.world_size,
        "threads": torch.get_num_threads(),
        "batch_size": cfg.batch_size,
        "grad_accum_steps": accum,
        "steps": len(ours),
        "train_step_median_s": statistics.median(ours),
        "train_samples_per_s": samples / statistics.median(ours),
        "bare_step_median_s": statistics.median(bare),
        "bare_samples_per_s": samples / statistics.median(bare),
    }
    result["ratio"] = result["train_step_median_s"] / result["bare_step_median_s"]
    return result


def main(cfg: Config) -> int:
    result = benchmark(cfg)
    if result:
        print(json.dumps(result), flush=True)
    return 0
