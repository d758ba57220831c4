"""The input of the plainly written loops that `benchmark` compares the package with.

Token windows: nanoGPT's get_batch (`read_windows`), the shards memory-mapped at every batch.

Decoded samples: torchvision's reference train.py's way, a map-style Dataset read through
`DataLoader(num_workers=..., sampler=DistributedSampler(...), pin_memory=<on GPU>)`, epoch after
epoch (`sampler.set_epoch`), with none of the package's batching or per-sample seeding.

For a directory written by `make-dataset --images` the Dataset is written plainly here too: it
opens the shard for each image, reads the record at its offset and decodes it with PIL, as an
ImageFolder opens each file (not the package's reader), then applies the same torchvision
transforms as the images kind (data/augmentation.py: by default a random resized crop, a flip,
the normalisation) and mixes batches in the loader's collate_fn (mixup, cutmix, label smoothing,
where set), as the reference does. Any other decoded
dataset (`dataset=synthetic` images, a kind of yours) is its own training split, read as it is.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from .augmentation import train_transform
from .batches import PREFETCH_FACTOR  # the same depth as the package's loader
from .directory import INDEX_FILE, DatasetError, ShardFile
from .images import open_image
from .info import Splits
from .preprocessing import Preprocessing, recorded
from .tokens import TokenDataset, synthetic_tokens


class PackedImagesPlainly(Dataset):
    """The training images of a make-dataset --images directory: item i opens its shard, reads
    record i (offset, length) and decodes it with PIL; (transformed image, int64 label)."""

    def __init__(self, directory: Path, pre: Preprocessing, cfg):
        index = json.loads((directory / INDEX_FILE).read_text())
        self.records = np.load(directory / index["train"]["index"])
        self.shards = [directory / entry["name"] for entry in index["train"]["shards"]]
        self.transform = train_transform(pre, cfg)

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, index: int):
        offset, length, label, shard = (int(v) for v in self.records[index])
        with open(self.shards[shard], "rb") as file:
            file.seek(offset)
            data = file.read(length)
        image = open_image(io.BytesIO(data)).convert("RGB")  # raster decoders only
        return self.transform(image), torch.tensor(label, dtype=torch.int64)


def plain_training_set(source: Splits, cfg) -> tuple[Dataset, str]:
    """(the training Dataset of the plain loop, what it is in a few words)."""
    if source.info.kind == "images" and cfg.dataset != "synthetic":
        dataset = PackedImagesPlainly(Path(cfg.dataset), recorded(source.info.details), cfg)
        return dataset, "each image's shard opened and read at its offset, decoded with PIL"
    return source.train, f"the {source.info.kind} kind's own training split"


class MixedCollate:
    """A collate followed by a batch mix (images: data/augmentation.py's BatchMix)."""

    def __init__(self, collate, mix):
        self.collate, self.mix = collate, mix

    def __call__(self, samples):
        return self.mix(self.collate(samples))


def plain_collate(source: Splits):
    """The plain loop's collate_fn: the kind's, then its training split's `mix` if it has one."""
    mix = getattr(source.train, "mix", None)
    return source.collate if mix is None else MixedCollate(source.collate, mix)


def plain_batches(
    dataset: Dataset, collate, cfg, rank: int, world: int, workers: int, pin: bool
) -> Iterator:
    """Endless batches of `dataset` for this rank: a DistributedSampler's shuffle per epoch
    (every rank a distinct share), `workers` loader processes kept across epochs (so an epoch's
    start costs nothing the package's single loader does not pay), full batches only."""
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, seed=cfg.seed)
    loader = DataLoader(
        dataset,
        batch_size=cfg.batch_size,
        sampler=sampler,
        num_workers=workers,
        collate_fn=collate,
        pin_memory=pin,
        drop_last=True,
        persistent_workers=workers > 0,
        prefetch_factor=PREFETCH_FACTOR if workers > 0 else None,
    )
    if len(loader) == 0:
        raise DatasetError(
            f"the training split has {len(dataset)} samples, fewer than batch_size x ranks "
            f"({cfg.batch_size} x {world})"
        )
    epoch = 0
    while True:
        sampler.set_epoch(epoch)
        yield from loader
        epoch += 1


def read_windows(
    dataset: TokenDataset, seed: int, step: int, micro: int, rank: int, batch_size: int, block: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """nanoGPT's get_batch over the package's windows of (seed, step, micro, rank): the shards
    memory-mapped again at every batch (as nanoGPT does, against a memory leak), each window of
    block + 1 tokens sliced from its shard, converted to int64 and stacked."""
    shards = [
        np.memmap(s.path, dtype=s.dtype, mode="r") if isinstance(s, ShardFile) else s
        for s in dataset.train
    ]
    ends = np.cumsum([len(s) for s in shards])
    rows = []
    for start in dataset.window_starts(seed, step, micro, rank, batch_size, block).tolist():
        shard = int(np.searchsorted(ends, start, side="right"))
        local = start - int(ends[shard]) + len(shards[shard])
        rows.append(shards[shard][local : local + block + 1])
    x = torch.stack([torch.from_numpy(row[:-1].astype(np.int64)) for row in rows])
    y = torch.stack([torch.from_numpy(row[1:].astype(np.int64)) for row in rows])
    return x, y


def token_dataset(cfg) -> TokenDataset:
    """The run's token dataset, opened again for the inline loop."""
    if cfg.dataset == "synthetic":
        return synthetic_tokens(cfg)
    return TokenDataset.open(Path(cfg.dataset))
