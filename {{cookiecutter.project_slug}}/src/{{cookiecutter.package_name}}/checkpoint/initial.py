"""`init_from=PATH`: a new run starts from weights - the newest complete, verified checkpoint of
another run directory of this package (any parallelism, any rank count), a Hugging Face model
directory (config.json + safetensors) in the format of the run's model (`ModelSpec.hf`), or a
weights file under the model's own names: `.pth`/`.pt`/`.bin` (a state dict saved by torch.save,
as torchvision's weights are, or `export --out model.pt`) or `.safetensors` (timm's weights on
the Hugging Face hub, `export --out model.safetensors`). A file made for other classes than the
dataset's loads all but the model's classifier head (`ModelSpec.head`), which stays as built.
Only the model's weights: optimizer, step, schedule and data position start fresh.

The load is sharded: under FSDP each rank reads only its own part of each tensor - DCP reads a
run directory into the run's own sharded tensors; a Hugging Face directory is read tensor by
tensor, each rank its rows. With the model built on the meta device (train.build), no rank
holds the whole model or the whole checkpoint at any time. Names and shapes are compared
first: a source that is not the configured model is refused naming the first tensor (or
setting) that differs; weights holding a NaN or inf are refused naming the tensor, whatever the
source (the LoRA base, hf_model, included).

A source is read once (`open_initial`, which start.py's `open_start` calls before the run
directory is touched): a weights file's tensors (memory-mapped), a run directory's checkpoints,
or a model directory of another format. Such a format is one module in this folder with an
`INITIAL_SOURCE` (an `InitialSource`), and its module name in INITIAL_SOURCE_MODULES: one line
(a Hugging Face directory: initial_hf.py, where its spec's map names each tensor).
"""

from __future__ import annotations

import functools
import importlib
import json
import logging
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    set_model_state_dict,
)
from torch.distributed.tensor import DTensor

from ..config_keys import ConfigError, optional_import
from ..data.kinds import KINDS
from ..telemetry.metrics import peak_resident_gib
from .integrity import MARKER, complete_checkpoints, verify
from .manager import read_checkpoint

log = logging.getLogger(__name__.split(".")[0])


def initial_source(cfg, spec) -> str | None:
    """Where a new run's weights come from: init_from, the model's own (model=hf: hf_model's
    pretrained weights), or nowhere (None: the model initialises them)."""
    return cfg.init_from or (spec.initial_weights(cfg) if spec.initial_weights else None)


# torch.save'd state dicts (torchvision's weights, export's .pt, a hub's pytorch_model.bin) and
# safetensors files (a timm model's model.safetensors on the hub, export's .safetensors)
WEIGHT_FILES = (".pth", ".pt", ".bin", ".safetensors")


@dataclass(frozen=True)
class WeightsFile:
    """A state dict saved by torch.save: tensors under the model's own names."""

    path: Path
    tensors: dict[str, torch.Tensor]


@dataclass(frozen=True)
class InitialSource:
    """A model directory init_from reads besides a run directory. `what`: its words in the
    message that refuses a directory which is neither; `recognises(path)`: a directory of this
    format; `open(path)`: it, read once (what the checks need; problems in one line);
    `load(model, spec, cfg, info, opened)`: its weights into the model, each rank its part,
    and what was loaded in words."""

    name: str
    what: str
    recognises: Callable[[Path], bool]
    open: Callable[[Path], object]
    load: Callable[..., str]
{%- if cookiecutter.workload in ["all", "language"] %}


INITIAL_SOURCE_MODULES = (
    "initial_hf",  # a Hugging Face model directory (config.json + safetensors)
)
{%- else %}


INITIAL_SOURCE_MODULES: tuple[str, ...] = ()  # run directories and weights files only
{%- endif %}


