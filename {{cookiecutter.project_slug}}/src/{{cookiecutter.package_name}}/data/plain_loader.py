"""The input of the plainly written loops that `benchmark` compares the package with.

Decoded samples: torchvision's reference train.py's way, a map-style Dataset read through
`DataLoader(num_workers=..., sampler=DistributedSampler(...), pin_memory=<on GPU>)`, epoch after
epoch (`sampler.set_epoch`), with none of the package's batching or per-sample seeding.

A kind may read its directory plainly for this loop (its `plain_training_set`): the images kind
(data/images.py's PackedImagesPlainly) opens the shard for each image, reads the record at its
offset and decodes it with PIL, as an ImageFolder opens each file (not the package's reader),
then applies the same torchvision transforms as in training; the loader's collate_fn mixes
batches (mixup, cutmix, label smoothing, where set), as the reference does. Any other decoded
dataset (`dataset=synthetic` images, a kind of yours) is its own training split, read as it is.
The inline loop's token windows (nanoGPT's get_batch) are the tokens kind's `inline_windows`.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from torch.utils.data import DataLoader, Dataset, DistributedSampler

from .batches import PREFETCH_FACTOR  # the same depth as the package's loader
from .directory import DatasetError
from .info import Splits
from .kinds import KINDS


def plain_training_set(source: Splits, cfg) -> tuple[Dataset, str]:
    """(the training Dataset of the plain loop, what it is in a few words): the kind's
    `plain_training_set` of a dataset directory (the images kind's: as an ImageFolder is read),
    else the kind's own training split."""
    kind = KINDS.get(source.info.kind)
    if kind is not None and kind.plain_training_set is not None and cfg.dataset != "synthetic":
        return kind.plain_training_set(Path(cfg.dataset), source.info.details, cfg)
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
