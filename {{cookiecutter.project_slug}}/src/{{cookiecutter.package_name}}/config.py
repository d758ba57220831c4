"""The training configuration: one dataclass, read from TOML, overridden by `key=value` arguments.

Every field below is a config key; `configs/default.toml` sets the defaults a job uses and
`docs/training.md` explains each of them.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import re
import sys
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10
    import tomli as tomllib

log = logging.getLogger(__package__)


class ConfigError(ValueError):
    """A config key is unknown, or its value is not accepted. The message names the key."""


@dataclass
class Config:
    # Every field is a config key; its trailing comment is its documentation (docs/training.md's
    # table is generated from these lines and checked by tests/test_config.py).
    # run
    run_dir: str = "runs/default"  # run directory: checkpoints/, metrics.jsonl, config.toml, LOCK
    seed: int = 1234  # seeds the data, the initial weights (all ranks) and per-rank RNGs
    max_steps: int = 300  # optimizer steps of the whole run
    device: str = "auto"  # auto (CUDA when a GPU is visible, else CPU), cpu, cuda
    # model
    model: str = "gpt"  # gpt (a GPT-2 style language model) or mlp (the minimal classifier)
    preset: str = "gpt2-124m"  # gpt size: tiny, gpt2-124m, gpt2-350m, gpt2-1.3b
    n_layer: int = 0  # gpt: transformer blocks (0: the preset's)
    n_head: int = 0  # gpt: attention heads (0: the preset's)
    n_embd: int = 0  # gpt: width (0: the preset's)
    block_size: int = 0  # gpt: context length in tokens (0: the preset's)
    vocab_size: int = 0  # gpt: vocabulary (0: the dataset's; synthetic: 50257), padded to 64
    hidden_dim: int = 256  # mlp: hidden width
    dropout: float = 0.0  # dropout probability in [0, 1)
    # data
    dataset: str = "synthetic"  # "synthetic" or a directory written by make-dataset
    synthetic_samples: int = 16384  # mlp synthetic data: samples
    eval_samples: int = 2048  # mlp: samples held out from the end for evaluation
    num_features: int = 64  # mlp synthetic data: input features (a directory says its own)
    num_classes: int = 10  # mlp synthetic data: classes (a directory says its own)
    batch_size: int = 16  # per rank and micro-step (gpt: sequences of block_size tokens)
    grad_accum_steps: int = 1  # micro-steps per optimizer step (gradients synced on the last)
    num_workers: int = -1  # loader processes per rank; -1: min(8, SLURM_CPUS_PER_TASK - 1)
    data_on_gpu: str = "auto"  # in-memory data on the GPU: auto (under 10% of it), true, false
    # optimizer and schedule
    lr: float = 6e-4  # AdamW peak learning rate (after linear warmup)
    min_lr: float = 6e-5  # end of the cosine decay, reached at max_steps
    warmup_steps: int = 30  # linear warmup steps
    weight_decay: float = 0.1  # on matrices only (not biases, norms)
    beta2: float = 0.95  # AdamW's second-moment decay (beta1 is 0.9)
    grad_clip: float = 1.0  # max gradient norm; 0 disables clipping
    # speed and parallelism
    precision: str = "auto"  # auto (bf16 on GPU, fp32 on CPU), bf16, fp16 (grad scaler), fp32
    compile: bool = False  # torch.compile each block (see the benchmark figures)
    tf32: bool = True  # TF32 matmuls on GPU (torch.set_float32_matmul_precision("high"))
    parallelism: str = "ddp"  # ddp (a replica per rank) or fsdp (FSDP2: sharded over ranks)
    activation_checkpointing: bool = False  # recompute each block in backward: less memory
    cpu_offload: bool = False  # fsdp: parameters and optimizer state in CPU memory
    # logging and evaluation
    log_every: int = 25  # steps between metric records
    eval_every: int = 100  # steps between evaluations; 0 disables them
    eval_batches: int = 20  # held-out batches per rank and evaluation
    peak_tflops: float = 989.0  # per-GPU peak for MFU (H100/GH200 dense bf16)
    tracker: str = "none"  # also log to: none, tensorboard, wandb (metrics.jsonl always)
    wandb_project: str = ""  # W&B project ("": the package name)
    wandb_mode: str = "offline"  # offline (compute nodes have no internet), online, disabled
    # checkpoints
    checkpoint_every: str = "100"  # "N" steps, "Mmin" minutes, "auto" (Young/Daly), "0" (end)
    keep_checkpoints: int = 3  # complete checkpoints kept (at least 2)
    async_checkpoint: str = "auto"  # write in the background: auto (on GPU), true, false
    mtbf_hours: float = 24.0  # mean time between failures of the job, for "auto"
    force_resume: bool = False  # continue a checkpoint from a different config or dataset
    # preemption and time limit
    preempt_check_every: int = 10  # steps between the ranks' agreement on stopping or saving
    end_time_margin_s: float = 60.0  # safety margin before SLURM_JOB_END_TIME
    # distributed
    dist_timeout_s: float = 300.0  # a collective that hangs this long fails the job
    cpu_threads: int = 0  # threads per rank; 0: OMP_NUM_THREADS, SLURM_CPUS_PER_TASK, or cores
    # benchmark
    bench_warmup: int = 10  # benchmark: warmup steps of each loop
    bench_steps: int = 60  # benchmark: measured steps of each loop
    bench_compare_compile: str = "auto"  # benchmark: also measure the other compile setting
    bench_checkpoint: str = "auto"  # benchmark: time sync vs async checkpoint saves (auto: GPU)


# Changing any of these changes the model, optimizer, data order or schedule, so a checkpoint
# written with other values cannot continue the same run (unless force_resume=true).
RESUME_MUST_MATCH = (
    "seed",
    "max_steps",
    "model",
    "preset",
    "n_layer",
    "n_head",
    "n_embd",
    "block_size",
    "vocab_size",
    "hidden_dim",
    "dropout",
    "dataset",
    "synthetic_samples",
    "eval_samples",
    "num_features",
    "num_classes",
    "batch_size",
    "grad_accum_steps",
    "lr",
    "min_lr",
    "warmup_steps",
    "weight_decay",
    "beta2",
    "grad_clip",
    "precision",
)

CHOICES = {
    "device": ("auto", "cpu", "cuda"),
    "model": ("gpt", "mlp"),
    "preset": ("tiny", "gpt2-124m", "gpt2-350m", "gpt2-1.3b"),
    "precision": ("auto", "bf16", "fp16", "fp32"),
    "parallelism": ("ddp", "fsdp"),
    "data_on_gpu": ("auto", "true", "false"),
    "async_checkpoint": ("auto", "true", "false"),
    "tracker": ("none", "tensorboard", "wandb"),
    "wandb_mode": ("offline", "online", "disabled"),
    "bench_compare_compile": ("auto", "true", "false"),
    "bench_checkpoint": ("auto", "true", "false"),
}
# Inclusive bounds; values outside them are typos or would exhaust the machine.
BOUNDS: dict[str, tuple[float, float]] = {
    "seed": (0, 2**32 - 1),  # numpy seeds are 32-bit
    "max_steps": (1, 10**12),
    "n_layer": (0, 1024),
    "n_head": (0, 1024),
    "n_embd": (0, 65536),
    "block_size": (0, 2**20),
    "vocab_size": (0, 2**24),
    "hidden_dim": (1, 2**20),
    "synthetic_samples": (1, 2**31 - 1),
    "eval_samples": (0, 2**31 - 1),
    "num_features": (1, 2**20),
    "num_classes": (2, 2**24),
    "batch_size": (1, 2**24),
    "grad_accum_steps": (1, 2**16),
    "num_workers": (-1, 64),
    "warmup_steps": (0, 10**12),
    "log_every": (1, 10**12),
    "eval_every": (0, 10**12),
    "eval_batches": (1, 10**6),
    "peak_tflops": (1e-3, 1e6),
    "keep_checkpoints": (2, 10**6),
    "mtbf_hours": (1e-3, 1e6),
    "preempt_check_every": (1, 10**6),
    "end_time_margin_s": (0, 86400),
    "dist_timeout_s": (1, 86400),
    "cpu_threads": (0, 1024),
    "bench_warmup": (0, 10**6),
    "bench_steps": (1, 10**6),
    "min_lr": (0, 1e3),
    "weight_decay": (0, 1e3),
    "grad_clip": (0, 1e9),
}
INTERVAL = re.compile(r"([0-9]+)|([0-9]+(?:\.[0-9]+)?)min|auto", re.ASCII)

_FORMS = {
    int: "an integer, e.g. 100",
    float: "a number, e.g. 0.001",
    bool: "true or false",
    str: "a string",
}


def field_types() -> dict[str, type]:
    types = {"int": int, "float": float, "bool": bool, "str": str}
    return {f.name: types[str(f.type)] for f in fields(Config)}


def parse_value(key: str, value: Any) -> Any:
    """Convert a TOML value or a command-line string to the type of field `key`."""
    types = field_types()
    if key not in types:
        raise ConfigError(f"unknown config key {key!r}; accepted keys: {', '.join(types)}")
    kind = types[key]
    try:
        if not isinstance(value, str | int | float | bool):  # a TOML list, table or date
            raise ValueError(value)
        if kind is bool:
            if isinstance(value, bool):
                return value
            if str(value).lower() in ("true", "1", "yes"):
                return True
            if str(value).lower() in ("false", "0", "no"):
                return False
            raise ValueError(value)
        if kind is str:
            if isinstance(value, bool):
                raise ValueError(value)
            text = str(value)
            if not text.isprintable() or len(text) > 4096:  # newlines would break config.toml
                raise ConfigError(
                    f"config key {key!r} expects one line of printable text (at most 4096 "
                    f"characters), got {text[:80]!r}"
                )
            return text
        if isinstance(value, bool) or (kind is int and isinstance(value, float)):
            raise ValueError(value)
        if isinstance(value, str) and not value.strip().isascii():  # int("١٢") is 12
            raise ValueError(value)
        result = kind(value)
        if kind is float and not math.isfinite(result):
            raise ValueError(value)
        return result
    except ConfigError:
        raise
    except (ValueError, TypeError, OverflowError):
        raise ConfigError(f"config key {key!r} expects {_FORMS[kind]}, got {value!r}") from None


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def validate(cfg: Config) -> Config:
    for key, allowed in CHOICES.items():
        if getattr(cfg, key) not in allowed:
            raise ConfigError(
                f"config key {key!r} must be one of {', '.join(allowed)}; got {getattr(cfg, key)!r}"
            )
    for key, (low, high) in BOUNDS.items():
        value = getattr(cfg, key)
        if not low <= value <= high:
            raise ConfigError(
                f"config key {key!r} must be in [{_number(low)}, {_number(high)}], got {value!r}"
            )
    if not INTERVAL.fullmatch(cfg.checkpoint_every):
        raise ConfigError(
            "config key 'checkpoint_every' expects a number of steps (\"100\"), minutes "
            f'("30min"), "auto" or "0" (end only); got {cfg.checkpoint_every!r}'
        )
    if not 0 <= cfg.dropout < 1:
        raise ConfigError(f"config key 'dropout' must be in [0, 1), got {cfg.dropout}")
    if not 0 <= cfg.beta2 < 1:
        raise ConfigError(f"config key 'beta2' must be in [0, 1), got {cfg.beta2}")
    if not 0 < cfg.lr <= 1e3:
        raise ConfigError(f"config key 'lr' must be in (0, 1000], got {cfg.lr}")
    if cfg.model == "mlp" and cfg.activation_checkpointing:
        raise ConfigError("config key 'activation_checkpointing' needs model=\"gpt\" (blocks)")
    if cfg.parallelism == "fsdp" and cfg.precision == "fp16":
        raise ConfigError("config key 'precision': fp16 is not supported with fsdp; use bf16")
    return cfg


def load_config(path: str | Path | None, overrides: list[str] = ()) -> Config:
    """Defaults <- TOML file (flat table of config keys) <- `key=value` overrides."""
    values: dict[str, Any] = {}
    if path is not None:
        try:
            with open(path, "rb") as f:
                table = tomllib.load(f)
        except OSError as err:
            raise ConfigError(f"cannot read config file {path}: {err.strerror}") from None
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as err:
            raise ConfigError(f"config file {path} is not valid UTF-8 TOML: {err}") from None
        for key, value in table.items():
            values[key] = parse_value(key, value)
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"override {item!r} is not of the form key=value")
        values[key.strip()] = parse_value(key.strip(), value.strip())
    return validate(Config(**values))


def to_toml(cfg: Config | dict) -> str:
    values = dataclasses.asdict(cfg) if isinstance(cfg, Config) else cfg
    lines = []
    for key, value in values.items():
        if isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, str):
            text = '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
        else:
            text = repr(value)
        lines.append(f"{key} = {text}")
    return "\n".join(lines) + "\n"


def save_config(cfg: Config, path: Path) -> None:
    """Written atomically: a run directory never holds half a config."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text("# resolved configuration of this run (written at start)\n" + to_toml(cfg))
    os.replace(tmp, path)


