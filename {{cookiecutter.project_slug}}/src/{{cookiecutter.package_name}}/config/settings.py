"""The training configuration: one dataclass, read from TOML, overridden by `key=value` arguments.

Each config key is declared once, as a `Key` (config_keys.py): the general keys below, each
model's own keys in its module under models/. `Config` is assembled from those declarations,
and so are validation, the defaults check of `configs/default.toml` (tests/test_config.py) and
the table of keys in `docs/training.md` (`docs_table`).
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..config_keys import ConfigError, Key, not_empty, parse_interval
from ..models import DEFAULT_MODEL, MODELS, model_keys, spec_of
from ..run.atomic import atomic_write_text
from ..run.rundir import RunDir
from .files import read_file, read_toml

log = logging.getLogger(__name__.split(".")[0])

__all__ = ["Config", "ConfigError", "load_config", "check_resume", "save_config", "to_toml"]

ON, AUTO = ("true", "false"), ("auto", "true", "false")

# resume=True: the value shapes the model, the data order, the optimizer or the schedule, so a
# checkpoint written with another value cannot continue the same run (unless force_resume=true).
# fmt: off
GENERAL_KEYS = (
    # run
    Key("run_dir", "runs/default", "run directory: checkpoints/, metrics.jsonl, config.toml, LOCK",
        check=not_empty("run_dir")),
    Key("seed", 1234, "seeds the data, the initial weights (all ranks) and per-rank RNGs",
        bounds=(0, 2**32 - 1), resume=True),  # numpy seeds are 32-bit
    Key("max_steps", 300, "optimizer steps of the whole run", bounds=(1, 10**12), resume=True),
    Key("device", "auto", "auto: CUDA when a GPU is visible, else CPU",
        choices=("auto", "cpu", "cuda")),
    # model (the selected model's own keys follow this one)
    Key("init_from", "", 'start a new run from weights: a run_dir or a Hugging Face model dir'),
    Key("model", DEFAULT_MODEL, "the model to train: a module in models/ (docs/your-model.md)",
        choices=tuple(MODELS), resume=True),
    Key("dropout", 0.0, "dropout probability", bounds=(0, 1), closed="[)", resume=True),
    # data
    Key("dataset", "synthetic", '"synthetic" or a directory written by make-dataset',
        resume=True),
    Key("vocab_size", 0, "language models: vocabulary (0: the dataset's; synthetic: 50257)",
        bounds=(0, 2**24), resume=True),
    Key("synthetic_samples", 16384, "classifier synthetic data: samples",
        bounds=(1, 2**31 - 1), resume=True),
    Key("eval_samples", 2048, "classifier: samples held out from the end for evaluation",
        bounds=(0, 2**31 - 1), resume=True),
    Key("num_features", 64, "classifier synthetic data: input features (a directory says its own)",
        bounds=(1, 2**20), resume=True),
    Key("num_classes", 10, "classifier synthetic data: classes (a directory says its own)",
        bounds=(2, 2**24), resume=True),
    Key("batch_size", 16, "per rank and micro-step (language models: windows of tokens)",
        bounds=(1, 2**24), resume=True),
    Key("grad_accum_steps", 1, "micro-steps per optimizer step (gradients synced on the last)",
        bounds=(1, 2**16), resume=True),
    Key("num_workers", -1, "loader processes per rank; -1: min(8, SLURM_CPUS_PER_TASK - 1)",
        bounds=(-1, 64)),
    Key("data_on_gpu", "auto", "in-memory data on the GPU: auto (under 10% of it)", choices=AUTO),
    # optimizer and schedule
    Key("lr", 6e-4, "AdamW peak learning rate (after linear warmup)", bounds=(0, 1e3),
        closed="(]", resume=True),
    Key("min_lr", 6e-5, "end of the cosine decay, reached at max_steps; at most lr",
        bounds=(0, 1e3), resume=True),
    Key("warmup_steps", 30, "linear warmup steps", bounds=(0, 10**12), resume=True),
    Key("weight_decay", 0.1, "on matrices only (not biases, norms)", bounds=(0, 1e3),
        resume=True),
    Key("beta2", 0.95, "AdamW's second-moment decay (beta1 is 0.9)", bounds=(0, 1),
        closed="[)", resume=True),
    Key("grad_clip", 1.0, "max gradient norm; 0 disables clipping", bounds=(0, 1e9),
        resume=True),
    # speed and parallelism
    Key("precision", "auto", "auto: bf16 on GPU, fp32 on CPU; fp16 uses a grad scaler",
        choices=("auto", "bf16", "fp16", "fp32"), resume=True),
    Key("compile", False, "torch.compile each block (see the benchmark figures)"),
    Key("tf32", True, 'TF32 matmuls on GPU (torch.set_float32_matmul_precision("high"))'),
    Key("parallelism", "ddp", "ddp (a replica per rank) or fsdp (FSDP2: sharded over ranks)",
        choices=("ddp", "fsdp")),
    Key("activation_checkpointing", False, "recompute each block in backward: less memory"),
    Key("cpu_offload", False, "fsdp: parameters and optimizer state in CPU memory"),
    # logging and evaluation
    Key("log_every", 25, "steps between metric records", bounds=(1, 10**12)),
    Key("eval_every", 100, "steps between evaluations; 0 disables them", bounds=(0, 10**12)),
    Key("eval_batches", 20, "held-out batches per rank and evaluation", bounds=(1, 10**6)),
    Key("peak_tflops", 989.0, "per-GPU peak for MFU (H100/GH200 dense bf16)", bounds=(1e-3, 1e6)),
    Key("tracker", "none", "also log to it (metrics.jsonl always)",
        choices=("none", "tensorboard", "wandb")),
    Key("wandb_project", "", 'W&B project ("": the package name)'),
    Key("wandb_mode", "offline", "offline: compute nodes have no internet",
        choices=("offline", "online", "disabled")),
    Key("profile_steps", "", '"START:END": torch.profiler trace of those steps per rank ("": off)'),
    Key("profile_memory", False, "with profile_steps: memory events, CUDA memory snapshot"),
    # checkpoints
    Key("checkpoint_every", "100", '"N" steps, "Mmin" minutes, "auto" (Young/Daly), "0" (end)',
        check=parse_interval),
    Key("keep_checkpoints", 3, "complete checkpoints kept", bounds=(2, 10**6)),
    Key("async_checkpoint", "auto", "write in the background: auto (on GPU)", choices=AUTO),
    Key("mtbf_hours", 24.0, 'mean time between failures of the job, for "auto"',
        bounds=(1e-3, 1e6)),
    Key("force_resume", False, "continue a checkpoint from a different config or dataset"),
    # preemption and time limit
    Key("preempt_check_every", 10, "steps between the ranks' agreement on stopping or saving",
        bounds=(1, 10**6)),
    Key("end_time_margin_s", 60.0, "safety margin before SLURM_JOB_END_TIME", bounds=(0, 86400)),
    # distributed
    Key("dist_timeout_s", 300.0, "a collective that hangs this long fails the job",
        bounds=(1, 86400)),
    Key("cpu_threads", 0, "threads per rank; 0: OMP_NUM_THREADS, SLURM_CPUS_PER_TASK, or cores",
        bounds=(0, 1024)),
    # benchmark
    Key("bench_warmup", 10, "benchmark: warmup steps of each loop", bounds=(0, 10**6)),
    Key("bench_steps", 60, "benchmark: measured steps of each loop", bounds=(1, 10**6)),
    Key("bench_compare_compile", "auto", "benchmark: also measure the other compile setting",
        choices=AUTO),
    Key("bench_checkpoint", "auto", "benchmark: time sync vs async checkpoint saves (auto: GPU)",
        choices=AUTO),
)
# fmt: on


def _all_keys() -> dict[str, Key]:
    """Every key in the order of the docs table: the models' own keys after `model`."""
    keys: dict[str, Key] = {}
    for key in GENERAL_KEYS:
        keys[key.name] = key
        if key.name == "model":
            keys.update({name: key for name, (key, _) in model_keys().items()})
    return keys


