"""Image classification datasets: the encoded images of an ImageFolder packed into a few large
shard files (written by `make-dataset --images DIR`: make_dataset/images.py), read one record at a
time.

A dataset directory:

    index.json                          format "images/1", the class names, the counts, each
                                        shard's size and the sha256 of a few sampled blocks
                                        (checked at every open), the fingerprint
    train-index.npy, val-index.npy      one record per image: offset, length, label, shard
    train-00000.bin, val-00000.bin ...  the images' encoded bytes (JPEG, PNG, WebP, ...) as they
                                        were in the source files, one after the other

Why shards: Lustre handles many small files badly (every open is a metadata operation on a
shared server) and Capstor scratch has an inode quota; a few files of about 128 MB are read at
random offsets instead (`os.pread`, one descriptor per shard and process).

A sample is `(image, label)`: a float32 tensor (3, size, size) normalised with the model's mean
and std (preprocessing.py: ImageNet's, or a timm model's own), and an int64 label. Images are
decoded with PIL and converted to RGB in the loader workers, then transformed with
torchvision.transforms.v2: a random resized crop and a horizontal flip for training, a resize and
a centre crop for evaluation. Their randomness comes
from torch's global generator, which batches.py seeds per sample from (seed, epoch, index).
torchvision (and Pillow) are the optional `[vision]` extra: imported only where needed.
"""

from __future__ import annotations

import hashlib
import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from ..config_keys import ConfigError, first_line, key, optional_import
from .directory import DatasetError, ShardFile, index_fields, open_checked, read_index
from .info import DataInfo, DatasetKind, Splits
from .preprocessing import Preprocessing, eval_transform, resolve, train_transform

FORMAT = "images/1"
SPLITS = ("train", "val")
# one record per image in <split>-index.npy
RECORD = np.dtype([("offset", "<i8"), ("length", "<i8"), ("label", "<i4"), ("shard", "<i4")])


def _side(value: int) -> None:
    """0 (the model's size) or a real side: a crop of under 8 pixels is a typo."""
    if 0 < value < 8:
        raise ConfigError(f"config key 'image_size' must be 0 (the model's) or 8 to 8192: {value}")


@dataclass
class ImageKeys:
    """The images kind's own config keys (`KIND.keys`): `cfg.image_size`."""

    image_size: int = key(
        0,
        "side in pixels of the square crops a model sees (0: the model's: 224, a timm model's "
        "pretrained size)",
        bounds=(0, 8192),
        resume=True,
        check=_side,
    )


def pil_image():
    """PIL's Image module (Pillow comes with torchvision: the [vision] extra)."""
    return optional_import("PIL.Image", "vision", "images datasets", DatasetError)


def decode(data: bytes, where: str):
    """Encoded bytes -> an RGB PIL image; bytes that do not decode are one line naming `where`."""
    image_module = pil_image()
    try:
        with image_module.open(io.BytesIO(data)) as image:
            image.load()
            return image.convert("RGB")
    except (OSError, SyntaxError, ValueError, image_module.DecompressionBombError) as err:
        raise DatasetError(
            f"{where}: no longer decodes as an image ({first_line(err)}): the shard changed "
            "after make-dataset wrote it; write the dataset again"
        ) from None


# --- reading a dataset directory -------------------------------------------------------------


class ImageSplit(Dataset):
    """The images of one split: item i is (transformed image, label) of record i."""

    def __init__(self, records: np.ndarray, shards: list[ShardFile], transform):
        self.records, self.shards, self.transform = records, shards, transform

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, index: int):
        offset, length, label, shard = (int(v) for v in self.records[index])
        data = self.shards[shard].read(offset, length)
        where = f"{self.shards[shard].path}: image {index} (bytes {offset} to {offset + length})"
        image = decode(data, where)
        return self.transform(image), torch.tensor(label, dtype=torch.int64)


def read_image_index(directory: Path) -> dict:
    """index.json of an images dataset, checked: each problem is one DatasetError line."""
    index = read_index(directory, FORMAT)
    with index_fields(directory):
        classes = [str(name) for name in index["classes"]]
        for split in SPLITS:
            str(index[split]["index"]), str(index[split]["sha256"]), int(index["counts"][split])
            for entry in index[split]["shards"]:
                str(entry["name"]), int(entry["bytes"]), int(entry["sampled_blocks"])
                str(entry["sample_sha256"])
        str(index["fingerprint"])
    if len(classes) < 2:
        path = Path(directory) / "index.json"
        raise DatasetError(f"{path}: names {len(classes)} classes; a classifier needs two")
    return index


