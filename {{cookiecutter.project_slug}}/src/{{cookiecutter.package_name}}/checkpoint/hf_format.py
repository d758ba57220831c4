"""Hugging Face model directories on disk: `config.json` and the weights in safetensors, one file
(`model.safetensors`) or shards with an index (`model.safetensors.index.json`), as
`save_pretrained` writes them. Reading needs the `safetensors` package (the `[hf]` extra), not
transformers. Which names and shapes a model has is its spec's business (`ModelSpec.hf`)."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

from ..config_keys import ConfigError
from ..run.atomic import atomic_write_text, fsync, hidden_write_cause, temp_name

SINGLE, INDEX = "model.safetensors", "model.safetensors.index.json"
MAX_SHARD_BYTES = 5 * 2**30  # transformers' default shard size (5 GB)


def safetensors_module():
    try:
        import safetensors.torch
    except ImportError:
        raise ConfigError(
            "Hugging Face weights need the safetensors package: pip install -e '.[hf]'"
        ) from None
    return safetensors


def is_hf_dir(path: Path) -> bool:
    return (Path(path) / "config.json").is_file()


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
    directory = Path(directory)
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


@dataclass(frozen=True)
class Source:
    """Where one of the model's tensors comes from: tensor `name` of the safetensors `file`
    (stored transposed: GPT-2's Conv1D weights), or a `tensor` already in memory. `shape` is
    the model's tensor; rows past the stored ones are zeros (the GPT pads its vocabulary)."""

    name: str
    shape: tuple[int, ...]
    file: Path | None = None
    transposed: bool = False
    tensor: torch.Tensor | None = None


def _unreadable(path: Path, err: Exception) -> ConfigError:
    first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return ConfigError(f"{path}: cannot read the weights ({first})")


def stored_tensors(directory: Path) -> dict[str, tuple[Path, tuple[int, ...]]]:
    """name -> (file, shape) of every tensor in the directory's safetensors files, from their
    headers: no weights are read. A truncated or foreign file is named here."""
    safetensors = safetensors_module()
    stored = {}
    for path in weight_files(directory):
        try:
            with safetensors.safe_open(str(path), framework="pt") as f:
                for name in f.keys():
                    stored[name] = (path, tuple(f.get_slice(name).get_shape()))
        except Exception as err:  # SafetensorError (truncated, not safetensors), OSError
            raise _unreadable(path, err) from None
    return stored


def read_rows(source: Source, start: int, stop: int) -> torch.Tensor:
    """Rows start..stop of the model's tensor (all of a 0-d one): only these are read from the
    file, which is opened for this read alone (its pages are not kept mapped)."""
    if source.tensor is not None:
        return source.tensor if source.tensor.dim() == 0 else source.tensor[start:stop]
    safetensors = safetensors_module()
    try:
        with safetensors.safe_open(str(source.file), framework="pt") as f:
            stored = f.get_slice(source.name)
            if not source.shape:
                return f.get_tensor(source.name)
            if source.transposed:
                return stored[:, start:stop].t()
            have = stored.get_shape()[0]
            rows = stored[min(start, have) : min(stop, have)]
    except Exception as err:  # the file changed or went away since its header was read
        raise _unreadable(source.file, err) from None
    if rows.shape[0] < stop - start:  # zero rows the file does not hold
        rows = torch.cat([rows, rows.new_zeros(stop - start - rows.shape[0], *rows.shape[1:])])
    return rows


def write_model_dir(
    out: Path,
    config: dict,
    tensors: dict[str, torch.Tensor],
    extra_files: dict[str, Path] = {},  # noqa: B006 - read only: name in out -> file to copy
    max_shard_bytes: int = MAX_SHARD_BYTES,
) -> Path:
    """Write a directory save_pretrained would write, complete or not at all: everything goes to
    a temporary directory next to `out`, which is renamed to `out` at the end."""
    safetensors = safetensors_module()
    out = Path(out)
    if out.exists():
        raise ConfigError(f"{out} exists: export writes a new directory")
    tmp = temp_name(out)
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir(parents=True)
        shards = shard(tensors, max_shard_bytes)
        names = (
            [SINGLE]
            if len(shards) == 1
            else [
                f"model-{i:05d}-of-{len(shards):05d}.safetensors" for i in range(1, len(shards) + 1)
            ]
        )
        for name, part in zip(names, shards, strict=True):
            try:
                safetensors.torch.save_file(part, str(tmp / name), metadata={"format": "pt"})
            except Exception as err:  # SafetensorError: "os error 28", the errno lost
                cause = hidden_write_cause(err, tmp)
                if cause is None:
                    raise
                raise ConfigError(f"export: cannot write {out}: {cause}") from None
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
        for path in tmp.iterdir():
            fsync(path)
        tmp.rename(out)
        fsync(out.parent)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


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