KEYS: dict[str, Key] = _all_keys()
OWNERS: dict[str, list[str]] = {name: owners for name, (_, owners) in model_keys().items()}

Config = dataclasses.make_dataclass(
    "Config",
    [(key.name, key.type, dataclasses.field(default=key.default)) for key in KEYS.values()],
)
Config.__module__ = __name__  # pickle and repr find it here (make_dataclass's module= is 3.12+)
Config.__doc__ = "The values of every config key (see KEYS for their declarations)."


def parse_value(key: str, value: Any) -> Any:
    """Convert a TOML value or a command-line string to the type of key `key`, checked. A key
    of a model's table in a config file comes as "<model>.<key>"."""
    model, dot, own = key.partition(".")
    if dot and key not in KEYS:
        if model not in MODELS:
            raise ConfigError(f"table [{model[:60]}] is not a model; models: {', '.join(MODELS)}")
        if own not in OWNERS or model not in OWNERS[own]:
            mine = [name for name, owners in OWNERS.items() if model in owners]
            raise ConfigError(
                f"[{model}] {own[:60]!r} is not a key of model {model}; its keys: "
                f"{', '.join(mine) or 'none'}"
            )
        return KEYS[own].parse(value)
    if key not in KEYS:
        close = difflib.get_close_matches(key.lower().replace("-", "_"), KEYS, n=3, cutoff=0.7)
        hint = f"did you mean {' or '.join(close)}? " if close else ""
        name = repr(key) if len(key) <= 80 else f"{key[:60]!r}... ({len(key)} characters)"
        raise ConfigError(f"unknown config key {name}; {hint}accepted keys: {', '.join(KEYS)}")
    return KEYS[key].parse(value)