def read_records(directory: Path, index: dict, split: str) -> np.ndarray:
    """<split>-index.npy, checked against index.json: its hash, its count, and records that lie
    inside their shards with labels of the dataset's classes."""
    path = Path(directory) / index[split]["index"]
    try:
        data = path.read_bytes()
    except OSError as err:
        raise DatasetError(f"{path}: cannot read: {err.strerror or err}") from None
    if "sha256:" + hashlib.sha256(data).hexdigest() != index[split]["sha256"]:
        raise DatasetError(f"{path}: changed since make-dataset wrote it; write the dataset again")
    records = np.load(io.BytesIO(data), allow_pickle=False)
    shards = index[split]["shards"]
    sizes = np.array([int(entry["bytes"]) for entry in shards], dtype=np.int64)
    if records.dtype != RECORD or len(records) != int(index["counts"][split]) or not len(records):
        raise DatasetError(f"{path}: not the {index['counts'][split]} records index.json says")
    inside = (records["shard"] >= 0) & (records["shard"] < len(shards))
    inside &= (records["label"] >= 0) & (records["label"] < len(index["classes"]))
    ends = records["offset"] + records["length"]
    inside &= (records["offset"] >= 0) & (ends <= sizes[np.clip(records["shard"], 0, None)])
    if not inside.all():
        raise DatasetError(f"{path}: record {int(np.argmin(inside))} lies outside its shard")
    return records


def open_images(directory: Path, cfg, spec) -> Splits:
    """The train and val splits of a make-dataset --images directory, every shard checked."""
    directory = Path(directory)
    index = read_image_index(directory)
    datasets = {}
    pre = resolve(cfg, spec)
    for split, transform in zip(SPLITS, (train_transform, eval_transform), strict=True):
        entries = index[split]["shards"]
        shards = [open_checked(directory, e, int(e["bytes"]), np.uint8, "byte") for e in entries]
        records = read_records(directory, index, split)
        datasets[split] = ImageSplit(records, shards, transform(pre))
    classes = tuple(index["classes"])
    return image_splits(datasets["train"], datasets["val"], index["fingerprint"], classes, pre)


def image_splits(train, val, fingerprint: str, classes: tuple, pre: Preprocessing) -> Splits:
    info = DataInfo(
        "images",
        fingerprint,
        num_classes=len(classes),
        class_names=classes,
        details={"image_size": pre.size, "preprocessing": pre.record()},
    )
    return Splits(train=train, val=val, info=info, decodes=True)


# --- dataset=synthetic -----------------------------------------------------------------------


class SyntheticImages(Dataset):
    """`count` images drawn from (seed, first + i) when read, nothing stored: dark noise with a
    bright square whose colour and position depend on the class (the colour survives any crop
    and flip, so a model learns the task far above chance)."""

    def __init__(self, count: int, first: int, classes: int, size: int, seed: int, transform):
        self.count, self.first, self.classes = count, first, classes
        self.size, self.seed, self.transform = size, seed, transform
        palette = np.random.default_rng([seed, classes]).integers(128, 256, (classes, 3))
        self.palette = palette.astype(np.uint8)
        self.grid = int(np.ceil(np.sqrt(classes)))  # class k's square: cell k of a grid

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int):
        number = self.first + index
        label = number % self.classes
        rng = np.random.default_rng([self.seed, number])  # the image; its crop is torch's
        pixels = rng.integers(0, 96, (self.size, self.size, 3), dtype=np.uint8)
        cell = self.size // self.grid
        row, column = divmod(label, self.grid)
        side = max(cell * 3 // 4, 1)
        top, left = row * cell, column * cell
        pixels[top : top + side, left : left + side] = self.palette[label]
        image = pil_image().fromarray(pixels)
        return self.transform(image), torch.tensor(label, dtype=torch.int64)


def synthetic(cfg, spec) -> Splits:
    """synthetic_samples training and eval_samples validation images of num_classes classes at
    image_size, with the augmentation of a dataset directory."""
    pre = resolve(cfg, spec)
    size, classes = pre.size, cfg.num_classes
    train = SyntheticImages(cfg.synthetic_samples, 0, classes, size, cfg.seed, train_transform(pre))
    val = SyntheticImages(
        cfg.eval_samples, cfg.synthetic_samples, classes, size, cfg.seed, eval_transform(pre)
    )
    fingerprint = (
        f"synthetic-images:{cfg.synthetic_samples}+{cfg.eval_samples}:{classes}:{size}:"
        f"seed={cfg.seed}"
    )
    names = tuple(f"class{k}" for k in range(classes))
    return image_splits(train, val, fingerprint, names, pre)


KIND = DatasetKind(
    name="images", format=FORMAT, open=open_images, synthetic=synthetic, keys=ImageKeys
)
