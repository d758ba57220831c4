"""The training configuration: one dataclass, read from TOML, overridden by `key=value` arguments.

Each config key is declared once, next to the code that reads it (config_keys.py shows how): a
section per module (`OptimizerKeys` in optim.py, `DataKeys` in data/batches.py, ...; SECTIONS
below lists them), a section per model in its module under models/ (`GPTKeys`), which a Config
holds under the model's name (`cfg.gpt.preset`), and a section per dataset kind with keys of its
own (`ImageKeys`, its `KIND`'s `keys`), held flat (`cfg.image_size`). `Config` is assembled from
those declarations, and so are validation, the defaults check of `configs/default.toml`
(tests/test_config.py) and the table of keys in `docs/training.md` (`docs_table`). A model's key
is also known by its name alone (`preset=tiny`, the same as `gpt.preset=tiny`): it applies to the
run's model, and set for another model it is refused. Adding a general key: its line in a
section and in configs/default.toml, then `python -m <package> keys` prints the new docs table;
a model's or a kind's key is its line in its section, nothing more.
Whether a run may continue with a config is config/resume.py's.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from ..config_keys import (
    AUTO,
    ConfigError,
    Key,
    key,
    keys_of,
    not_empty,
    owned_keys,
    split_assignment,
)
from ..data.batches import DataKeys
from ..data.kinds import KINDS
from ..distributed import DistributedKeys
from ..models import DEFAULT_MODEL, MODELS, ModelKeys, model_keys, spec_of
from ..optim import OptimizerKeys
from ..parallel import ParallelKeys, check_layout_keys
from ..run.atomic import atomic_write_text
from ..run.preemption import CheckpointKeys, PreemptionKeys
from ..telemetry.metrics import TelemetryKeys
from ..telemetry.profiling import ProfilingKeys, check_profile_keys
from .files import Settings, read_file, refuse_two_spellings

log = logging.getLogger(__name__.split(".")[0])

__all__ = ["Config", "ConfigError", "Loaded", "load_config", "save_config", "to_toml"]


# fmt: off
@dataclass
class RunKeys:
    """Read by the commands (train.py, benchmark.py), which import this module: declared here."""

    run_dir: str = key("runs/default", "run directory: checkpoints/, metrics.jsonl, config.toml, "
                       "LOCK", check=not_empty("run_dir"))
    seed: int = key(1234, "seeds the data, the initial weights (all ranks) and per-rank RNGs",
                    bounds=(0, 2**32 - 1), resume=True)  # numpy seeds are 32-bit
    max_steps: int = key(300, "optimizer steps of the whole run (unless epochs is set)",
                         bounds=(1, 10**12), resume=True)
    epochs: int = key(0, "passes over the training split instead of max_steps (0: max_steps); "
                      "the run states its steps", bounds=(0, 10**6), resume=True)
    device: str = key("auto", "auto: CUDA when a GPU is visible, else CPU",
                      choices=("auto", "cpu", "cuda"))
    force_resume: bool = key(False, "continue a checkpoint from a different config or dataset")


@dataclass
class BenchmarkKeys:
    bench_warmup: int = key(10, "benchmark: warmup steps of each loop", bounds=(1, 10**6))
    bench_steps: int = key(200, "benchmark: measured steps of each loop (whole blocks, rounded up)",
                           bounds=(1, 10**6))
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
GENERAL: dict[str, Key] = {general.name: general for general in GENERAL_KEYS}
# Each model's own section (spec.keys), by model name: its field name in a Config.
MODEL_SECTIONS: dict[str, type] = {name: s.keys for name, s in MODELS.items() if s.keys}
OWN_KEYS: dict[str, tuple[Key, ...]] = {name: keys_of(s) for name, s in MODEL_SECTIONS.items()}
MODEL_KEYS: dict[str, Key] = {name: own for name, (own, _) in model_keys().items()}
OWNERS: dict[str, list[str]] = {name: owners for name, (_, owners) in model_keys().items()}
# Each dataset kind's own keys (DatasetKind.keys), held flat in a Config whatever kind the run
# reads (a kind is known once its directory is opened), after the general data keys.
KIND_SECTIONS: tuple[type, ...] = tuple(dict.fromkeys(k.keys for k in KINDS.values() if k.keys))
KIND_KEYS: dict[str, Key] = {name: own for name, (own, _) in owned_keys(KINDS, "kinds").items()}
KIND_OWNERS = {name: owners for name, (_, owners) in owned_keys(KINDS, "kinds").items()}
FLAT: dict[str, Key] = GENERAL | KIND_KEYS  # the keys a Config holds by their names


def _all_keys() -> dict[str, Key]:
    """Every key by the name `key=value` gives it, in the order of the docs table: the models'
    own keys after `model`, the dataset kinds' after the general data keys. A model and its keys
    must not take a general or a kind's key's name, nor a model's key a model's name, nor a
    kind's key a general key's (`name=value` would mean two things)."""
    models = set(MODEL_KEYS) | set(MODELS)
    clashes = models & set(FLAT) | set(MODEL_KEYS) & set(MODELS) | set(KIND_KEYS) & set(GENERAL)
    if clashes:
        raise ImportError(f"{sorted(clashes)[0]!r} names a model or a key and another key too")
    keys: dict[str, Key] = {}
    for general in GENERAL_KEYS:
        keys[general.name] = general
        if general.name == "model":
            keys.update(MODEL_KEYS)
        if general.name == keys_of(DataKeys)[-1].name:
            keys.update(KIND_KEYS)
    return keys


KEYS: dict[str, Key] = _all_keys()
# The keys that only the kinds' synthetic data and the models listing them read (load_config
# drops them from a run that reads them nowhere), in the docs table's order.
SYNTHETIC_KEYS = tuple(n for n in KEYS if any(n in k.synthetic_keys for k in KINDS.values()))

if TYPE_CHECKING:
    Config = GeneralConfig
else:
    # The one step the registries drive at import: a field per model with keys, named after
    # the model and holding its section (`cfg.gpt: GPTKeys`), and the dataset kinds' sections
    # as bases (their keys flat: `cfg.image_size`), so that adding a model or a kind stays one
    # module and one line. A type checker sees the general keys here; a model's code reads its
    # own section typed, `own: GPTKeys = cfg.gpt`.
    Config = dataclasses.make_dataclass(
        "Config",
        [
            (name, own, dataclasses.field(default_factory=own))
            for name, own in MODEL_SECTIONS.items()
        ],
        bases=(GeneralConfig, *KIND_SECTIONS),
    )
    Config.__module__ = __name__  # pickle and repr find it here (make_dataclass's module= 3.12+)
    Config.__doc__ = "The values of every config key: the general ones and each model's section."


def parse_value(key: str, value: Any) -> Any:
    """Convert a TOML value or a command-line string to the type of key `key`, checked. A key
    of a model's table in a config file comes as "<model>.<key>"."""
    model, dot, own = key.partition(".")
    if dot:
        if model not in MODELS:
            raise ConfigError(f"table [{model[:60]}] is not a model; models: {', '.join(MODELS)}")
        declared = {k.name: k for k in OWN_KEYS.get(model, ())}
        if own not in declared:
            raise ConfigError(
                f"[{model}] {own[:60]!r} is not a key of model {model}; its keys: "
                f"{', '.join(declared) or 'none'}"
            )
        return declared[own].parse(value)
    if key not in KEYS:
        close = difflib.get_close_matches(key.lower().replace("-", "_"), KEYS, n=3, cutoff=0.7)
        hint = f"did you mean {' or '.join(close)}? " if close else ""
        name = repr(key) if len(key) <= 80 else f"{key[:60]!r}... ({len(key)} characters)"
        raise ConfigError(f"unknown config key {name}; {hint}accepted keys: {', '.join(KEYS)}")
    return KEYS[key].parse(value)