def resume_keys(cfg) -> list[str]:
    """The keys that must match for a checkpoint to continue: the general ones and those of the
    run's model."""
    own = {key.name for key in spec_of(cfg).keys}
    return [n for n, k in KEYS.items() if k.resume and (n not in OWNERS or n in own)]


def validate(cfg) -> Config:
    """Each value against its declaration, then the relations between keys."""
    for key in KEYS.values():
        key.validate(getattr(cfg, key.name))
    spec = spec_of(cfg)
    for name, owners in OWNERS.items():
        if cfg.model not in owners and getattr(cfg, name) != KEYS[name].default:
            raise ConfigError(
                f"config key {name!r} belongs to model {' and '.join(owners)}, but this run "
                f"trains model={cfg.model}; remove it or set model={owners[0]}"
            )
    from ..telemetry.profiling import check_profile_keys  # their format: profiling.py

    check_profile_keys(cfg.profile_steps, cfg.profile_memory)
    if cfg.min_lr > cfg.lr:
        raise ConfigError(
            f"config key 'min_lr' ({cfg.min_lr:g}) must not exceed 'lr' ({cfg.lr:g}): the "
            "schedule decays from lr to min_lr"
        )
    if cfg.activation_checkpointing and spec.blocks is None:
        raise ConfigError(
            f"config key 'activation_checkpointing' needs a model with repeated blocks; "
            f"model={cfg.model} declares none"
        )
    if cfg.parallelism == "fsdp" and cfg.precision == "fp16":
        raise ConfigError("config key 'precision': fp16 is not supported with fsdp; use bf16")
    if spec.check is not None:
        spec.check(cfg)
    return cfg


