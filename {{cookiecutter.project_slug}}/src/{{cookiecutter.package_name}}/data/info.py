"""What the model is told about its data (`DataInfo`), what a dataset kind is (`DatasetKind`,
the `Splits` it opens), and the one form of a language model's batch (`token_batch`): a leaf
module, so the models and the kinds import it without importing the data pipeline."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset, default_collate

from ..config_keys import ConfigError

IGNORE_INDEX = -100  # a target not scored: cross entropy's ignore_index (torch's default)


def token_batch(
    inputs: torch.Tensor, targets: torch.Tensor, positions: torch.Tensor | None = None
) -> dict[str, torch.Tensor]:
    """A language model's batch, the one form every kind of token data gives (training windows,
    validation windows, packed conversations): `inputs` and `targets` (batch, time) int64, the
    targets IGNORE_INDEX where nothing is scored; windows that pack several documents add their
    `positions`, restarting at 0 with each document (models.spec.next_token_logits)."""
    batch = {"inputs": inputs, "targets": targets}
    if positions is not None:
        batch["positions"] = positions
    return batch


@dataclass(frozen=True)
class DataInfo:
    """What the model needs to know about the data, and the fingerprint a resume checks."""

    kind: str  # the dataset kind's name: "tokens", "arrays", ... (data/kinds.py)
    fingerprint: str
    num_features: int = 0  # arrays: the length of a feature vector
    num_classes: int = 0  # classifiers
    vocab_size: int = 0  # language models
    class_names: tuple[str, ...] = ()  # classifiers whose dataset names its classes
    details: dict = field(default_factory=dict)  # anything else a kind of yours tells its model


def saved_data_info(values: dict, run_dir) -> DataInfo:
    """The dataset's info a run was built with (train.py records it in every checkpoint)."""
    if not isinstance(values.get("data_info"), dict):
        raise ConfigError(f"{run_dir}: its checkpoint records no data_info (not this package's)")
    return DataInfo(**values["data_info"])


@dataclass
class Splits:
    """A dataset opened for a run.

    train, val: map-style datasets (`len`, `[index]` -> one sample).
    info: what the model is told about the data (classes, vocabulary, shapes) and the fingerprint
        a resume checks.
    collate: a list of samples -> one batch (default: torch's default_collate, which stacks
        tensors of equal shapes; samples of varying shapes need their own).
    decodes: reading a sample costs CPU (decoding, augmentation): num_workers then defaults to
        every CPU Slurm gives the rank.
    A split may have a method `gather(indices)` that returns a whole batch at once (in-memory
    arrays with no randomness: it replaces the per-sample reads and collate), and the train
    split a `mix(batch)` applied to each collated micro-batch under its own seed (images:
    mixup, cutmix, label smoothing; batches.py). The val split may
    say what `evaluate` reports of it: `scoreable` (what the task counts in the whole split,
    e.g. the tokens that are targets; default: its samples), `unit` (what its samples are,
    e.g. "windows"; default "samples") and `scheme` (how the split is cut, in words).
    draw: optional, for a kind that draws its own training batches as a function of
        (seed, step, micro-step, rank, batch_size) instead of the epoch stream (token windows at
        random positions); `train` is then None. `draw_many(seed, keys, rank, batch_size)`,
        optional beside it: the batches of several (step, micro) keys at once, equal to `draw`'s
        (the training process reads its input ahead in such calls when it has no loader
        processes).
    nbytes, to: an in-memory dataset's size, and how it moves to the GPU (data_on_gpu).
    files: the dataset's files by path, each with the sha256 make-dataset recorded for it: a
        training start reads them in full, every rank its share (kinds.verify_files).
    notes: what a training run's start says of the data besides its counts (images: the
        augmentation).
    """

    train: Dataset | None
    val: Dataset | None
    info: DataInfo
    collate: Callable[[list], Any] = default_collate
    decodes: bool = False
    draw: Callable[[int, int, int, int, int], Any] | None = None
    draw_many: Callable[[int, list[tuple[int, int]], int, int], list] | None = None
    nbytes: int = 0
    to: Callable[[Any], None] | None = None
    files: dict[Path, str] = field(default_factory=dict)
    notes: str = ""


@dataclass(frozen=True)
class DatasetKind:
    """name: what a model lists in its spec's `reads` (e.g. "tokens", "images").
    format: the `format` of the index.json of the directories it reads (e.g. "tokens/1").
    open(directory, cfg, spec): the directory's Splits; problems are one-line DatasetErrors.
        `spec` is the run's models.spec.ModelSpec, for what a kind asks the model (the context
        length of token windows).
    synthetic(cfg, spec): Splits made in memory for `dataset=synthetic`, or None: none.
    keys: the kind's own config keys, a dataclass whose fields are `key(...)`s, as a model's
        (config_keys.py); the registry joins them to a run's config, where the kind reads them
        by name (`cfg.image_size`). None: it reads general keys only.
    synthetic_keys: the config keys (its own or general) that only its synthetic data reads,
        and a model whose spec lists them in `reads_keys` (the tokens kind: vocab_size); a value
        set for one that nothing in the run reads is dropped with a line.
    source_ids(checkpoint, theirs, ours, cfg): init_from a run directory's `checkpoint`: whether
        its weights read this run's ids as their own (`theirs`: the details of the DataInfo that
        checkpoint records; `ours`: this run's). A ConfigError says why not (the tokens kind:
        another tokenizer made them, the same id would be another word); else what the log of
        the loaded source adds ("" when the ids are the same or nothing says). None: no ids.
    export_fields(details): what an exported file's metadata needs to use the model on data of
        this kind without this package (an image model's evaluation transform), as strings
        from a DataInfo's details. None: nothing.
    plain_training_set(directory, details, cfg): benchmark's plain loop (data/plain_loader.py):
        (the training split read as a plain reference loop reads it, those words); None: the
        kind's own training split.
    inline_windows(cfg): benchmark's inline loop: read(seed, step, micro, rank, batch_size,
        block) -> (x, y), the run's windows read inline (nanoGPT's get_batch); None: no such loop.
    as_text(directory): `evaluate --print-split`: the directory's validation split as text, in
        pieces (decoded by the tokenizer that made its ids); None: its data is not text.
    """

    name: str
    format: str
    open: Callable[[Path, Any, Any], Splits]
    synthetic: Callable[[Any, Any], Splits] | None = None
    keys: type | None = None
    synthetic_keys: tuple[str, ...] = ()
    source_ids: Callable[[Path, dict, dict, Any], str] | None = None
    export_fields: Callable[[dict], dict[str, str]] | None = None
    plain_training_set: Callable[[Path, dict, Any], tuple[Any, str]] | None = None
    inline_windows: Callable[[Any], Callable[..., tuple[Any, Any]]] | None = None
    as_text: Callable[[Path], Iterator[str]] | None = None
