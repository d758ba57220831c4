"""`init_from=DIR` of a Hugging Face model directory (config.json + safetensors) in the format of
the run's model: what the model calls each tensor is its spec's map (`ModelSpec.hf`: the GPT's,
model=hf's), and each rank reads only its rows of each tensor (hf_format.read_rows). One of the
model directories init_from reads (checkpoint/initial.py's INITIAL_SOURCE_MODULES)."""

from __future__ import annotations

from pathlib import Path

import torch
from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

from ..config_keys import ConfigError
from . import hf_format
from .adapters import init_adapters
from .hf_format import HFDir
from .initial import InitialSource, check_same_tensors, local_rows, tied_names


def load_hf_dir(model, spec, cfg, info, directory: HFDir) -> str:
    """The directory's tensors into the model (plain, DDP or FSDP2), each rank its rows; a
    run's adapters are set, not read; what was loaded in words (rows cut from a tensor too)."""
    path = directory.path
    if spec.hf is None:
        raise ConfigError(
            f"init_from={path}: model={cfg.model} has no Hugging Face format (ModelSpec.hf); "
            "start from a run directory of this package instead"
        )
    state = get_model_state_dict(model)  # this rank's shards under FSDP, full under DDP
    tied = tied_names(state)
    skipped = tied.keys() | init_adapters(state, cfg.seed)  # adapters (LoRA's): set, not read
    expected = {k: tuple(v.shape) for k, v in state.items() if k not in skipped}
    names, stored = name_map(spec, cfg, info, directory, expected)
    vocab_size = directory.config.get("vocab_size")
    check_same_tensors(path, stored_shapes(path, names, stored, expected, vocab_size), expected)
    with torch.no_grad():
        for key, hf in names.items():
            local, start = local_rows(state[key])
            where = stored[hf.name][0]
            rows = hf_format.read_rows(where, hf.name, start, start + local.shape[0], hf.transposed)
            local.copy_(rows)
    for key, same_as in tied.items():
        state[key] = state[same_as]
    set_model_state_dict(model, state)
    cut = [
        f"{hf.name} cut from {stored[hf.name][1][0]} to {expected[key][0]} rows"
        for key, hf in names.items()
        if hf.cut and stored[hf.name][1][0] > expected[key][0]
    ]
    what = "; ".join([f"Hugging Face {directory.config.get('model_type')}", *cut])
    return f"{path} ({what})"


def name_map(spec, cfg, info, directory: HFDir, expected: dict) -> tuple[dict, dict]:
    """The model's names -> HFName (the spec's map), and where each Hugging Face tensor is:
    name -> (file or tensor in memory, shape). Where the names do not map one to one, the
    tensors are those transformers' own loader makes of the files, read whole, once."""
    stored: dict = directory.tensors
    try:
        names = spec.hf.from_hf(cfg, info, directory.config, stored.keys(), expected.keys())
        if names is None:
            whole = hf_format.load_with_transformers(directory.path)
            tied = tied_names(whole)  # a tied output layer is the embedding, not a tensor
            stored = {n: (t, tuple(t.shape)) for n, t in whole.items() if n not in tied}
            names = spec.hf.from_hf(cfg, info, directory.config, stored.keys(), expected.keys())
    except ConfigError:  # the directory's files: the message names them
        raise
    except ValueError as err:
        raise ConfigError(f"init_from={directory.path}: not the configured model: {err}") from None
    if names is None:
        raise ConfigError(
            f"init_from={directory.path}: its tensors do not map to the model's, also as "
            "transformers loads them"
        )
    return names, stored


def stored_shapes(
    source: Path, names: dict, stored: dict, expected: dict, vocab_size: int | None
) -> dict[str, tuple[int, ...]]:
    """The shape each of the model's tensors has as read: the stored one, transposed where it
    is stored transposed, and with the model's rows where the map allows padding rows. A
    tensor with padding rows (the embedding) must hold config.json's `vocab_size` rows."""
    shapes = {}
    for key, hf in names.items():
        shape = stored[hf.name][1][::-1] if hf.transposed else stored[hf.name][1]
        rows = expected.get(key, (0,))[0] if shape else 0
        if hf.padded and shape and shape[0] != vocab_size:
            raise ConfigError(
                f"init_from={source}: tensor {hf.name} has {shape[0]} rows but its config.json's "
                f"vocab_size is {vocab_size}"
            )
        if (hf.padded and shape and shape[0] <= rows) or (hf.cut and shape and shape[0] >= rows):
            shape = (rows, *shape[1:])
        shapes[key] = shape
    return shapes


INITIAL_SOURCE = InitialSource(
    name="hf",
    what="a Hugging Face model directory (no config.json)",
    recognises=hf_format.is_hf_dir,
    open=hf_format.open_dir,
    load=load_hf_dir,
)