def load_config(
    path: str | Path | Sequence[str | Path] | None,
    overrides: Sequence[str] = (),
    job_defaults: Sequence[str] = (),
) -> Config:
    """Declared defaults <- a job script's defaults (`--job-default key=value`, e.g. its dataset)
    <- TOML files (merged in order, `extends` followed) <- `key=value` overrides. In each, the
    table of the model the run trains (`[gpt]`, or `gpt.preset=...`) counts as its own keys;
    other models' tables are ignored. The Config remembers where each value that is not a
    declared default came from (`origins`)."""
    values: dict[str, Any] = {}
    origins: dict[str, str] = {}

    def take(items: dict[str, Any], origin: str) -> None:
        values.update(items)
        for key in items:
            origins.pop(key, None)  # re-inserted: keys keep the order of their last source
            origins[key] = origin

    layers = [("job script default", parse_items(job_defaults))]
    paths = [path] if isinstance(path, str | Path) else list(path or ())
    for file in paths:  # a name with a newline must not end config.toml's comment line
        label = str(file) if str(file).isprintable() else ascii(str(file))
        layers.append((label, read_file(file, parse_value)))
    layers.append(("command line", parse_items(overrides)))
    model = next((v["model"] for _, v in reversed(layers) if "model" in v), DEFAULT_MODEL)
    for origin, layer in layers:
        flat = {key: value for key, value in layer.items() if not isinstance(value, dict)}
        take(flat | layer.get(model, {}), origin)
    cfg = validate(Config(**values))
    global _last_loaded
    _last_loaded = (cfg, origins)
    return cfg


# Where the values of the Config load_config returned last came from: kept beside it, not in it
# (a Config holds config keys only; it is compared, saved and printed as such).
_last_loaded: tuple[Config | None, dict[str, str]] = (None, {})


def parse_items(items: Sequence[str]) -> dict[str, Any]:
    values = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"override {item!r} is not of the form key=value")
        key = key.strip()
        parsed = parse_value(key, value.strip())
        if "." in key and key not in KEYS:  # gpt.preset=tiny: the model's table
            model, _, own = key.partition(".")
            values.setdefault(model, {})[own] = parsed
        else:
            values[key] = parsed
    return values


def describe_origins(cfg: Config) -> str | None:
    """Where the values came from, one group per source in the order they apply (load_config
    moves a key to the end when a later source sets it again); None for a Config that
    load_config did not make (one built in Python)."""
    loaded, origins = _last_loaded
    if loaded is not cfg:
        return None
    groups: dict[str, list[str]] = {}
    for key, origin in origins.items():
        groups.setdefault(origin, []).append(key)
    parts = [f"{origin}: {', '.join(keys)}" for origin, keys in groups.items()]
    return "; ".join([*parts, "other keys: their defaults"])


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return repr(value)


def saved_config(values: dict) -> Config:
    """The Config a checkpoint records (its values; keys this version does not know dropped)."""
    known = {f.name for f in dataclasses.fields(Config)}
    return Config(**{k: v for k, v in values.items() if k in known})


def to_toml(cfg: Config | dict) -> str:
    values = dataclasses.asdict(cfg) if isinstance(cfg, Config) else cfg
    return "".join(f"{key} = {toml_value(value)}\n" for key, value in values.items())


CONFIG_HEADER = "# resolved configuration of this run, written at start; checksum "


def config_checksum(body: str) -> str:
    return hashlib.sha256(body.encode()).hexdigest()[:16]


def save_config(cfg: Config, path: Path) -> None:
    """Written atomically: a run directory never holds half a config (nor a temp file). The
    header's checksum tells a config.toml edited by hand from the one the run wrote. Where each
    value came from is logged (once per start: only the main rank saves) and kept as a comment."""
    body = to_toml(cfg)
    origins = describe_origins(cfg)
    if origins is not None:
        log.info("settings from %s", origins)
        body = f"# where the values came from: {origins}\n{body}"
    atomic_write_text(path, f"{CONFIG_HEADER}{config_checksum(body)}\n{body}")


