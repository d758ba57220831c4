"""Hugging Face model directories on disk: `config.json` and the weights in safetensors, one file
(`model.safetensors`) or shards with an index (`model.safetensors.index.json`), as
`save_pretrained` writes them. Reading needs the `safetensors` package (the `[hf]` extra), not
transformers (but for layouts whose names do not map one to one). Which names and shapes a
model has is its spec's business (`ModelSpec.hf`): this module reads and writes the files.

Reading and writing use safetensors directly rather than torch's HuggingFaceStorageReader /
HuggingFaceStorageWriter or huggingface_hub's save_torch_state_dict: measured on GPT-2 124M
(docs/finetune.md), they were as fast or slower and held more memory, and the reader needs
tensors in the files' layout where the GPT keeps GPT-2's Conv1D weights transposed."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

from ..config_keys import ConfigError, first_line, optional_import
from ..run.atomic import atomic_directory, atomic_write_text, hidden_write_cause

SINGLE, INDEX = "model.safetensors", "model.safetensors.index.json"
MAX_SHARD_BYTES = 5 * 2**30  # transformers' default shard size (5 GB)


def safetensors_torch():
    return optional_import("safetensors.torch", "hf", "Hugging Face weights")


@dataclass(frozen=True)
class HFDir:
    """A Hugging Face model directory, read once: its config.json and where each of its
    tensors is (name -> (safetensors file, shape), from the files' headers)."""

    path: Path
    config: dict
    tensors: dict[str, tuple[Path, tuple[int, ...]]]


def is_hf_dir(path: Path) -> bool:
    return (Path(path) / "config.json").is_file()


def open_dir(directory: Path) -> HFDir:
    """config.json and the tensors' names and shapes of `directory`; no weights are read. A
    broken config.json, index or weight file is named in one line."""
    directory = Path(directory)
    return HFDir(directory, read_config(directory), stored_tensors(weight_files(directory)))


def read_config(directory: Path) -> dict:
    path = Path(directory) / "config.json"
    try:
        config = json.loads(path.read_text())
    except OSError as err:
        raise ConfigError(f"{path}: cannot read: {err.strerror}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ConfigError(f"{path}: not valid JSON ({err})") from None
    if not isinstance(config, dict):
        raise ConfigError(f"{path}: not a JSON object")
    return config


def weight_files(directory: Path) -> list[Path]:
    """The safetensors files of `directory`, from its index when it has one."""
    if (directory / INDEX).is_file():
        try:
            names = sorted(set(json.loads((directory / INDEX).read_text())["weight_map"].values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
            raise ConfigError(f"{directory / INDEX}: unreadable index ({err})") from None
        files = [directory / name for name in names]
    elif (directory / SINGLE).is_file():
        files = [directory / SINGLE]
    else:
        raise ConfigError(
            f"{directory} has no {SINGLE} or {INDEX} (PyTorch .bin files are not read)"
        )
    missing = [f.name for f in files if not f.is_file()]
    if missing:
        raise ConfigError(
            f"{directory}: the index names missing weight files: {', '.join(missing)}"
        )
    return files


def _unreadable(path: Path, err: Exception) -> ConfigError:
    return ConfigError(f"{path}: cannot read the weights ({first_line(err)})")


def stored_tensors(files: list[Path]) -> dict[str, tuple[Path, tuple[int, ...]]]:
    """name -> (file, shape) of every tensor in the safetensors `files`, from their headers. A
    truncated or foreign file is named here."""
    st = safetensors_torch()
    stored = {}
    for path in files:
        try:
            with st.safe_open(str(path), framework="pt") as f:
                for name in f.keys():
                    stored[name] = (path, tuple(f.get_slice(name).get_shape()))
        except Exception as err:  # SafetensorError (truncated, not safetensors), OSError
            raise _unreadable(path, err) from None
    return stored


def read_rows(
    stored: Path | torch.Tensor, name: str, start: int, stop: int, transposed: bool = False
) -> torch.Tensor:
    """Rows start..stop of the model's tensor `name` (all of a 0-d one), from the safetensors
    file `stored` or from a tensor in memory; `transposed`: stored as the model tensor's
    transpose. Only these rows are read from a file, which is opened for this read alone (its
    pages are not kept mapped); rows past the stored ones are zeros."""
    if isinstance(stored, torch.Tensor):
        return stored if stored.dim() == 0 else stored[start:stop]
    try:
        with safetensors_torch().safe_open(str(stored), framework="pt") as f:
            part = f.get_slice(name)
            if not part.get_shape():
                return f.get_tensor(name)
            if transposed:
                return part[:, start:stop].t()
            have = part.get_shape()[0]
            rows = part[min(start, have) : min(stop, have)]
    except Exception as err:  # the file changed or went away since its header was read
        raise _unreadable(stored, err) from None
    if rows.shape[0] < stop - start:  # zero rows the file does not hold
        rows = torch.cat([rows, rows.new_zeros(stop - start - rows.shape[0], *rows.shape[1:])])
    return rows


def load_with_transformers(directory: Path) -> dict[str, torch.Tensor]:
    """The directory's model as transformers' own loader builds it (each architecture's
    renamings applied): module name -> tensor, for layouts whose names do not map one to one.
    A tensor it finds no weights for is refused (transformers would initialise it randomly), and
    so are weights it finds no tensor for (transformers would drop them)."""
    transformers = optional_import("transformers", "hf", f"reading {directory}")
    try:
        model, info = transformers.AutoModelForCausalLM.from_pretrained(
            directory,
            dtype=torch.float32,
            local_files_only=True,
            output_loading_info=True,
            trust_remote_code=False,
        )
    except Exception as err:  # missing or truncated safetensors: transformers' own words
        raise ConfigError(f"{directory}: transformers cannot load it: {first_line(err)}") from None
    if info["missing_keys"]:
        raise ConfigError(f"{directory}: it has no weights for {sorted(info['missing_keys'])[0]}")
    if info["unexpected_keys"]:
        unused = sorted(info["unexpected_keys"])
        raise ConfigError(
            f"{directory}: {len(unused)} of its tensors are not in the model its config.json "
            f"describes: {', '.join(unused[:5])}" + (" ..." if len(unused) > 5 else "")
        )
    return model.state_dict()


def write_model_dir(
    out: Path,
    config: dict,
    tensors: dict[str, torch.Tensor],
    extra_files: dict[str, Path] = {},  # noqa: B006 - read only: name in out -> file to copy
    max_shard_bytes: int = MAX_SHARD_BYTES,
) -> Path:
    """Write a directory save_pretrained would write, complete or not at all: everything goes to
    a temporary directory next to `out`, which is renamed to `out` at the end."""
    out = Path(out)
    if out.exists():
        raise ConfigError(f"{out} exists: export writes a new directory")
    with atomic_directory(out) as tmp:
        shards = shard(tensors, max_shard_bytes)
        names = (
            [SINGLE]
            if len(shards) == 1
            else [
                f"model-{i:05d}-of-{len(shards):05d}.safetensors" for i in range(1, len(shards) + 1)
            ]
        )
        for name, part in zip(names, shards, strict=True):
            save_tensors(part, tmp / name, out)
        if len(shards) > 1:
            index = {
                "metadata": {
                    "total_size": sum(t.numel() * t.element_size() for t in tensors.values())
                },
                "weight_map": {
                    key: name for name, part in zip(names, shards, strict=True) for key in part
                },
            }
            atomic_write_text(tmp / INDEX, json.dumps(index, indent=2) + "\n")
        atomic_write_text(tmp / "config.json", json.dumps(config, indent=2) + "\n")
        for name, source in extra_files.items():
            shutil.copyfile(source, tmp / name)
    return out


def save_tensors(tensors: dict[str, torch.Tensor], path: Path, out: Path) -> None:
    """safetensors' save_file into `path`, part of the export `out`; a failure whose cause it
    hides (SafetensorError: "os error 28", the errno lost) named in one line."""
    try:
        safetensors_torch().save_file(tensors, str(path), metadata={"format": "pt"})
    except Exception as err:
        cause = hidden_write_cause(err, path.parent)
        if cause is None:
            raise
        raise ConfigError(f"export: cannot write {out}: {cause}") from None


def shard(tensors: dict[str, torch.Tensor], max_bytes: int) -> list[dict[str, torch.Tensor]]:
    """Tensors in order, a new shard whenever the next one would pass `max_bytes`."""
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, tensor in tensors.items():
        nbytes = tensor.numel() * tensor.element_size()
        if shards[-1] and size + nbytes > max_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = tensor
        size += nbytes
    return shards
