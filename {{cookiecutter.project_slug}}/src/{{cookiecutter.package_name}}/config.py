"""The training configuration: one dataclass, read from TOML, overridden by `key=value` arguments.

Every field below is a config key; `configs/default.toml` sets the defaults a job uses and
`docs/training.md` explains each of them.
"""

from __future__ import annotations

import dataclasses
import logging
import math
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
    # run
    run_dir: str = "runs/default"  # checkpoints, metrics.jsonl, config.toml, REQUEUE marker
    seed: int = 1234
    max_steps: int = 300  # optimizer steps
    # data
    dataset: str = "synthetic"  # "synthetic" or a directory written by `make-dataset`
    synthetic_samples: int = 16384
    eval_samples: int = 2048  # held out from the end of the dataset
    num_features: int = 64  # synthetic data only (a dataset directory says its own)
    num_classes: int = 10  # synthetic data only
    batch_size: int = 256  # per rank and micro-step
    grad_accum_steps: int = 1
    num_workers: int = -1  # -1: from SLURM_CPUS_PER_TASK (0 without it)
    # model
    hidden_dim: int = 256
    dropout: float = 0.1
    # optimizer and schedule (linear warmup, cosine decay to min_lr at max_steps)
    lr: float = 3e-3
    min_lr: float = 3e-4
    warmup_steps: int = 30
    weight_decay: float = 0.01
    grad_clip: float = 1.0  # 0 disables clipping
    # speed
    precision: str = "auto"  # auto (bf16 on GPU, fp32 on CPU), bf16, fp16, fp32
    compile: bool = False
    tf32: bool = True
    # logging and evaluation
    log_every: int = 25
    eval_every: int = 100  # 0 disables periodic evaluation
    peak_tflops: float = 989.0  # per GPU, for MFU (GH200 dense bf16)
    # checkpoints
    checkpoint_every: str = "100"  # steps ("100"), minutes ("30min"), "auto", or "0" (end only)
    keep_checkpoints: int = 3
    mtbf_hours: float = 24.0  # job MTBF for checkpoint_every="auto" (Young/Daly)
    force_resume: bool = False
    # preemption and time limit
    preempt_check_every: int = 10  # steps between the ranks' agreement on stopping
    end_time_margin_s: float = 60.0  # safety margin before SLURM_JOB_END_TIME
    # distributed
    dist_timeout_s: float = 900.0
    cpu_threads: int = 0  # 0: OMP_NUM_THREADS, else SLURM_CPUS_PER_TASK, else cores/ranks
    # benchmark
    bench_warmup: int = 10
    bench_steps: int = 60


# Changing any of these changes the model, optimizer, data order or schedule, so a checkpoint
# written with other values cannot continue the same run (unless force_resume=true).
RESUME_MUST_MATCH = (
    "seed",
    "max_steps",
    "dataset",
    "synthetic_samples",
    "eval_samples",
    "num_features",
    "num_classes",
    "batch_size",
    "grad_accum_steps",
    "hidden_dim",
    "dropout",
    "lr",
    "min_lr",
    "warmup_steps",
    "weight_decay",
    "grad_clip",
    "precision",
)

CHOICES = {"precision": ("auto", "bf16", "fp16", "fp32")}
POSITIVE = (
    "max_steps",
    "batch_size",
    "grad_accum_steps",
    "hidden_dim",
    "log_every",
    "preempt_check_every",
    "bench_steps",
    "synthetic_samples",
)
NON_NEGATIVE = (
    "eval_samples",
    "warmup_steps",
    "eval_every",
    "bench_warmup",
    "cpu_threads",
    "grad_clip",
    "weight_decay",
    "end_time_margin_s",
    "min_lr",
)
INTERVAL = re.compile(r"(\d+)|(\d+(?:\.\d+)?)min|auto")

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
            return str(value)
        if isinstance(value, bool) or (kind is int and isinstance(value, float)):
            raise ValueError(value)
        result = kind(value)
        if kind is float and not math.isfinite(result):
            raise ValueError(value)
        return result
    except ValueError:
        raise ConfigError(f"config key {key!r} expects {_FORMS[kind]}, got {value!r}") from None


def validate(cfg: Config) -> Config:
    for key, allowed in CHOICES.items():
        if getattr(cfg, key) not in allowed:
            raise ConfigError(
                f"config key {key!r} must be one of {', '.join(allowed)}; got {getattr(cfg, key)!r}"
            )
    for key in POSITIVE:
        if getattr(cfg, key) <= 0:
            raise ConfigError(f"config key {key!r} must be > 0, got {getattr(cfg, key)!r}")
    for key in NON_NEGATIVE:
        if getattr(cfg, key) < 0:
            raise ConfigError(f"config key {key!r} must be >= 0, got {getattr(cfg, key)!r}")
    if not INTERVAL.fullmatch(cfg.checkpoint_every):
        raise ConfigError(
            "config key 'checkpoint_every' expects a number of steps (\"100\"), minutes "
            f'("30min"), "auto" or "0" (end only); got {cfg.checkpoint_every!r}'
        )
    if cfg.keep_checkpoints < 2:
        raise ConfigError(
            "config key 'keep_checkpoints' must be >= 2 (the newest one may be incomplete), "
            f"got {cfg.keep_checkpoints}"
        )
    if not 0 <= cfg.dropout < 1:
        raise ConfigError(f"config key 'dropout' must be in [0, 1), got {cfg.dropout}")
    if cfg.lr <= 0 or cfg.mtbf_hours <= 0 or cfg.dist_timeout_s <= 0:
        raise ConfigError("config keys 'lr', 'mtbf_hours' and 'dist_timeout_s' must be > 0")
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
        except tomllib.TOMLDecodeError as err:
            raise ConfigError(f"config file {path} is not valid TOML: {err}") from None
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
    path.write_text("# resolved configuration of this run (written at start)\n" + to_toml(cfg))


def check_resume(saved: dict, cfg: Config, saved_world: int, world: int) -> None:
    """Refuse to continue a checkpoint with settings that make it a different run."""
    changed = [
        f"{key}: {saved.get(key)!r} -> {getattr(cfg, key)!r}"
        for key in RESUME_MUST_MATCH
        if saved.get(key) != getattr(cfg, key)
    ]
    if saved_world != world:
        changed.append(f"world size: {saved_world} -> {world}")
    if not changed:
        return
    message = "the checkpoint was written with a different configuration: " + "; ".join(changed)
    if not cfg.force_resume:
        raise ConfigError(
            message + ". Use a new run_dir, restore the values, or pass force_resume=true "
            "to continue anyway."
        )
    log.warning("%s. Continuing because force_resume=true.", message)
