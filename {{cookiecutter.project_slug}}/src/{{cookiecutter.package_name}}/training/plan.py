"""What a run needs on each GPU before it waits in the queue (`python -m <pkg> plan`,
commands/plan.py; docs/scale.md): the model built on the meta device (shapes only: no weights
read or made, no GPU), its parameters, gradients and AdamW states per GPU under DDP, FSDP and
HSDP, the activations autograd keeps at the run's batch, context and precision (with and without
activation checkpointing), whether that fits a GH200, the step time at a stated MFU and the
communication each layout puts on NVLink and on Slingshot.

The figures follow what the package does (parallel.py, optim.py): parameters in fp32 under
every precision (bf16 computes through FSDP2's MixedPrecisionPolicy or autocast, and AdamW
updates the fp32 weights), fp32 gradients, AdamW's two fp32 moments and a step count per tensor.
FSDP2 gives each rank ceil(rows / shard) rows of every parameter (padded alike on every rank).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from .. import parallel
from ..config_keys import ConfigError, first_line
from ..data.batches import example_batch, map_tensors
from ..data.kinds import open_splits
from ..models import spec_of

GIB = 2**30
# A GH200 module's HBM, as its GPU reports it: 97871 MiB of the "about 96 GB" per module
# (https://docs.cscs.ch/alps/hardware/).
GPU_MEMORY_BYTES = 97871 * 2**20
# Held back from the run's tensors: the CUDA context (about 0.5 GiB), NCCL's buffers (about
# 1 GiB per communicator: DDP and FSDP have one, HSDP two) and the caching allocator's
# fragmentation (a few percent of what the step allocates and frees).
RESERVE_BYTES = 6 * GIB
GPUS_PER_NODE = 4  # GH200 modules per Alps node (https://docs.cscs.ch/alps/hardware/)
# Nominal bandwidths, GB/s per direction. NVLink 4 between the GH200 modules of a node: 18 links
# of 25 GB/s per GPU (NVIDIA's H100 figure, 900 GB/s both ways). Slingshot-11 between nodes: one
# NIC of 200 Gb/s per GH200 module (https://docs.cscs.ch/alps/hardware/). The doctor's measured
# all-reduce bandwidth on a healthy node is about half of these (doctor/checks.py).
NVLINK_GBPS = 450.0
SLINGSHOT_NIC_GBPS = 25.0
# The stated model FLOPs utilisation of the step-time estimate: dense transformers trained with
# FSDP2 in bf16 on H100-class GPUs reach 35 to 45 % (torchtitan's Llama 3 8B figures).
MFU = 0.40
FP32 = 4  # bytes: parameters, gradients and AdamW's moments are fp32 under every precision


@dataclass(frozen=True)
class Model:
    """The run's model as the plan sees it: sizes from the meta device, activations traced."""

    label: str
    parameters: int  # every parameter once (a tied embedding once)
    trainable: int  # those that get gradients and AdamW states (LoRA: its adapters)
    tensors: int  # trainable parameter tensors: AdamW keeps a step count for each
    matrices: int  # parameters of 2 or more dimensions: the ones autocast copies
    shapes: tuple[tuple[tuple[int, ...], bool], ...]  # (shape, trainable) of each parameter
    buffer_bytes: int  # buffers (BatchNorm statistics, rotary tables): on every GPU, unsharded
    root: int  # parameters outside the blocks (embeddings, output layer, final norm)
    largest_block: int  # parameters of the largest block
    has_blocks: bool
    activations: int  # bytes autograd keeps for backward, one micro-batch
    checkpointed: int  # the same with each block recomputed in backward
    flops_per_step: float  # per GPU: forward and backward of batch_size x grad_accum_steps
    precision: str  # bf16, fp16 or fp32, as on a GPU


def compute_precision(cfg) -> str:
    """The precision the run computes in on a GPU (training/build.py: auto is bf16 there)."""
    return "bf16" if cfg.precision == "auto" else cfg.precision