@functools.cache
def initial_sources() -> dict[str, InitialSource]:
    """Every model directory format by name; imported when a run first opens its source."""
    found = {}
    for module in INITIAL_SOURCE_MODULES:
        entry = importlib.import_module(f".{module}", __package__).INITIAL_SOURCE
        if entry.name in found:
            raise ImportError(f"two initial sources are named {entry.name!r} ({module}.py)")
        found[entry.name] = entry
    return found


@dataclass(frozen=True)
class OpenedDirectory:
    """A model directory of one of `initial_sources()`, as its `open` read it."""

    source: InitialSource
    opened: object


# A source, read once: a model directory (a Hugging Face one: its config.json and tensors'
# headers), a weights file, or the complete checkpoints of a run directory, newest first.
WeightSource = OpenedDirectory | WeightsFile | list[Path]


def open_initial(cfg, spec, run_dir: str = "") -> WeightSource | None:
    """The new run's `initial_source`, checked and read once (None: there is none). Called
    before the run directory is touched (`run_dir`: the run's own, which cannot be its source):
    a source that is missing, not a directory or broken is named in one line."""
    where = initial_source(cfg, spec)
    if not where:
        return None
    path = Path(where)
    if not path.exists():
        raise ConfigError(f"init_from={where}: does not exist")
    if path.is_file() and path.suffix in WEIGHT_FILES:
        return open_weights_file(path)
    if not path.is_dir():
        raise ConfigError(
            f"init_from={where}: a file, but not a weights file ({' or '.join(WEIGHT_FILES)}); "
            "a run directory, a model directory or a weights file"
        )
    if run_dir and path.resolve() == Path(run_dir).resolve():
        raise ConfigError(
            f"init_from={where} is this run's own run_dir: to continue a run, start it again "
            "without init_from (it resumes from its newest checkpoint)"
        )
    sources = initial_sources().values()
    for source in sources:
        if source.recognises(path):
            return OpenedDirectory(source, source.open(path))
    checkpoints = complete_checkpoints(path)
    if not checkpoints:
        neither = [source.what for source in sources]
        raise ConfigError(
            f"init_from={where}: "
            + (f"neither {' nor '.join(neither)} nor " if neither else "not ")
            + "a run directory with a complete checkpoint"
        )
    return checkpoints


def load_initial_weights(
    model: torch.nn.Module, spec, cfg, info, source: WeightSource
) -> tuple[str, dict]:
    """Load a new run's initial weights (`open_initial`) into `model` (plain, DDP or FSDP2),
    each rank its part. Returns what was loaded, and this rank's peak host memory so far
    beside the size of the model's weights (GiB)."""
    if isinstance(source, OpenedDirectory):
        loaded = source.source.load(model, spec, cfg, info, source.opened)
    elif isinstance(source, WeightsFile):
        loaded = _from_weights_file(model, spec, cfg, info, source)
    else:
        loaded = _from_run_dir(model, cfg, info, source)
    refuse_non_finite(model, cfg, spec)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())  # global sizes
    return loaded, {"model_gib": weights / 2**30, "peak_rss_gib": peak_resident_gib()}


def refuse_non_finite(model: torch.nn.Module, cfg, spec) -> None:
    """Weights with a NaN or inf (a diverged run's, a broken file) are refused naming the first
    such tensor: trained on, every loss would be NaN. Collective: each rank checks its part
    (FSDP2: its shards) and every rank learns the first name any found."""
    bad = None
    for name, tensor in get_model_state_dict(model).items():
        local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
        if local.is_floating_point() and not bool(torch.isfinite(local).all()):
            bad = f"{name} holds {'NaN' if bool(local.isnan().any()) else 'inf'}"
            break
    if dist.is_initialized():
        found = [None] * dist.get_world_size()
        dist.all_gather_object(found, bad)
        bad = next((item for item in found if item), None)
    if bad:
        which = "init_from" if cfg.init_from else "hf_model"
        raise ConfigError(
            f"{which}={initial_source(cfg, spec)}: tensor {bad}: weights that are not finite "
            "would make every loss NaN; refused"
        )


