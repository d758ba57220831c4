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

import contextlib
import functools
import inspect
import logging
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.checkpoint import checkpoint

from .config_keys import key

log = logging.getLogger(__package__)


# fmt: off
@dataclass
class ParallelKeys:
    precision: str = key("auto", "auto: bf16 on GPU, fp32 on CPU; fp16 uses a grad scaler",
                         choices=("auto", "bf16", "fp16", "fp32"), resume=True)
    compile: bool = key(False, "torch.compile each block (see the benchmark figures)")
    tf32: bool = key(True, 'TF32 matmuls on GPU (torch.set_float32_matmul_precision("high"))')
    parallelism: str = key("ddp", "ddp (a replica per rank) or fsdp (FSDP2: sharded over ranks)",
                           choices=("ddp", "fsdp"))
    activation_checkpointing: bool = key(False, "recompute each block in backward: less memory")
    cpu_offload: bool = key(False, "fsdp: parameters and optimizer state in CPU memory")
# fmt: on


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
        if on_meta(model):  # shard first: each rank then allocates its own part only
            apply_fsdp(spec, model, device, bf16, cfg.cpu_offload)
            materialize(model, device)
        else:
            if not cfg.cpu_offload:
                model.to(device)
            apply_fsdp(spec, model, device, bf16, cfg.cpu_offload)
        return model, not bf16  # FSDP's policy casts the parameters: no autocast on top
    if cfg.parallelism == "fsdp":
        log.info("parallelism=fsdp with one rank: nothing to shard, training unsharded")
    if on_meta(model):
        materialize(model, device)
    model.to(device)
    if world > 1:
        model = DDP(
            model,
            device_ids=[device.index] if device.type == "cuda" else None,
            gradient_as_bucket_view=True,
            **NO_FORWARD_BUFFER_SYNC,  # RankZeroBuffers does it, at the end of each step
        )
    return model, True


# DDP's copy of rank 0's buffers before each forward, turned off. torch 2.13 renamed the switch
# (broadcast_buffers warns there); the images of older torch know only broadcast_buffers. Both
# still copy them once when DDP is built.
NO_FORWARD_BUFFER_SYNC = (
    {"forward_sync_buffers": False}
    if "forward_sync_buffers" in inspect.signature(DDP.__init__).parameters
    else {"broadcast_buffers": False}
)


class RankZeroBuffers:
    """Rank 0's buffers on every rank after each optimizer step (`sync()`): those a checkpoint
    holds, such as BatchNorm's running means, variances and counts.

    Each rank updates them from its own batch, so after a step they differ between ranks. DDP
    copies rank 0's over the others only at the start of the next training forward, so a save
    between two steps found different values on each rank; DCP writes a tensor that every rank
    holds from one of them, spreading those writes over the ranks, and took about half of them
    from rank 1: a resumed run went on from values rank 0 never had. FSDP2 never makes them
    equal, and each rank evaluated with its own. Made equal here after each step, under DDP and
    FSDP2 alike, every evaluation, save and export sees the state the run goes on from: DDP's
    values at DDP's cost (this replaces its broadcast, `broadcast_buffers=False`). Buffers that
    are not saved (`persistent=False`: masks, rotary tables) are equal on every rank from the
    start and are left out."""

    def __init__(self, model: nn.Module, world: int):
        saved = model.state_dict(keep_vars=True).keys() if world > 1 else ()
        owners = [name.rpartition(".") for name, _ in model.named_buffers() if name in saved]
        self.slots = [(model.get_submodule(owner), attr) for owner, _, attr in owners]

    def sync(self) -> None:
        if not self.slots:  # one rank, or a model without saved buffers: nothing to do
            return
        by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
        for module, attr in self.slots:
            buffer = getattr(module, attr)
            by_dtype.setdefault(buffer.dtype, []).append(buffer)
        with torch.no_grad():
            for buffers in by_dtype.values():  # one broadcast per dtype, as DDP's buckets
                flat = torch.cat([b.reshape(-1) for b in buffers])
                torch.distributed.broadcast(flat, src=0)
                values = flat.split([b.numel() for b in buffers])
                for buffer, value in zip(buffers, values, strict=True):
                    buffer.copy_(value.view(buffer.shape))


@contextlib.contextmanager
def parameters_on_meta(enabled: bool = True) -> Iterator[None]:
    """Build a model whose weights are loaded next (init_from, a pretrained model) without
    making them first: every parameter a module registers goes to the meta device (a shape,
    no memory). Buffers stay real, with the values their modules computed (rotary frequencies,
    which no checkpoint holds). What accelerate's `init_empty_weights(include_buffers=False)`
    does; parallelize() then gives each rank storage for its own part only."""
    if not enabled:
        yield
        return
    register = nn.Module.register_parameter

    def register_on_meta(module, name, param):
        if param is not None and not param.is_meta:
            param = nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)
        register(module, name, param)

    nn.Module.register_parameter = register_on_meta
    try:
        yield
    finally:
        nn.Module.register_parameter = register


def on_meta(model: nn.Module) -> bool:
    return any(p.is_meta for p in model.parameters())


def materialize(model: nn.Module, device: torch.device) -> None:
    """Storage on `device` for parameters on the meta device (their values: whatever memory
    held, until the weights are loaded); buffers keep their values."""
    buffers = dict(model.named_buffers())
    first_name: dict[int, str] = {}  # a parameter under two names (a tied output layer)
    tied = {
        name: first_name.setdefault(id(param), name)
        for name, param in model.named_parameters(remove_duplicate=False)
    }
    model.to_empty(device=device)
    params = dict(model.named_parameters(remove_duplicate=False))
    for name, first in tied.items():
        if params[name] is not params[first]:  # to_empty untied it (FSDP2 keeps ties itself)
            owner, _, attribute = name.rpartition(".")
            setattr(model.get_submodule(owner), attribute, params[first])
    with torch.no_grad():
        for name, buffer in model.named_buffers():
            buffer.copy_(buffers[name])


def sync_gradients(model: nn.Module, enabled: bool):
    """Context for a micro-batch: gradients are reduced only when `enabled` (the last one)."""
    if isinstance(model, DDP):
        return contextlib.nullcontext() if enabled else model.no_sync()
    if hasattr(model, "set_requires_gradient_sync"):  # FSDP2
        model.set_requires_gradient_sync(enabled)
    return contextlib.nullcontext()