class FlashAttention(TorchFunctionMode):
    """scaled_dot_product_attention as a GPU runs it: the flash kernel, which keeps the output
    and a log-sum-exp per row for backward, not the (T x T) attention weights that the math
    kernel, the only one the meta device has, keeps. The CPU's flash kernel keeps the same
    tensors and has meta shapes."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is not F.scaled_dot_product_attention:
            return func(*args, **kwargs)
        query, key, value = args[:3]
        if key.shape[-3] != query.shape[-3] and not kwargs.get("enable_gqa"):
            return func(*args, **kwargs)
        out, _ = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            query,
            key,
            value,
            0.0,  # dropout: a GPU's flash kernel keeps its random state, not a mask
            kwargs.get("is_causal", False) if len(args) < 6 else args[5],
            attn_mask=kwargs.get("attn_mask", args[3] if len(args) > 3 else None),
            scale=kwargs.get("scale"),
        )
        return out


class ShapesOnly(TorchDispatchMode):
    """A value read from a meta tensor (`.item()`, `bool(...)`) answered with 1 (True), where
    torch would raise: transformers asks of its position ids whether they restart, that is
    whether the window packs several documents (`(mask[:, -1] == 0).all()`: no, one document)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default and args[0].is_meta:
            return True if args[0].dtype == torch.bool else 1
        return func(*args, **(kwargs or {}))


def storage_key(tensor: torch.Tensor) -> int:
    return tensor.untyped_storage()._cdata


class SavedTensors:
    """The bytes autograd keeps for backward (saved_tensors_hooks), each storage once and the
    parameters' not at all (they are the weights), by the block that saved them (None: outside
    the blocks); the bytes of each block's input, which activation checkpointing keeps."""

    def __init__(self, model: nn.Module, blocks):
        self.parameters = {storage_key(p) for p in model.parameters()}
        self.seen: dict[int, torch.Tensor] = {}  # kept alive: no storage is reused meanwhile
        self.by_block: dict[int | None, int] = {}
        self.inputs = 0
        self.current: int | None = None
        self.hooks = []
        for index, block in enumerate(blocks or []):
            self.hooks.append(block.register_forward_pre_hook(self.enter(index)))
            self.hooks.append(block.register_forward_hook(self.leave))

    def enter(self, index: int):
        def hook(module, args):
            self.current = index
            first = next((a for a in args if isinstance(a, torch.Tensor)), None)
            if first is not None:
                self.inputs += first.untyped_storage().nbytes()

        return hook

    def leave(self, module, args, output):
        self.current = None

    def pack(self, tensor: torch.Tensor) -> torch.Tensor:
        key = storage_key(tensor)
        if key not in self.parameters and key not in self.seen:
            self.seen[key] = tensor
            size = tensor.untyped_storage().nbytes()
            self.by_block[self.current] = self.by_block.get(self.current, 0) + size
        return tensor

    def close(self) -> None:
        for hook in self.hooks:
            hook.remove()
        self.seen.clear()


def trace_activations(spec, model: nn.Module, batch) -> tuple[int, int]:
    """(bytes without, bytes with activation checkpointing) that one forward of `batch` keeps
    for backward. With checkpointing each block keeps its input only, and one block at a time
    recomputes its own during backward: the largest block's on top."""
    blocks = parallel.blocks_of(spec, model)
    saved = SavedTensors(model, blocks)
    try:
        hooks = torch.autograd.graph.saved_tensors_hooks(saved.pack, lambda t: t)
        with hooks, FlashAttention(), ShapesOnly():
            spec.task.loss(model, batch)
        inside = [n for block, n in saved.by_block.items() if block is not None]
        outside = saved.by_block.get(None, 0)
        return outside + sum(inside), outside + saved.inputs + max(inside, default=0)
    finally:
        saved.close()


def meta_batch(example, batch_size: int):
    """The run's micro-batch as shapes: one sample of its data, batch_size times."""
    return map_tensors(
        lambda t: torch.empty((batch_size, *t.shape[1:]), dtype=t.dtype, device="meta"), example
    )


DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def measure_model(cfg) -> Model:
    """The run's model built on the meta device (its dataset opened for the vocabulary or the
    classes: a directory's index, or synthetic data in memory)."""
    spec = spec_of(cfg)
    source = open_splits(cfg, spec)
    example = example_batch(source, cfg)
    try:
        return measured(cfg, spec, source.info, example)
    except ConfigError:
        raise
    except (RuntimeError, NotImplementedError, TypeError, ValueError) as err:
        raise ConfigError(
            f"model={cfg.model} cannot be built and run on the meta device (shapes without "
            f"values), which the plan needs: {first_line(err)}"
        ) from None


