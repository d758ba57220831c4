"""`python -m <pkg> plan [--config FILE] [key=value ...] nodes=N [--json]`: before a job waits in
the queue, what the run's model needs on each GPU under DDP, FSDP and HSDP (each with and without
activation checkpointing) on N nodes of 4 GH200s, whether it fits, the step time and the
communication, and the cheapest layout that fits (training/plan.py has the figures; docs/scale.md
says how to read them). Nothing is trained, no GPU is used: the model is built on the meta device.
"""

from __future__ import annotations

import argparse
import json
import re

from ..config_keys import ConfigError, integer_option, shown
from .arguments import add_config_arguments

NODES = re.compile(r"[0-9]{1,6}", re.ASCII)


def add_arguments(cmd: argparse.ArgumentParser) -> None:
    add_config_arguments(cmd)
    cmd.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    cmd.add_argument(
        "--gpus-per-node",
        type=integer_option,
        default=4,
        help="GPUs of a node (default 4: an Alps GH200 node)",
    )


def take_nodes(overrides: list[str]) -> tuple[int, list[str]]:
    """`nodes=N` out of the key=value items (the last one given; 1 without one)."""
    given = [item for item in overrides if item.startswith("nodes=")]
    rest = [item for item in overrides if not item.startswith("nodes=")]
    if not given:
        return 1, rest
    text = given[-1].removeprefix("nodes=")
    if not NODES.fullmatch(text) or int(text) < 1:
        raise ConfigError(f"nodes= expects a positive whole number of nodes, got {shown(text)}")
    return int(text), rest


def shard_size(cfg, gpus: int, gpus_per_node: int) -> int:
    """HSDP's shard group: `hsdp_shard` when set, else the GPUs of one node (the run's default,
    hsdp_shard=0: shard over NVLink, replicate over Slingshot)."""
    shard = cfg.hsdp_shard or min(gpus_per_node, gpus)
    if gpus % shard:
        raise ConfigError(
            f"config key 'hsdp_shard' is {shard}, which does not divide the {gpus} GPUs of the plan"
        )
    return shard


def layouts(cfg, nodes: int, gpus_per_node: int, has_blocks: bool) -> list:
    from ..training.plan import Layout

    gpus = nodes * gpus_per_node
    if gpus == 1 and cfg.parallelism == "hsdp":
        raise ConfigError("parallelism=hsdp needs 2 GPUs or more; this plan has 1 (nodes=1)")
    hsdp = shard_size(cfg, gpus, gpus_per_node)
    shards = {"ddp": 1, "fsdp": gpus, "hsdp": hsdp}
    if gpus == 1:  # nothing to shard, nothing to replicate: DDP's figures are the run's
        shards = {"ddp": 1}
    checkpointing = (False, True) if has_blocks else (False,)
    return [
        Layout(name, nodes, gpus_per_node, shard, ac)
        for ac in checkpointing
        for name, shard in shards.items()
    ]


def recommend(rows: list[dict]) -> dict | None:
    """The cheapest layout that fits. DDP first: one all-reduce of the gradients, in buckets
    overlapped with backward, and no gathers. Then HSDP: its gathers and reduce-scatters stay on
    NVLink, and over Slingshot each GPU all-reduces only its shard of the gradients with its
    peers on the other nodes (fewer bytes per NIC than DDP). Then FSDP, whose two gathers and
    reduce-scatter of every block cross Slingshot on more than one node, a block at a time on
    the critical path. Activation checkpointing only when none fits without it: its recomputed
    forward costs a third more computation, more than any layout's communication."""
    order = {"ddp": 0, "hsdp": 1, "fsdp": 2}
    fitting = [row for row in rows if row["fits"]]
    fitting.sort(key=lambda row: (row["activation_checkpointing"], order[row["parallelism"]]))
    return fitting[0] if fitting else None


