"""Reading a checkpoint in one process, whatever the number of ranks that wrote it: the model
alone (`load_model_state`), as one file (`export_model`), or every entry (`read_checkpoint`).

`export --format NAME` writes one of EXPORT_FORMATS: `file` is export_model; another format is
one module in this folder with an `EXPORT_FORMAT` (an `ExportFormat`), and its module name in
EXPORT_MODULES: one line. They are imported when `export` builds its parser, not before."""

from __future__ import annotations

import functools
import importlib
import json
import logging
import subprocess
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from ..config_keys import ConfigError, optional_import
from ..run.atomic import atomic_write, hidden_write_cause
from ..run.rundir import RunDir
from . import adapters
from .integrity import MARKER, CheckpointError, complete_checkpoints, verify
from .manager import read_checkpoint

log = logging.getLogger(__name__.split(".")[0])


def load_model_state(run_dir: Path, merge_adapters: bool = True) -> tuple[dict, dict]:
    """(saved config, full unsharded model state dict on CPU) from the newest complete and
    verified checkpoint of `run_dir` (or from the checkpoint directory `run_dir`). One process,
    no process group needed, whatever the number of ranks that wrote it. A run's adapters
    are merged into its base (checkpoint/adapters.py), unless `merge_adapters` is False."""
    if not Path(run_dir).is_dir():
        raise ConfigError(f"{run_dir} does not exist (or is not a directory): which run_dir?")
    candidates = complete_checkpoints(run_dir)
    if not candidates:
        raise CheckpointError(f"no complete checkpoint in {run_dir}")
    for path in candidates:
        problem = verify(path)
        if problem:
            log.warning("skipping checkpoint %s: %s", path, problem)
            continue
        parts = json.loads((path / MARKER).read_text()).get("parts", {})
        return _read_model(path, parts, merge_adapters)
    raise CheckpointError(f"none of the checkpoints in {run_dir} passes its checks")


def _read_model(path: Path, parts: dict[str, str], merge_adapters: bool) -> tuple[dict, dict]:
    model_part = next((n for n, kind in parts.items() if kind == "ModelAndOptimizer"), None)
    train_part = next((n for n, kind in parts.items() if kind == "TrainState"), None)
    if model_part is None:
        raise CheckpointError(f"checkpoint {path} holds no ModelAndOptimizer part")
    prefix, extra = f"{model_part}.model.", f"{train_part}.extra"
    flat = read_checkpoint(path, lambda key: key.startswith(prefix) or key == extra)
    record = json.loads(flat.pop(extra, "{}"))
    state = {key[len(prefix) :]: tensor for key, tensor in flat.items()}
    return adapters.merged(record, state) if merge_adapters else (record.get("config", {}), state)


def check_outside_checkpoints(run_dir: Path, out: Path) -> None:
    """An export inside a checkpoint directory would be a file its COMPLETE.json does not list:
    that checkpoint would then fail its check, and a resume fall back to an older one."""
    checkpoints = RunDir(run_dir).checkpoints.resolve()
    if Path(out).resolve().is_relative_to(checkpoints):
        raise ValueError(f"export: --out {out} is inside {checkpoints}; write it elsewhere")


def export_model(run_dir: Path, out: Path) -> Path:
    """Write the model of the newest checkpoint as one file: `.pt` (a torch.save'd state dict,
    `reload_fields` in its `_metadata`) or `.safetensors` (needs the optional `safetensors`
    package; its metadata records the run's config and, on their own, the fields that rebuild
    the model and its evaluation transform: `reload_fields`)."""
    out = Path(out)
    check_outside_checkpoints(run_dir, out)
    if out.suffix not in (".pt", ".safetensors"):
        raise ValueError(f"export: --out must end in .pt or .safetensors, got {str(out)!r}")
    if out.suffix == ".safetensors":
        st = optional_import(
            "safetensors.torch", "safetensors", "export to .safetensors", error=CheckpointError
        )
    config, state = load_model_state(run_dir)
    built = as_built(config)
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        if out.suffix == ".pt":
            atomic_write(out, lambda tmp: torch.save(with_fields(state, built), tmp))
        else:
            meta = {"format": "pt", "config": json.dumps(built, sort_keys=True)}
            meta |= reload_fields(built)
            atomic_write(out, lambda tmp: st.save_file(state, str(tmp), meta))
    except Exception as err:  # torch's and safetensors' writers hide a full disk's errno
        cause = hidden_write_cause(err, out.parent)
        if cause is None:
            raise
        raise CheckpointError(f"export: cannot write {out}: {cause}") from None
    return out