def measured(cfg, spec, info, example) -> Model:
    with parallel.parameters_on_meta():
        model = spec.build(cfg, info)
    model.to("meta")  # the buffers too: the trace below runs on shapes only
    flops = spec.training_flops_per_sample(cfg, model, info, example)
    params = list(model.parameters())
    blocks = parallel.blocks_of(spec, model)
    in_blocks = {id(p) for block in blocks or [] for p in block.parameters()}
    block_sizes = [sum(p.numel() for p in block.parameters()) for block in blocks or []]
    precision = compute_precision(cfg)
    model.to(DTYPES[precision]).train()  # as FSDP2's policy computes: activations in bf16
    activations, checkpointed = trace_activations(spec, model, meta_batch(example, cfg.batch_size))
    trainable = [p for p in params if p.requires_grad]
    return Model(
        label=spec.label(cfg),
        parameters=sum(p.numel() for p in params),
        trainable=sum(p.numel() for p in trainable),
        tensors=len(trainable),
        matrices=sum(p.numel() for p in params if p.dim() >= 2),
        shapes=tuple((tuple(p.shape), p.requires_grad) for p in params),
        buffer_bytes=sum(b.numel() * FP32 for b in model.buffers()),
        root=sum(p.numel() for p in params if id(p) not in in_blocks),
        largest_block=max(block_sizes, default=0),
        has_blocks=blocks is not None,
        activations=activations,
        checkpointed=checkpointed,
        flops_per_step=flops * cfg.batch_size * cfg.grad_accum_steps,
        precision=precision,
    )


