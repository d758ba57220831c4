"""How the model is spread over the ranks: DDP (a full replica per rank) or FSDP2 (parameters,
gradients and optimizer state sharded over the ranks), plus activation checkpointing and
torch.compile. Everything here is torch; the model's spec names its repeated blocks
(`ModelSpec.blocks`: the GPT's transformer blocks; a spec without blocks, like the MLP's, is
sharded, compiled and never activation-checkpointed as one unit).

When to use which: DDP while the model, its gradients and AdamW's two moments fit on one GPU
(about 16 bytes per parameter in fp32: ~5B parameters on a 96 GB GH200 before activations);
FSDP beyond that, or to fit a larger batch.
"""

from __future__ import annotations

import functools
import logging

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.checkpoint import checkpoint

log = logging.getLogger(__package__)


def blocks_of(spec, model: nn.Module) -> nn.ModuleList | None:
    """The model's repeated blocks, as its spec declares them (None: one unit)."""
    return None if spec.blocks is None else spec.blocks(model)


def apply_activation_checkpointing(spec, model: nn.Module) -> None:
    """Each block recomputes its activations in backward instead of keeping them. The block's
    own `forward` is replaced, not the block wrapped: its parameter names, and so checkpoints
    and exports, are the same with this setting on or off; every argument (a transformers
    layer's masks and position embeddings) and attribute stays the block's."""
    blocks = blocks_of(spec, model)
    if blocks is None:
        raise ValueError(f"activation_checkpointing needs a model with blocks ({spec.name})")
    for block in blocks:
        block.forward = functools.partial(checkpoint, block.forward, use_reentrant=False)


def apply_compile(spec, model: nn.Module) -> None:
    """Compile each block (the same code, compiled once and reused) or the whole model.

    In place (`Module.compile`), so state-dict keys stay those of the plain model.
    """
    blocks = blocks_of(spec, model)
    if blocks is None:
        model.compile()
        return
    for block in blocks:
        block.compile()


def apply_fsdp(spec, model: nn.Module, device: torch.device, bf16: bool, cpu_offload: bool) -> None:
    """FSDP2: each block is one shard unit (its parameters are gathered just before it runs and
    freed after), then the root holds the rest (embeddings, final norm)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh(device.type, (torch.distributed.get_world_size(),))
    options: dict = {"mesh": mesh}
    if bf16:  # compute in bf16, reduce gradients in fp32, keep fp32 master weights
        options["mp_policy"] = MixedPrecisionPolicy(
            param_dtype=torch.bfloat16, reduce_dtype=torch.float32
        )
    if cpu_offload:
        options["offload_policy"] = CPUOffloadPolicy()
    for block in blocks_of(spec, model) or []:
        fully_shard(block, **options)
    fully_shard(model, **options)


def parallelize(model: nn.Module, spec, cfg, world: int, device: torch.device, bf16: bool):
    """Returns (model, uses_autocast). The model is moved to `device` and wrapped in place;
    `spec` (models.spec.ModelSpec) says which blocks are its units."""
    if cfg.activation_checkpointing:
        apply_activation_checkpointing(spec, model)
    if cfg.compile:
        apply_compile(spec, model)
    if cfg.parallelism == "fsdp" and world > 1:
        if not cfg.cpu_offload:
            model.to(device)
        apply_fsdp(spec, model, device, bf16, cfg.cpu_offload)
        return model, not bf16  # FSDP's policy casts the parameters: no autocast on top
    if cfg.parallelism == "fsdp":
        log.info("parallelism=fsdp with one rank: nothing to shard, training unsharded")
    model.to(device)
    if world > 1:
        model = DDP(
            model,
            device_ids=[device.index] if device.type == "cuda" else None,
            gradient_as_bucket_view=True,
        )
    return model, True


def unwrap(model: nn.Module) -> nn.Module:
    """The plain module under DDP (FSDP2 shards in place, there is no wrapper)."""
    return model.module if isinstance(model, DDP) else model


def sync_gradients(model: nn.Module, enabled: bool):
    """Context for a micro-batch: gradients are reduced only when `enabled` (the last one)."""
    from contextlib import nullcontext

    if isinstance(model, DDP):
        return nullcontext() if enabled else model.no_sync()
    if hasattr(model, "set_requires_gradient_sync"):  # FSDP2
        model.set_requires_gradient_sync(enabled)
    return nullcontext()