def check_resume(
    saved: dict,
    cfg: Config,
    saved_world: int,
    world: int,
    saved_fingerprint: str | None = None,
    fingerprint: str | None = None,
) -> None:
    """Refuse to continue a checkpoint with settings or data that make it a different run.

    A different world size is allowed (checkpoints reshard): the global batch then changes,
    which the log says.
    """
    # the same data under another spelling of its path (data/x/, ./data/x, absolute) is the same
    same_data = bool(saved_fingerprint) and saved_fingerprint == fingerprint
    changed = [
        f"{key}: {saved.get(key)!r} -> {getattr(cfg, key)!r}"
        for key in RESUME_MUST_MATCH
        if saved.get(key) != getattr(cfg, key) and not (key == "dataset" and same_data)
    ]
    if saved_fingerprint and fingerprint and saved_fingerprint != fingerprint:
        changed.append(
            f"dataset contents: fingerprint {saved_fingerprint[:12]} -> {fingerprint[:12]} "
            f"(the files at {cfg.dataset} were rewritten)"
        )
    if saved_world != world:
        log.warning(
            "world size %d -> %d: the checkpoint is resharded; the global batch changes from "
            "%d to %d samples per step",
            saved_world,
            world,
            saved_world * cfg.batch_size * cfg.grad_accum_steps,
            world * cfg.batch_size * cfg.grad_accum_steps,
        )
    if not changed:
        return
    message = "the checkpoint was written with a different configuration: " + "; ".join(changed)
    if not cfg.force_resume:
        raise ConfigError(
            message + ". Use a new run_dir, restore the values, or pass force_resume=true "
            "to continue anyway."
        )
    log.warning(
        "force_resume=true overrides %d resume check(s): %s", len(changed), "; ".join(changed)
    )
