"""A run built from its config: the dataset opened, the model made and spread over the ranks
(parallel.py), the optimizer, the schedule and the input pipeline. `build` gives a new run at
step 0; its start (training/start.py) then loads a checkpoint or initial weights into it."""

from __future__ import annotations

import dataclasses
import random
from contextlib import nullcontext
from dataclasses import dataclass

import numpy as np
import torch

from .. import checkpoint, parallel
from ..checkpoint.start import Start
from ..config.settings import Config
from ..data import batches as data
from ..data.info import Splits
from ..data.kinds import open_splits
from ..data.prefetch import CudaCopier, Prefetcher, StandInCopier
from ..distributed import DistEnv
from ..models import spec_of
from ..models.spec import ModelSpec
from ..optim import Schedule, make_optimizer, make_schedule
from ..telemetry import metrics


@dataclass
class Run:
    """Everything a training step needs, built by `build`."""

    cfg: Config
    spec: ModelSpec  # what the run's model is: its task, blocks, context length
    env: DistEnv
    device: torch.device
    model: torch.nn.Module  # what the step calls: DDP-wrapped, FSDP-sharded or plain
    buffers: parallel.RankZeroBuffers  # made equal on every rank after each step
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
    grad_norm: torch.Tensor | None = None  # the last step's clipped gradient norm (step.py)

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


def build(cfg: Config, env: DistEnv, device: torch.device, start: Start | None = None) -> Run:
    """Data, model, optimizer, wrappers: a new run at step 0, into which its `start` loads next
    (checkpoint.start; None: the model keeps the weights made here)."""
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
    loaded_next = start is not None and start.replaced and not cfg.cpu_offload
    with parallel.parameters_on_meta(enabled=loaded_next):
        net = spec.build(cfg, source.info)
    flops = spec.training_flops_per_sample(cfg, net, source.info, data.example_batch(source, cfg))
    flops *= cfg.batch_size * cfg.grad_accum_steps
    bf16 = dtype == torch.bfloat16 and device.type == "cuda"
    model, use_autocast = parallel.parallelize(
        net, spec, cfg, env.world_size, device, bf16, local_world=env.local_world_size
    )
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
        buffers=parallel.RankZeroBuffers(model, env.world_size),
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
