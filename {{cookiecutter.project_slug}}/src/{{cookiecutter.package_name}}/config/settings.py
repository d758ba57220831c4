"""The training configuration: one dataclass, read from TOML, overridden by `key=value` arguments.

Each config key is declared once, next to the code that reads it (config_keys.py shows how): a
section per module (`OptimizerKeys` in optim.py, `DataKeys` in data/batches.py, ...; SECTIONS
below lists them) and each model's own keys in its module under models/. `Config` is assembled
from those declarations, and so are validation, the defaults check of `configs/default.toml`
(tests/test_config.py) and the table of keys in `docs/training.md` (`docs_table`). Adding a
general key: its line in a section and in configs/default.toml, then `python -m <package> keys`
prints the new docs table.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..config_keys import AUTO, ConfigError, Key, key, keys_of, not_empty
from ..data.batches import DataKeys
from ..distributed import DistributedKeys
from ..models import DEFAULT_MODEL, MODELS, ModelKeys, model_keys, spec_of
from ..optim import OptimizerKeys
from ..parallel import ParallelKeys
from ..run.atomic import atomic_write_text
from ..run.preemption import CheckpointKeys, PreemptionKeys
from ..run.rundir import RunDir
from ..telemetry.metrics import TelemetryKeys
from ..telemetry.profiling import ProfilingKeys, check_profile_keys
from .files import read_file, read_toml

log = logging.getLogger(__name__.split(".")[0])

__all__ = ["Config", "ConfigError", "load_config", "check_resume", "save_config", "to_toml"]


# fmt: off
@dataclass
class RunKeys:
    """Read by the commands (train.py, benchmark.py), which import this module: declared here."""

    run_dir: str = key("runs/default", "run directory: checkpoints/, metrics.jsonl, config.toml, "
                       "LOCK", check=not_empty("run_dir"))
    seed: int = key(1234, "seeds the data, the initial weights (all ranks) and per-rank RNGs",
                    bounds=(0, 2**32 - 1), resume=True)  # numpy seeds are 32-bit
    max_steps: int = key(300, "optimizer steps of the whole run", bounds=(1, 10**12),
                         resume=True)
    device: str = key("auto", "auto: CUDA when a GPU is visible, else CPU",
                      choices=("auto", "cpu", "cuda"))
    force_resume: bool = key(False, "continue a checkpoint from a different config or dataset")


@dataclass
class BenchmarkKeys:
    bench_warmup: int = key(10, "benchmark: warmup steps of each loop", bounds=(0, 10**6))
    bench_steps: int = key(60, "benchmark: measured steps of each loop", bounds=(1, 10**6))
    bench_compare_compile: str = key("auto", "benchmark: also measure the other compile setting",
                                     choices=AUTO)
    bench_checkpoint: str = key("auto", "benchmark: time sync vs async checkpoint saves (auto: "
                                "GPU)", choices=AUTO)
# fmt: on


# Each section is declared in the module that reads its keys; their order here is the docs
# table's. A key that shapes the model, the data order, the optimizer or the schedule says
# resume=True: a checkpoint written with another value cannot continue the run (unless
# force_resume=true).
@dataclass
class GeneralConfig(
    RunKeys, ModelKeys, DataKeys, OptimizerKeys, ParallelKeys, TelemetryKeys, ProfilingKeys,
    CheckpointKeys, PreemptionKeys, DistributedKeys, BenchmarkKeys,
):  # fmt: skip
    """Every general key, typed: what an editor completes after `cfg.`."""


SECTIONS: tuple[type, ...] = GeneralConfig.__bases__
GENERAL_KEYS: tuple[Key, ...] = tuple(k for section in SECTIONS for k in keys_of(section))


def _all_keys() -> dict[str, Key]:
    """Every key in the order of the docs table: the models' own keys after `model`."""
    keys: dict[str, Key] = {}
    for general in GENERAL_KEYS:
        keys[general.name] = general
        if general.name == "model":
            keys.update({name: own for name, (own, _) in model_keys().items()})
    return keys


KEYS: dict[str, Key] = _all_keys()
OWNERS: dict[str, list[str]] = {name: owners for name, (_, owners) in model_keys().items()}

if TYPE_CHECKING:
    Config = GeneralConfig
else:  # the registered models' own keys join at import: a model is one module and one line
    Config = dataclasses.make_dataclass(
        "Config",
        [(n, k.type, dataclasses.field(default=k.default)) for n, k in KEYS.items() if n in OWNERS],
        bases=(GeneralConfig,),
    )
    Config.__module__ = __name__  # pickle and repr find it here (make_dataclass's module= 3.12+)
    Config.__doc__ = "The values of every config key: the general ones and every model's own."


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
    for declared in KEYS.values():
        declared.validate(getattr(cfg, declared.name))
    spec = spec_of(cfg)
    for name, owners in OWNERS.items():
        if cfg.model not in owners and getattr(cfg, name) != KEYS[name].default:
            raise ConfigError(
                f"config key {name!r} belongs to model {' and '.join(owners)}, but this run "
                f"trains model={cfg.model}; remove it or set model={owners[0]}"
            )
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
        for name in items:
            origins.pop(name, None)  # re-inserted: keys keep the order of their last source
            origins[name] = origin

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
    for name, origin in origins.items():
        groups.setdefault(origin, []).append(name)
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
    """`key = value` lines; a Config's in the order of the docs table."""
    values = {name: getattr(cfg, name) for name in KEYS} if isinstance(cfg, Config) else cfg
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
    for name, declared in KEYS.items():
        meaning = declared.help
        if name in OWNERS:
            meaning = f"{' and '.join(OWNERS[name])} only: {meaning}"
        accepted = declared.accepted().replace("|", "\\|")
        resume = "yes" if declared.resume else ""
        meaning = meaning.replace("|", "\\|")
        default = toml_value(declared.default)
        rows.append(f"| `{name}` | `{default}` | {accepted} | {resume} | {meaning} |")
    return "\n".join(rows)
