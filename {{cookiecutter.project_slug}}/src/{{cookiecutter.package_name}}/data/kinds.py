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

import json
from pathlib import Path

from ..config_keys import ConfigError, load_registry
from .info import INDEX_FILE, DatasetKind, Splits

KIND_MODULES = (
    "tokens",  # token shards for language models (make-dataset --stdlib/--text/--tokens/--hf)
    "arrays",  # feature vectors and labels for the classifier example (make-dataset --x/--y)
    "images",  # encoded images packed into shards for vision models (make-dataset --images)
    "chat",  # conversations with a loss mask on the answers, packed (make-dataset --chat)
)


KINDS: dict[str, DatasetKind] = load_registry(__package__, KIND_MODULES, "KIND")


def kind_of_directory(directory: Path) -> DatasetKind:
    """The kind whose format the directory's index.json names."""
    path = Path(directory) / INDEX_FILE
    try:
        found = json.loads(path.read_text()).get("format")
    except FileNotFoundError:
        raise ConfigError(
            f"dataset {directory}: no {INDEX_FILE}; dataset directories are written by "
            f"`python -m {__package__.split('.')[0]} make-dataset ... --out DIR`"
        ) from None
    except (OSError, ValueError, AttributeError) as err:
        raise ConfigError(f"dataset {directory}: {INDEX_FILE} is unreadable ({err})") from None
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
