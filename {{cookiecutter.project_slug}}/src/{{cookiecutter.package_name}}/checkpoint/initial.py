"""`init_from=PATH`: a new run starts from weights - the newest complete, verified checkpoint of
another run directory of this package (any parallelism, any rank count), or a Hugging Face model
directory (config.json + safetensors) in the format of the run's model (`ModelSpec.hf`).
Only the model's weights: optimizer, step, schedule and data position start fresh.

From a run directory the load is sharded: DCP reads into the run's own (FSDP-sharded) tensors,
so each rank reads only its part. A Hugging Face directory is read whole by every rank, then
each keeps its shard. Names and shapes are compared first: a source that is not the configured
model is refused naming the first tensor (or setting) that differs.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    set_model_state_dict,
)

from ..config_keys import ConfigError
from . import hf_format
from .export import _find_checkpoint
from .integrity import MARKER, verify

log = logging.getLogger(__name__.split(".")[0])


def check_source(init_from: str, run_dir: str) -> None:
    """Before the run directory is touched: `init_from` is a directory, not this run's own, and
    holds a Hugging Face model or a complete checkpoint. One line naming it otherwise."""
    path = Path(init_from)
    if not path.exists():
        raise ConfigError(f"init_from={init_from}: does not exist")
    if not path.is_dir():
        raise ConfigError(f"init_from={init_from}: a file; a run directory or a model directory")
    if path.resolve() == Path(run_dir).resolve():
        raise ConfigError(
            f"init_from={init_from} is this run's own run_dir: to continue a run, start it again "
            "without init_from (it resumes from its newest checkpoint)"
        )
    if hf_format.is_hf_dir(path):
        hf_format.weight_files(path)
        return
    if not _find_checkpoint(path):
        raise ConfigError(
            f"init_from={init_from}: neither a Hugging Face model directory (no config.json) nor "
            "a run directory with a complete checkpoint"
        )


def load_initial_weights(model: torch.nn.Module, spec, cfg, info, source: str) -> str:
    """Load `source` (init_from, or the model's own initial weights) into `model` (plain, DDP
    or FSDP2); returns what was loaded."""
    path = Path(source)
    if hf_format.is_hf_dir(path):
        return _from_hf_dir(model, spec, cfg, info, path)
    return _from_run_dir(model, path)


def _from_hf_dir(model, spec, cfg, info, path: Path) -> str:
    if spec.hf is None:
        raise ConfigError(
            f"init_from={path}: model={cfg.model} has no Hugging Face format (ModelSpec.hf); "
            "start from a run directory of this package instead"
        )
    config = hf_format.read_config(path)
    try:
        state = spec.hf.load(cfg, info, path)
    except ConfigError:  # the directory's files: the message names them
        raise
    except ValueError as err:
        raise ConfigError(f"init_from={path}: not the configured model: {err}") from None
    expected = {k: tuple(v.shape) for k, v in get_model_state_dict(model).items()}
    check_same_tensors(path, {k: tuple(v.shape) for k, v in state.items()}, expected)
    set_model_state_dict(model, state, options=StateDictOptions(full_state_dict=True))
    return f"{path} (Hugging Face {config.get('model_type')})"


def _from_run_dir(model, path: Path) -> str:
    for checkpoint in _find_checkpoint(path):
        problem = verify(checkpoint)
        if problem:
            log.warning("init_from: skipping checkpoint %s: %s", checkpoint, problem)
            continue
        parts = json.loads((checkpoint / MARKER).read_text()).get("parts", {})
        part = next((n for n, kind in parts.items() if kind == "ModelAndOptimizer"), None)
        if part is None:
            raise ConfigError(f"init_from: checkpoint {checkpoint} holds no model")
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
        return f"{checkpoint} (run directory)"
    raise ConfigError(f"init_from={path}: none of its checkpoints passes its checks")


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