def tied_names(state: dict) -> dict[str, str]:
    """Names of tensors that are another's (a tied output layer is the embedding): name ->
    the first name of the same tensor. They are loaded once."""
    first: dict[int, str] = {}
    tied = {}
    for name, tensor in state.items():
        local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
        if local.numel() == 0:  # no rows on this rank (a tensor smaller than the ranks)
            continue
        key = (local.untyped_storage().data_ptr(), local.storage_offset(), tuple(tensor.shape))
        if key in first:
            tied[name] = first[key]
        else:
            first[key] = name
    return tied


def local_rows(tensor: torch.Tensor) -> tuple[torch.Tensor, int]:
    """This rank's part of a model tensor and the row of the whole tensor where it starts: all
    of a plain (DDP) tensor; under FSDP2 a chunk of rows (dim 0 split as torch.chunk splits)
    over the mesh's shard dimension (hsdp: its replicate dimension holds copies)."""
    if not isinstance(tensor, DTensor):
        return tensor, 0
    local = tensor.to_local()
    sharded = [dim for dim, p in enumerate(tensor.placements) if not p.is_replicate()]
    if not sharded:
        return local, 0
    (dim,) = sharded
    if not tensor.placements[dim].is_shard(0):
        raise ValueError(f"cannot load a tensor placed {tensor.placements[dim]}")
    rows = tensor.shape[0]
    chunk = -(-rows // tensor.device_mesh.size(dim))
    return local, min(tensor.device_mesh.get_local_rank(dim) * chunk, rows)


def open_weights_file(path: Path) -> WeightsFile:
    """The tensors of a torch.save'd state dict or a safetensors file, memory-mapped (read as
    they are copied); a file that is not one (a pickled module, a training checkpoint's nested
    dict, no bytes) in one line. A file of torch's format before 1.6 (not a zip) cannot be
    memory-mapped: it is read whole."""
    try:
        if Path(path).stat().st_size == 0:
            raise ConfigError(f"init_from={path}: an empty file (0 bytes), not a state dict")
        if path.suffix == ".safetensors":
            st = optional_import("safetensors.torch", "safetensors", f"init_from={path}")
            state = st.load_file(path, device="cpu")
        else:
            legacy = not zipfile.is_zipfile(path)
            state = torch.load(path, map_location="cpu", weights_only=True, mmap=not legacy)
    except ConfigError:
        raise
    except Exception as err:  # not a zip of tensors, or pickled code weights_only refuses
        cause = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ConfigError(
            f"init_from={path}: a file, but not a state dict torch can read ({cause})"
        ) from None
    if not isinstance(state, dict) or not state:
        raise ConfigError(f"init_from={path}: a file, but no state dict (a dict of tensors)")
    for name, tensor in state.items():
        if not isinstance(tensor, torch.Tensor):
            raise ConfigError(
                f"init_from={path}: a file, but its entry {name!r} is a {type(tensor).__name__}, "
                "not a tensor (a state dict of tensors, as torchvision's weights files are)"
            )
    return WeightsFile(path, state)


def _from_weights_file(model, spec, cfg, info, source: WeightsFile) -> str:
    """The file's tensors into the model's, each rank its rows. Where the classifier head's
    shapes differ (other classes), the head keeps the weights `build` gives it."""
    state = get_model_state_dict(model)  # this rank's shards under FSDP, full under DDP
    expected = {name: tuple(t.shape) for name, t in state.items()}
    found = {name: tuple(t.shape) for name, t in source.tensors.items()}
    head = spec.head(cfg, info) if spec.head else set()
    kept = sorted(n for n in head if n in found and n in expected and found[n] != expected[n])
    check_same_tensors(
        source.path,
        {n: s for n, s in found.items() if n not in kept},
        {n: s for n, s in expected.items() if n not in kept},
    )
    values = dict(source.tensors)
    if kept:  # the head as `build` makes it: the same seeded weights as a run without init_from
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(cfg.seed)
            built = spec.build(cfg, info).state_dict()
        values.update({name: built[name] for name in kept})
    with torch.no_grad():
        for name, tensor in state.items():
            local, start = local_rows(tensor)
            value = values[name]
            local.copy_(value[start : start + local.shape[0]] if value.dim() else value)
    set_model_state_dict(model, state)
    if not kept:
        return f"{source.path} (weights file)"
    classes = found[kept[0]][0] if found[kept[0]] else "other"
    return (
        f"{source.path} (weights file; its classifier head is for {classes} classes, the "
        f"dataset has {info.num_classes}: {', '.join(kept)} left as built)"
    )


def _from_run_dir(model, cfg, info, checkpoints: list[Path]) -> str:
    for checkpoint in checkpoints:
        problem = verify(checkpoint)
        if problem:
            log.warning("init_from: skipping checkpoint %s: %s", checkpoint, problem)
            continue
        parts = json.loads((checkpoint / MARKER).read_text()).get("parts", {})
        part = next((n for n, kind in parts.items() if kind == "ModelAndOptimizer"), None)
        if part is None:
            raise ConfigError(f"init_from: checkpoint {checkpoint} holds no model")
        train = next((n for n, kind in parts.items() if kind == "TrainState"), None)
        new_ids = source_ids(checkpoint, train, cfg, info)
        prefix = f"{part}.model."
        reader = dcp.FileSystemReader(checkpoint)
        saved = {
            key[len(prefix) :]: tuple(meta.size)
            for key, meta in reader.read_metadata().state_dict_metadata.items()
            if key.startswith(prefix) and isinstance(meta, TensorStorageMetadata)
        }
        state = get_model_state_dict(model)  # this rank's shards under FSDP, full under DDP
        check_same_tensors(checkpoint, saved, {k: tuple(v.shape) for k, v in state.items()})
        dcp.load(
            {prefix + k: v for k, v in state.items()},
            storage_reader=reader,
            no_dist=not dist.is_initialized(),
        )
        set_model_state_dict(model, state)
        return f"{checkpoint} (run directory{new_ids})"
    raise ConfigError(
        f"init_from={checkpoints[0].parent}: none of its checkpoints passes its checks"
    )


def source_ids(checkpoint: Path, train_part: str | None, cfg, info) -> str:
    """The source run's ids must mean what the new run's mean: its checkpoint's record of its
    data (data_info's details) against the new run's dataset's, as the kind compares them
    (`DatasetKind.source_ids`; a kind without ids: ""). A difference is a ConfigError naming
    init_from, unless the kind's own key accepts it; then the words the log of the source adds."""
    compare = KINDS[info.kind].source_ids if info.kind in KINDS else None
    if compare is None:
        return ""
    extra = read_checkpoint(checkpoint, lambda key: key == f"{train_part}.extra")
    recorded = json.loads(next(iter(extra.values()), None) or "{}").get("config", {})
    theirs = (recorded.get("data_info") or {}).get("details", {})
    try:
        return compare(checkpoint, theirs, info.details, cfg)
    except ConfigError as err:
        raise ConfigError(f"init_from={checkpoint.parent.parent}: {err}") from None


def check_same_tensors(source: Path, found: dict, expected: dict) -> None:
    """Names and (global) shapes of the source's tensors against the model's; the first
    difference in one line."""
    for name, shape in expected.items():
        if name not in found:
            raise ConfigError(
                f"init_from={source}: has no tensor {name} (the model's {list(shape)})"
            )
        if found[name] != shape:
            raise ConfigError(
                f"init_from={source}: tensor {name} is {list(found[name])}, the model's is "
                f"{list(shape)}"
            )
    extra = sorted(set(found) - set(expected))
    if extra:
        raise ConfigError(f"init_from={source}: tensor {extra[0]} is not in the model")