def config_from(values: dict[str, Any]) -> Config:
    """A Config from values by key name (as `key=value` names them). A model's key goes into
    the section of the run's model when that declares it, else into its first owner's, where
    `validate` refuses a value other than the declared default."""
    model = values.get("model", DEFAULT_MODEL)
    sections: dict[str, dict[str, Any]] = {}
    for name, value in values.items():
        if name in OWNERS:
            owner = model if model in OWNERS[name] else OWNERS[name][0]
            sections.setdefault(owner, {})[name] = value
    flat = {name: value for name, value in values.items() if name in FLAT}
    return Config(**flat, **{m: MODEL_SECTIONS[m](**own) for m, own in sections.items()})


def validate(cfg) -> Config:
    """Each value against its declaration, then the relations between keys."""
    for declared in FLAT.values():
        declared.validate(getattr(cfg, declared.name))
    spec = spec_of(cfg)
    for model, own_keys in OWN_KEYS.items():
        section = getattr(cfg, model)
        for declared in own_keys:
            value = getattr(section, declared.name)
            if model == cfg.model:
                declared.validate(value)
            elif value != declared.default:
                owners = OWNERS[declared.name]
                raise ConfigError(
                    f"config key {declared.name!r} belongs to model {' and '.join(owners)}, but "
                    f"this run trains model={cfg.model}; remove it or set model={owners[0]}"
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
    check_layout_keys(cfg)
    if spec.check is not None:
        spec.check(cfg)
    return cfg


class Loaded(NamedTuple):
    """What load_config returns: the Config, and where each value that is not a declared default
    came from (key -> "command line", a file's path or "job script default"), in the order the
    sources apply. Kept beside the Config, not in it: a Config holds config keys only (it is
    compared, saved and printed as such)."""

    config: Config
    origins: dict[str, str]


def load_config(
    path: str | Path | Sequence[str | Path] | None,
    overrides: Sequence[str] = (),
    job_defaults: Sequence[str] = (),
) -> Loaded:
    """Declared defaults <- a job script's defaults (`--job-default key=value`, e.g. its dataset)
    <- TOML files (merged in order, `extends` followed) <- `key=value` overrides. In each, a key
    of the model the run trains counts the same whether spelled plainly (`preset`) or in the
    model's table (`[gpt] preset`, `gpt.preset=...`): the one set last wins (a file's own keys
    come after its base's); other models' tables are ignored."""
    paths = [path] if isinstance(path, str | Path) else list(path or ())
    layers = [
        parse_items(job_defaults, "job script default"),
        *(read_file(file, parse_value) for file in paths),
        parse_items(overrides, "command line"),
    ]
    model = next((layer["model"][0] for layer in reversed(layers) if "model" in layer), None)
    model = model or DEFAULT_MODEL
    values: dict[str, Any] = {}
    origins: dict[str, str] = {}
    for layer in layers:
        for spelling, (value, origin) in layer.items():
            table, dot, name = spelling.rpartition(".")
            if dot and table != model:
                continue  # another model's table
            values[name] = value
            origins.pop(name, None)  # re-inserted: keys keep the order of their last source
            origins[name] = origin
    drop_unread_keys(values, origins)
    settle_run_length(values, origins)
    return Loaded(validate(config_from(values)), origins)


def settle_run_length(values: dict[str, Any], origins: dict[str, str]) -> None:
    """`epochs` and `max_steps` both give the run's length: the one set last wins, as for any
    key (a config file's max_steps, then epochs=2 on the command line: 2 epochs); both from one
    source is refused. The one that lost is dropped with a line."""
    if not values.get("epochs") or "max_steps" not in values:
        return
    if origins["epochs"] == origins["max_steps"]:
        raise ConfigError(
            f"{origins['epochs']} sets both epochs and max_steps: the run's length is one of "
            "them (epochs=N: N passes over the training split; max_steps=N: N steps)"
        )
    names = list(origins)
    lost = "max_steps" if names.index("max_steps") < names.index("epochs") else "epochs"
    log.info(
        "%s=%s (from %s) is replaced by %s (from %s)",
        lost,
        values.pop(lost),
        origins.pop(lost),
        *(f"{k}={values[k]}" for k in ("epochs", "max_steps") if k != lost),
        origins["max_steps" if lost == "epochs" else "epochs"],
    )


def drop_unread_keys(values: dict[str, Any], origins: dict[str, str]) -> None:
    """A key that only a kind's synthetic data reads (`DatasetKind.synthetic_keys`), and the
    models that say they read it too (`ModelSpec.reads_keys`), is read nowhere in another run
    (another model on a dataset directory, a classifier on its own synthetic data): a value set
    for it there, e.g. by a config file written for the other run, is dropped with a line
    instead of being recorded in config.toml as if used."""
    spec = MODELS[values.get("model", DEFAULT_MODEL)]
    dataset = values.get("dataset", GENERAL["dataset"].default)
    synthetic = KINDS.get(spec.reads[0]) if dataset == "synthetic" else None
    read = {*spec.reads_keys, *(synthetic.synthetic_keys if synthetic else ())}
    for name in SYNTHETIC_KEYS:
        if not values.get(name) or name in read:
            continue
        log.warning(
            "%s=%s (from %s) is not read by model=%s with dataset=%s (only synthetic data and "
            "the models that say so read it): left at its default, %s",
            name,
            values.pop(name),
            origins.pop(name),
            spec.name,
            dataset,
            toml_value(KEYS[name].default),
        )


def parse_items(items: Sequence[str], origin: str) -> Settings:
    """`key=value` items -> values by spelling (`gpt.preset=tiny` as the model's table in a
    file), credited to `origin`. A key repeated in one spelling: the last one wins."""
    values: dict[str, Any] = {}
    for item in items:
        key, value = split_assignment(item)
        values.pop(key, None)
        values[key] = parse_value(key, value)
    try:
        refuse_two_spellings(values, lambda key, value: f"{key}={value}")
    except ConfigError as err:
        raise ConfigError(f"{origin}: {err}") from None
    return {key: (value, origin) for key, value in values.items()}


def describe_origins(origins: dict[str, str]) -> str:
    """Where the values came from, one group per source in the order they apply (load_config
    moves a key to the end when a later source sets it again)."""
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


def config_record(cfg: Config) -> dict[str, Any]:
    """What a run records of its config (config.toml, each checkpoint): the general and the
    dataset kinds' keys in the order of the docs table, then its model's own as a table named
    after the model (`[gpt]`). Other models' keys are at their defaults (`validate`), so they
    are left out."""
    values: dict[str, Any] = {name: getattr(cfg, name) for name in KEYS if name in FLAT}
    if cfg.model in MODEL_SECTIONS:
        values[cfg.model] = dataclasses.asdict(getattr(cfg, cfg.model))
    return values


def saved_config(values: dict) -> Config:
    """The Config a run recorded (config_record's form); keys this version does not know are
    dropped."""
    sections = {}
    for model, section in MODEL_SECTIONS.items():
        table = values.get(model)
        if isinstance(table, dict):
            known = {f.name for f in dataclasses.fields(section)}
            sections[model] = section(**{k: v for k, v in table.items() if k in known})
    flat = {name: value for name, value in values.items() if name in FLAT}
    return Config(**flat, **sections)


def to_toml(cfg: Config) -> str:
    """`key = value` lines in the order of the docs table, then the run's model's table."""
    values = config_record(cfg)
    plain = [(k, v) for k, v in values.items() if not isinstance(v, dict)]
    lines = [f"{key} = {toml_value(value)}\n" for key, value in plain]
    if values.get("epochs"):  # max_steps was worked out from them: read back, a second length
        lines = [f"# {line.rstrip()} (from epochs)\n" if line.startswith("max_steps =") else line
                 for line in lines]  # fmt: skip
    for table, own in ((k, v) for k, v in values.items() if isinstance(v, dict)):
        lines += [f"\n[{table}]\n", *(f"{key} = {toml_value(v)}\n" for key, v in own.items())]
    return "".join(lines)


CONFIG_HEADER = "# resolved configuration of this run, written at start; checksum "


def config_checksum(body: str) -> str:
    return hashlib.sha256(body.encode()).hexdigest()[:16]


def save_config(cfg: Config, path: Path, origins: dict[str, str] | None = None) -> None:
    """Written atomically: a run directory never holds half a config (nor a temp file). The
    header's checksum tells a config.toml edited by hand from the one the run wrote. Where each
    value came from (`origins`, from load_config) is logged (once per start: only the main rank
    saves) and kept as a comment."""
    body = to_toml(cfg)
    if origins is not None:
        described = describe_origins(origins)
        log.info("settings from %s", described)
        body = f"# where the values came from: {described}\n{body}"
    atomic_write_text(path, f"{CONFIG_HEADER}{config_checksum(body)}\n{body}")


def edited_by_hand(path: Path) -> bool:
    """Whether the run's config.toml is no longer the one it wrote (see save_config)."""
    header, _, body = path.read_text(errors="replace").partition("\n")
    return header != CONFIG_HEADER + config_checksum(body)


def docs_table() -> str:
    """The table of config keys in docs/training.md (tests/test_config.py compares it)."""
    rows = [
        "| key | default | accepted | must match on resume | meaning |",
        "|---|---|---|---|---|",
    ]
    for name, declared in KEYS.items():
        meaning = declared.help
        if name in OWNERS or name in KIND_OWNERS:
            owners = OWNERS.get(name) or KIND_OWNERS[name]
            meaning = f"{' and '.join(owners)} only: {meaning}"
        accepted = declared.accepted().replace("|", "\\|")
        resume = "yes" if declared.resume else ""
        meaning = meaning.replace("|", "\\|")
        default = toml_value(declared.default)
        rows.append(f"| `{name}` | `{default}` | {accepted} | {resume} | {meaning} |")
    return "\n".join(rows)
