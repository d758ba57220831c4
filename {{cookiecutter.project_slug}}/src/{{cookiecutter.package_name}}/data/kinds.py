"""The kinds of dataset a run can read: one module per kind in this folder, each ending in a
`KIND` (an info.DatasetKind). To add yours, write data/<yours>.py (docs/your-data.md walks through
one) and add its module name to KIND_MODULES: one line. Nothing else in the package knows a
dataset kind by name.

A kind opens the train and validation splits of a `dataset=` directory (the one named by its
index.json's `format`) as map-style `torch.utils.data.Dataset`s: `len(split)` samples, `split[i]`
one sample, which may be anything `collate` batches (a tensor, a tuple, a dict of tensors of
varying shapes). The loop draws the samples (batches.py): their order is a permutation of the
indices per epoch, a function of (seed, epoch); each sample is read under a seed of its own,
(seed, epoch, index), so its random augmentation is the same whichever loader process reads it
and however many ranks share the stream.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .. import distributed
from ..config_keys import ConfigError, load_registry
from .directory import INDEX_FILE, DatasetError, file_sha256, json_error, read_json
from .info import DatasetKind, Splits

KIND_MODULES = (
    {%- if cookiecutter.workload in ["all", "language"] %}
    "tokens",  # token shards for language models (make-dataset --stdlib/--text/--tokens/--hf)
    {%- endif %}
    "arrays",  # feature vectors and labels for the classifier example (make-dataset --x/--y)
    {%- if cookiecutter.workload in ["all", "images"] %}
    "images",  # encoded images packed into shards for vision models (make-dataset --images)
    {%- endif %}
    {%- if cookiecutter.workload in ["all", "language"] %}
    "chat",  # conversations with a loss mask on the answers, packed (make-dataset --chat)
    {%- endif %}
)


KINDS: dict[str, DatasetKind] = load_registry(__package__, KIND_MODULES, "KIND")


def kind_of_directory(directory: Path) -> DatasetKind:
    """The kind whose format the directory's index.json names."""
    path = Path(directory) / INDEX_FILE
    try:
        found = read_json(path).get("format")
    except FileNotFoundError:
        if not Path(directory).is_dir():
            raise ConfigError(f"dataset {directory}: no such directory") from None
        raise ConfigError(
            f"dataset {directory}: no {INDEX_FILE}; dataset directories are written by "
            f"`python -m {__package__.split('.')[0]} make-dataset ... --out DIR`"
        ) from None
    except (OSError, ValueError, AttributeError, RecursionError) as err:
        raise ConfigError(
            f"dataset {directory}: {INDEX_FILE} is unreadable ({json_error(err)})"
        ) from None
    for kind in KINDS.values():
        if kind.format == found:
            return kind
    formats = ", ".join(f"{k.format} ({k.name})" for k in KINDS.values())
    raise ConfigError(f"dataset {directory}: unknown format {found!r}; known: {formats}")


def open_splits(cfg, spec) -> Splits:
    """The dataset named by `cfg.dataset`: a make-dataset directory of a kind the run's model
    reads (`spec.reads`: the models.spec.ModelSpec's), or `synthetic`: the first kind it reads,
    made in memory."""
    reads = spec.reads
    if cfg.dataset == "synthetic":
        kind = KINDS[reads[0]]
        if kind.synthetic is None:
            raise ConfigError(f"dataset=synthetic: {kind.name} datasets have no synthetic form")
        return kind.synthetic(cfg, spec)
    kind = kind_of_directory(Path(cfg.dataset))
    if kind.name not in reads:
        raise ConfigError(
            f"dataset {cfg.dataset} holds {kind.name} data, but model={cfg.model} reads "
            f"{' or '.join(reads)} datasets"
        )
    return kind.open(Path(cfg.dataset), cfg, spec)


def verify_files(source: Splits, rank: int, world: int) -> None:
    """Each rank hashes its share of the dataset's files in full (every `world`-th, from the
    `rank`-th; several at once, a thread per core the rank may use: hashlib hashes outside the
    GIL) against the sha256 make-dataset recorded: a change anywhere is found, where the sampled
    blocks checked at every open see about 1 MiB. A file any rank found changed stops every
    rank with the same line, so none waits in a collective."""
    share = list(source.files.items())[rank::world]
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    error = None
    try:
        with ThreadPoolExecutor(max(1, min(len(share), cores or 1))) as pool:
            found = list(pool.map(file_sha256, [path for path, _ in share]))
        changed = [path for (path, digest), now in zip(share, found, strict=True) if now != digest]
        if changed:
            error = (
                f"{changed[0]}: changed since make-dataset wrote it (its sha256 differs from "
                "index.json's), so the dataset's fingerprint no longer describes its contents; "
                "write the dataset again"
            )
    except OSError as err:
        error = f"{err.filename}: cannot read: {err.strerror or err}"
    found_by_any = [e for e in distributed.all_gather_object(error) if e]
    if found_by_any:
        raise DatasetError(found_by_any[0])
