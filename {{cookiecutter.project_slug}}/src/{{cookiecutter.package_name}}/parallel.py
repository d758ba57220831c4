"""How the model is spread over the ranks: DDP (a full replica per rank), FSDP2 (parameters,
gradients and optimizer state sharded over all ranks) or HSDP (FSDP2 on a 2-D mesh: sharded
within groups of `hsdp_shard` ranks, by default one node's, and replicated across the groups),
plus activation checkpointing and torch.compile. Everything here is torch; the model's spec
names its repeated blocks (`ModelSpec.blocks`: the GPT's transformer blocks; a spec without
blocks, like the MLP's, is sharded, compiled and never activation-checkpointed as one unit).

When to use which: DDP while the model, its gradients and AdamW's two moments fit on one GPU
(about 16 bytes per parameter in fp32: ~5B parameters on a 96 GB GH200 before activations);
FSDP beyond that, or to fit a larger batch; HSDP when FSDP's per-step gathers over every node
cost more than the memory of one replica per group: each block's parameters are then gathered
over a node's NVLink only, and only the gradients cross the network between nodes.
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

from . import distributed
from .config_keys import ConfigError, key

log = logging.getLogger(__package__)


# fmt: off
@dataclass
class ParallelKeys:
    precision: str = key("auto", "auto: bf16 on GPU, fp32 on CPU; fp16 uses a grad scaler",
                         choices=("auto", "bf16", "fp16", "fp32"), resume=True)
    compile: bool = key(False, "torch.compile each block (see the benchmark figures)")
    tf32: bool = key(True, 'TF32 matmuls on GPU (torch.set_float32_matmul_precision("high"))')
    parallelism: str = key("ddp", "ddp (a replica per rank), fsdp (FSDP2: sharded over all ranks) "
                           "or hsdp (sharded within groups of hsdp_shard ranks, replicated "
                           "across them)", choices=("ddp", "fsdp", "hsdp"))
    hsdp_shard: int = key(0, "hsdp: the ranks of one shard group; the world size must be a "
                          "multiple (0: the ranks of one node, LOCAL_WORLD_SIZE)",
                          bounds=(0, 10**6))
    activation_checkpointing: bool = key(False, "recompute each block in backward: less memory")
    cpu_offload: bool = key(False, "fsdp, hsdp: parameters and optimizer state in CPU memory")
# fmt: on

SHARDED = ("fsdp", "hsdp")  # the layouts of FSDP2: each rank holds parts (DTensors) of tensors


def sharded(cfg) -> bool:
    """Whether the run's layout shards parameters, gradients and optimizer state (FSDP2)."""
    return cfg.parallelism in SHARDED


def check_layout_keys(cfg) -> None:
    """The layout's relations between keys (config/settings.py's `validate` asks)."""
    if sharded(cfg) and cfg.precision == "fp16":
        raise ConfigError(
            f"config key 'precision': fp16 is not supported with {cfg.parallelism}; use bf16"
        )
    if cfg.hsdp_shard and cfg.parallelism != "hsdp":
        raise ConfigError(
            f"config key 'hsdp_shard' applies to parallelism=hsdp, but this run's parallelism "
            f"is {cfg.parallelism}; remove it or set parallelism=hsdp"
        )


def mesh_shape(cfg, world: int, local_world: int) -> tuple[int, ...]:
    """The device mesh of a sharded layout: fsdp's one dimension of all ranks; hsdp's
    (replicate, shard) = (world / shard, shard), the shard group being `hsdp_shard` ranks or,
    with 0, the ranks of one node (`local_world`: LOCAL_WORLD_SIZE, or srun's tasks per node).
    Consecutive ranks form a group, and both launchers number a node's ranks consecutively, so
    a node's group gathers over NVLink and only the replicas' gradient reduction crosses nodes."""
    if cfg.parallelism != "hsdp":
        return (world,)
    shard = cfg.hsdp_shard or local_world
    if world % shard:
        given = (
            f"hsdp_shard={shard}"
            if cfg.hsdp_shard
            else f"hsdp_shard=0, the {shard} ranks of one node"
        )
        raise ConfigError(
            f"config key 'hsdp_shard': the world size {world} is not a multiple of {given}: "
            "parallelism=hsdp shards each block within groups of hsdp_shard ranks"
        )
    return (world // shard, shard)


def check_layout(cfg, world: int, local_world: int) -> None:
    """`train`'s refusals of its layout, before anything is written; collective. hsdp on one
    rank has nothing to shard or replicate; its groups need a world that is a multiple of
    them and, with hsdp_shard=0, nodes that run the same number of ranks."""
    if cfg.parallelism != "hsdp":
        return
    if world == 1:
        raise ConfigError(
            "config key 'parallelism': hsdp on one rank has nothing to shard or replicate; "
            "train on one rank with parallelism=ddp (an hsdp checkpoint resumes under it)"
        )
    if not cfg.hsdp_shard:  # every rank's own node: they must agree before building a mesh
        per_node = distributed.all_gather_object(local_world)
        if len(set(per_node)) > 1:
            counts = ", ".join(str(n) for n in sorted(set(per_node)))
            raise ConfigError(
                f"config key 'hsdp_shard': 0 (the ranks of one node) needs the same number of "
                f"ranks on every node, but the nodes run {counts}; set hsdp_shard"
            )
    mesh_shape(cfg, world, local_world)


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


def apply_fsdp(
    spec,
    model: nn.Module,
    device: torch.device,
    bf16: bool,
    cpu_offload: bool,
    mesh_shape: tuple[int, ...] | None = None,
) -> None:
    """FSDP2: each block is one shard unit (its parameters are gathered just before it runs and
    freed after), then the root holds the rest (embeddings, final norm). On a 2-D mesh
    (`mesh_shape` (replicate, shard)) this is HSDP: a unit is gathered within its shard group;
    its gradients are reduce-scattered there, then all-reduced between the groups' replicas.
    Default: one dimension of all ranks (fsdp)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    shape = mesh_shape or (torch.distributed.get_world_size(),)
    names = ("replicate", "shard") if len(shape) == 2 else None
    mesh = init_device_mesh(device.type, shape, mesh_dim_names=names)
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


def parallelize(
    model: nn.Module,
    spec,
    cfg,
    world: int,
    device: torch.device,
    bf16: bool,
    *,
    local_world: int,
):
    """Returns (model, uses_autocast). The model is moved to `device` and wrapped in place;
    `spec` (models.spec.ModelSpec) says which blocks are its units; `local_world` is the
    number of ranks on this node (hsdp_shard=0's group)."""
    if cfg.activation_checkpointing:
        apply_activation_checkpointing(spec, model)
    if cfg.compile:
        apply_compile(spec, model)
    if sharded(cfg) and world > 1:
        shape = mesh_shape(cfg, world, local_world)
        if len(shape) == 2:
            log.info(
                "parallelism=hsdp: each block sharded over a group of %d ranks, %d replicas",
                shape[1],
                shape[0],
            )
        if on_meta(model):  # shard first: each rank then allocates its own part only
            apply_fsdp(spec, model, device, bf16, cfg.cpu_offload, shape)
            materialize(model, device)
        else:
            if not cfg.cpu_offload:
                model.to(device)
            apply_fsdp(spec, model, device, bf16, cfg.cpu_offload, shape)
        return model, not bf16  # FSDP's policy casts the parameters: no autocast on top
    if sharded(cfg):
        log.info(
            "parallelism=%s with one rank: nothing to shard, training unsharded", cfg.parallelism
        )
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