def shard_elements(shape: tuple[int, ...], shard: int) -> int:
    """Elements of one rank's part of a parameter sharded over `shard` ranks: FSDP2 gives each
    ceil(rows / shard) rows (the last ranks' parts padded to that)."""
    if not shape:
        return 1
    rest = math.prod(shape[1:])
    return -(-shape[0] // shard) * rest


def model_state_bytes(model: Model, shard: int) -> dict[str, int]:
    """Parameters (and buffers), gradients and AdamW's states on each GPU, as allocated: fp32
    parameters (bf16 computes from them), fp32 gradients of the trainable ones, two fp32 moments
    each and a 4-byte step count per trainable tensor (optim.py's AdamW)."""
    weights = sum(shard_elements(s, shard) for s, _ in model.shapes) * FP32
    grads = sum(shard_elements(s, shard) for s, trains in model.shapes if trains) * FP32
    return {
        "weights": weights + model.buffer_bytes,
        "gradients": grads,
        "optimizer": 2 * grads + FP32 * model.tensors,
    }


@dataclass(frozen=True)
class Layout:
    parallelism: str  # ddp, fsdp or hsdp
    nodes: int
    gpus_per_node: int
    shard: int  # GPUs one copy of the model is sharded over (1: DDP)
    activation_checkpointing: bool

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def replicas(self) -> int:
        return self.gpus // self.shard


def working_bytes(model: Model, layout: Layout, cfg) -> int:
    """What the step holds beside the model states and activations. Under autocast (DDP in bf16
    or fp16, FSDP in fp16) a 2-byte copy of every matrix, cached until the step's forward and
    backward end. Under FSDP2: the root's parameters gathered for the whole step, two blocks'
    at a time (one computing, the next prefetched), one block's unsharded fp32 gradients before
    their reduce-scatter, and with grad_accum_steps > 1 every unsharded gradient (accumulated
    without the reduce-scatter until the last micro-batch)."""
    autocast = model.precision != "fp32" and (layout.shard == 1 or model.precision == "fp16")
    held = 2 * model.matrices if autocast else 0
    if layout.shard > 1:
        gathered = FP32 if model.precision != "bf16" else 2
        held += gathered * (model.root + 2 * model.largest_block) + FP32 * model.largest_block
        if cfg.grad_accum_steps > 1:
            held += FP32 * model.trainable
    return held


def collective_gbps(members: int, per_node: int) -> float:
    """Bus bandwidth of a ring over `members` GPUs, `per_node` of them on each node: NVLink
    inside one node; across nodes each GPU's own NIC, so a node's `per_node` members send over
    as many NICs at once (the node's NICs shared by the gpus_per_node / per_node groups that run
    side by side)."""
    if members <= per_node:
        return NVLINK_GBPS
    return SLINGSHOT_NIC_GBPS * per_node


def communication(model: Model, layout: Layout, cfg) -> dict[str, float]:
    """Seconds of one optimizer step's collectives, and the GiB each GPU moves over NVLink and
    through its NIC over Slingshot; bandwidth terms only (ring algorithms: an all-reduce of B
    bytes over n GPUs moves 2 (n - 1) / n B per GPU, an all-gather or reduce-scatter
    (n - 1) / n B)."""
    n, per_node, gpn = layout.gpus, min(layout.gpus, layout.gpus_per_node), layout.gpus_per_node
    grads = FP32 * model.trainable  # reduced in fp32 under every precision
    moved = {"nvlink": [0.0, 0.0], "slingshot": [0.0, 0.0]}  # [bytes, seconds]

    def add(bytes_: float, members: int, per: int) -> None:
        """A collective that moves `bytes_` per GPU: over NVLink inside a node; across nodes
        through the NICs of the `per` members on each node (a ring's channels, one per NIC), so
        each NIC carries bytes_ / per."""
        gbps = collective_gbps(members, per)
        over_nvlink = gbps == NVLINK_GBPS
        link = moved["nvlink" if over_nvlink else "slingshot"]
        link[0] += bytes_ if over_nvlink else bytes_ / per
        link[1] += bytes_ / (gbps * 1e9)

    if layout.shard == 1:  # DDP: one all-reduce of the gradients
        if n > 1:
            add(2 * (n - 1) / n * grads, n, per_node)
    else:
        shard = layout.shard
        gathered = (2 if model.precision == "bf16" else FP32) * model.parameters
        shard_per_node = min(shard, gpn)
        # every micro-batch gathers each block's parameters in forward and again in backward
        gathers = 2 * cfg.grad_accum_steps * (shard - 1) / shard * gathered
        add(gathers + (shard - 1) / shard * grads, shard, shard_per_node)
        if layout.replicas > 1:  # HSDP: the shards' gradients all-reduced across the copies
            replica_per_node = max(1, gpn // shard)
            r = layout.replicas
            add(2 * (r - 1) / r * grads / shard, r, replica_per_node)
    return {
        "nvlink_gib": moved["nvlink"][0] / GIB,
        "slingshot_gib": moved["slingshot"][0] / GIB,
        "communication_s": moved["nvlink"][1] + moved["slingshot"][1],
    }


def estimate(model: Model, layout: Layout, cfg, peak_tflops: float) -> dict:
    """One layout's figures per GPU: memory by part, whether it fits, the step time."""
    states = model_state_bytes(model, layout.shard)
    kept = model.checkpointed if layout.activation_checkpointing else model.activations
    parts = {
        **states,
        "activations": kept,  # one micro-batch at a time
        "working": working_bytes(model, layout, cfg),
    }
    total = sum(parts.values())
    # activation checkpointing runs each block's forward again in backward: 8 instead of 6
    # FLOPs per parameter and token
    flops = model.flops_per_step * (8 / 6 if layout.activation_checkpointing else 1)
    compute_s = flops / (MFU * peak_tflops * 1e12)
    comm = communication(model, layout, cfg)
    return {
        "parallelism": layout.parallelism,
        "nodes": layout.nodes,
        "gpus": layout.gpus,
        "shard_gpus": layout.shard,
        "activation_checkpointing": layout.activation_checkpointing,
        **{f"{name}_gib": value / GIB for name, value in parts.items()},
        "gib_per_gpu": total / GIB,
        "fits": total <= GPU_MEMORY_BYTES - RESERVE_BYTES,
        "compute_s": compute_s,
        **comm,
        # no overlap of communication with computation assumed: an upper bound
        "step_s": compute_s + comm["communication_s"],
    }