def with_fields(state: dict, config: dict) -> OrderedDict:
    """A `.pt` export: the state dict, with `reload_fields` in its `_metadata` (where torch keeps
    a state dict's own records; `torch.load(F)._metadata["export"]`). load_state_dict reads only
    the entries named after a module and their "version": these fields change nothing there."""
    state = OrderedDict(state)
    state._metadata = {"export": reload_fields(config)}
    return state


def as_built(config: dict) -> dict:
    """The saved config with the model's sizes as built where it says "0: the preset's" or "the
    dataset's" (ModelSpec.architecture): the exported file alone says what it holds."""
    if not isinstance(config.get("data_info"), dict):
        return config  # not written by train.py: as saved
    from ..config.settings import config_record, saved_config
    from ..data.info import saved_data_info
    from ..models import spec_of

    cfg = saved_config(config)
    spec = spec_of(cfg)
    if spec.architecture is None:
        return config
    return config | config_record(spec.architecture(cfg, saved_data_info(config, "export")))


def reload_fields(config: dict) -> dict[str, str]:
    """What rebuilds the model without this package, as metadata strings: `model`, the model's
    own keys (`vision_model`: torchvision.models.get_model's name; `timm_model`:
    timm.create_model's), a classifier's `num_classes` and `class_names` (a JSON list, in label
    order), and what the dataset's kind adds (its `export_fields`: an images dataset's
    evaluation transform, data/preprocessing.py: `image_size`, `resize_size`, `crop`,
    `interpolation`, `mean`, `std`)."""
    fields: dict[str, str] = {}
    model = config.get("model")
    if isinstance(model, str):
        fields["model"] = model
        own = config.get(model)
        for name, value in (own if isinstance(own, dict) else {}).items():
            fields[name] = value if isinstance(value, str) else json.dumps(value)
    info = config.get("data_info")
    if isinstance(info, dict) and info.get("num_classes"):
        fields["num_classes"] = str(info["num_classes"])
        fields["class_names"] = json.dumps(list(info.get("class_names") or ()))
    if isinstance(info, dict) and isinstance(info.get("details"), dict):
        from ..data.kinds import KINDS

        kind = KINDS.get(str(info.get("kind")))
        if kind is not None and kind.export_fields is not None:
            fields |= kind.export_fields(info["details"])
    return fields


def git_commit() -> str | None:
    """Commit of the code being run, or None (no git, not a repository): never fails."""
    try:
        result = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=Path(__file__).parent,
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if result.returncode != 0:
        return None
    return result.stdout.strip() or None


@dataclass(frozen=True)
class ExportFormat:
    """`export --format NAME`: `write(run_dir, out)` writes the newest checkpoint's model at
    `out` and returns it; `help`: its words in `export --help`; `loaded_by`: what loads the
    directory it writes (None: it writes one file)."""

    name: str
    help: str
    write: Callable[[Path, Path], Path]
    loaded_by: str | None = None
{%- if cookiecutter.workload in ["all", "language"] %}


EXPORT_MODULES = (
    "export_hf",  # --format hf: a directory transformers loads
    "export_peft",  # --format peft: a LoRA run's adapters, a directory peft loads
)
{%- else %}


EXPORT_MODULES: tuple[str, ...] = ()  # `file` only: hf and peft come with the language workload
{%- endif %}
FILE_FORMAT = ExportFormat("file", "one state dict (.pt/.safetensors)", export_model)


@functools.cache
def export_formats() -> dict[str, ExportFormat]:
    """Every export format by name, `file` first."""
    found = {FILE_FORMAT.name: FILE_FORMAT}
    for module in EXPORT_MODULES:
        entry = importlib.import_module(f".{module}", __package__).EXPORT_FORMAT
        if entry.name in found:
            raise ImportError(
                f"two export formats are named {entry.name!r} (checkpoint/{module}.py)"
            )
        found[entry.name] = entry
    return found