def run(args: argparse.Namespace) -> int:
    from ..config.settings import load_config
    from ..training import plan

    nodes, overrides = take_nodes(args.overrides)
    if args.gpus_per_node < 1:
        raise ConfigError(f"--gpus-per-node expects a positive number, got {args.gpus_per_node}")
    cfg = load_config(args.config, overrides).config
    chosen = layouts(cfg, nodes, args.gpus_per_node, True)  # bad input refused before the build
    model = plan.measure_model(cfg)
    if not model.has_blocks:
        chosen = [layout for layout in chosen if not layout.activation_checkpointing]
    rows = [plan.estimate(model, layout, cfg, cfg.peak_tflops) for layout in chosen]
    result = {
        "model": model.label,
        "parameters": model.parameters,
        "trainable_parameters": model.trainable,
        "precision": model.precision,
        "batch_size": cfg.batch_size,
        "grad_accum_steps": cfg.grad_accum_steps,
        "nodes": nodes,
        "gpus_per_node": args.gpus_per_node,
        "gpu_gib": plan.GPU_MEMORY_BYTES / plan.GIB,
        "reserve_gib": plan.RESERVE_BYTES / plan.GIB,
        "mfu": plan.MFU,
        "peak_tflops": cfg.peak_tflops,
        "bandwidth_gbps": {"nvlink": plan.NVLINK_GBPS, "slingshot_nic": plan.SLINGSHOT_NIC_GBPS},
        "layouts": rows,
        "recommended": recommend(rows),
    }
    print(json.dumps(result, indent=1) if args.json else table(result))
    return 0


def table(result: dict) -> str:
    """The plan as a person reads it: one line per layout, then the recommendation."""
    usable = result["gpu_gib"] - result["reserve_gib"]
    lines = [
        f"{result['model']}: {result['parameters'] / 1e9:.3g}e9 parameters "
        f"({result['trainable_parameters'] / 1e9:.3g}e9 trained), {result['precision']}, "
        f"batch_size {result['batch_size']} x grad_accum_steps {result['grad_accum_steps']}, "
        f"{result['nodes']} node(s) of {result['gpus_per_node']} GPUs",
        f"memory per GPU {result['gpu_gib']:.1f} GiB, {usable:.1f} usable "
        f"({result['reserve_gib']:.0f} GiB reserved for CUDA, NCCL and fragmentation)",
        f"step time at {result['mfu']:.0%} MFU of {result['peak_tflops']:g} TFLOP/s, plus the "
        f"collectives at nominal NVLink {result['bandwidth_gbps']['nvlink']:g} GB/s and Slingshot "
        f"{result['bandwidth_gbps']['slingshot_nic']:g} GB/s per GPU (not overlapped)",
        "",
        "GiB per GPU and step:",
        f"{'layout':<10} {'ckpt':>4} {'weights':>8} {'grads':>7} {'adamw':>7} {'activ':>7} "
        f"{'working':>8} {'total':>7} {'fits':>4} {'step s':>8} {'NVLink':>8} {'Slingshot':>9}",
    ]
    for row in result["layouts"]:
        name = row["parallelism"]
        name += f"/{row['shard_gpus']}" if name == "hsdp" else ""
        lines.append(
            f"{name:<10} {'yes' if row['activation_checkpointing'] else 'no':>4} "
            f"{row['weights_gib']:>8.2f} {row['gradients_gib']:>7.2f} {row['optimizer_gib']:>7.2f} "
            f"{row['activations_gib']:>7.2f} {row['working_gib']:>8.2f} {row['gib_per_gpu']:>7.2f} "
            f"{'yes' if row['fits'] else 'no':>4} {row['step_s']:>8.3f} "
            f"{row['nvlink_gib']:>7.2f}G {row['slingshot_gib']:>8.2f}G"
        )
    best = result["recommended"]
    lines.append("")
    if best is None:
        lines.append(
            "nothing fits: more nodes, a smaller batch_size (grad_accum_steps keeps the global "
            "batch), or cpu_offload=true with parallelism=fsdp"
        )
    else:
        ac = " activation_checkpointing=true" if best["activation_checkpointing"] else ""
        lines.append(
            f"recommended: parallelism={best['parallelism']}{ac} "
            f"({best['gib_per_gpu']:.1f} GiB per GPU, about {best['step_s']:.3g} s per step)"
        )
    return "\n".join(lines)