def edited_by_hand(path: Path) -> bool:
    """Whether the run's config.toml is no longer the one it wrote (see save_config)."""
    header, _, body = path.read_text(errors="replace").partition("\n")
    return header != CONFIG_HEADER + config_checksum(body)


def changed_keys(saved: dict, cfg: Config, same_data: bool = False) -> list[str]:
    """`key: old -> new` for each resume-relevant key that differs (the keys of both models
    when the model changed). `same_data`: the dataset is the same whatever its path's spelling."""
    names = resume_keys(cfg)
    if saved.get("model") in MODELS and saved.get("model") != cfg.model:
        old = resume_keys(dataclasses.replace(cfg, model=saved["model"]))
        names += [n for n in old if n not in names]
    return [
        f"{key}: {saved.get(key)!r} -> {getattr(cfg, key)!r}"
        for key in names
        if saved.get(key) != getattr(cfg, key) and not (key == "dataset" and same_data)
    ]


def refuse_or_warn(changed: list[str], cfg: Config, what: str) -> None:
    if not changed:
        return
    message = f"{what} was written with a different configuration: " + "; ".join(changed)
    if not cfg.force_resume:
        raise ConfigError(
            f"{message}. Either use a new run_dir, or restore the values to continue this run "
            "(force_resume=true continues anyway)."
        )
    log.warning(
        "force_resume=true overrides %d resume check(s) of %s: %s",
        len(changed),
        what,
        "; ".join(changed),
    )


def check_run_dir_config(cfg: Config, run_dir: Path, has_checkpoints: bool) -> None:
    """Before any checkpoint is read: refuse to continue the checkpoints of `run_dir` with a
    changed model or resume-relevant key, comparing with the run's `config.toml`."""
    path = RunDir.of(run_dir).config
    if not has_checkpoints or not path.is_file():
        return
    try:
        saved = read_toml(path)
        edited = edited_by_hand(path)
    except ConfigError as err:  # the checkpoint's own record is still compared after loading
        log.warning("%s; comparing the config with the checkpoint's record instead", err)
        return
    if edited:  # the checkpoint's record decides alone, so there is one answer, not two
        log.warning(
            "%s was edited after the run wrote it; comparing the config with the checkpoint's "
            "record instead (its values are the run's; the run rewrites config.toml)",
            path,
        )
        return
    # data/x/, ./data/x and /abs/data/x are one dataset (its contents are compared after loading)
    same_data = same_path(saved.get("dataset"), cfg.dataset)
    refuse_or_warn(changed_keys(saved, cfg, same_data), cfg, f"the run in {run_dir}")


def same_path(a: object, b: str) -> bool:
    return isinstance(a, str) and (a == b or Path(a).resolve() == Path(b).resolve())


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
    changed = changed_keys(saved, cfg, same_data)
    if saved_fingerprint and fingerprint and saved_fingerprint != fingerprint:
        why = (
            f"the files at {cfg.dataset} were rewritten"
            if same_path(saved.get("dataset"), cfg.dataset)
            else f"another dataset: {saved.get('dataset')} -> {cfg.dataset}"
        )
        changed.append(
            f"dataset contents: fingerprint {saved_fingerprint[:12]} -> {fingerprint[:12]} ({why})"
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
    refuse_or_warn(changed, cfg, "the checkpoint")


def docs_table() -> str:
    """The table of config keys in docs/training.md (tests/test_config.py compares it)."""
    rows = [
        "| key | default | accepted | must match on resume | meaning |",
        "|---|---|---|---|---|",
    ]
    for name, key in KEYS.items():
        meaning = f"{' and '.join(OWNERS[name])} only: {key.help}" if name in OWNERS else key.help
        accepted = key.accepted().replace("|", "\\|")
        resume = "yes" if key.resume else ""
        meaning = meaning.replace("|", "\\|")
        rows.append(
            f"| `{name}` | `{toml_value(key.default)}` | {accepted} | {resume} | {meaning} |"
        )
    return "\n".join(rows)
