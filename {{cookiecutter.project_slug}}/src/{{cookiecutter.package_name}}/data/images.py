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
decoded with PIL in the loader workers (its raster decoders only, RASTER_FORMATS: never
Ghostscript for an EPS file), turned upright by their EXIF orientation, then transformed with
torchvision.transforms.v2: for training as augmentation.py's keys say (by default a random
resized crop and a horizontal flip), for evaluation a resize and a centre crop. Their randomness
comes from torch's global generator, which batches.py seeds per sample from (seed, epoch, index).
torchvision (and Pillow) are the optional `[vision]` extra: imported only where needed.

Pixel formats: 8-bit images (JPEG, PNG, WebP, ...; grey, palette, CMYK, alpha) are converted to
RGB, 0 to 255 becoming 0 to 1. Single-channel images of more than 8 bits (16-bit PNG and TIFF,
32-bit integer and float TIFF: microscopy, medical, scientific cameras) are never cut to 8 bits:
their values become a float32 tensor scaled by the dataset's own range, (value - low) / (high -
low), low and high the smallest and largest value over all such images of the dataset (found by
make-dataset, "pixel_range" in index.json, part of the fingerprint), copied to the three
channels. Differences far below 1/256 survive, nothing is clipped. Colour images of more than 8
bits per channel, which Pillow would read as 8 bits, and non-finite values are refused by
make-dataset, one line naming the file.
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
from .augmentation import AugmentationKeys, batch_mix, described, train_transform
from .directory import (
    INDEX_FILE,
    DatasetError,
    ShardFile,
    check_fingerprint,
    index_fields,
    open_checked,
    read_index,
    read_json,
)
from .info import DataInfo, DatasetKind, Splits
from .preprocessing import Preprocessing, eval_transform, export_fields, recorded, resolve

FORMAT = "images/1"
SPLITS = ("train", "val")
# one record per image in <split>-index.npy
RECORD = np.dtype([("offset", "<i8"), ("length", "<i8"), ("label", "<i4"), ("shard", "<i4")])
# Files taken from an ImageFolder, by extension (torchvision's ImageFolder: IMG_EXTENSIONS), and
# the PIL decoders allowed to read them (JPEG's also reads the multi-picture JPEGs of phones).
# Other plug-ins (EPS through Ghostscript, ...) never see a file: Image.open(..., formats=).
IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
RASTER_FORMATS = ("JPEG", "PNG", "PPM", "BMP", "TIFF", "WEBP")
# PIL's modes of one channel of more than 8 bits: their values are scaled by the dataset's range
HIGH_BIT_MODES = ("I", "I;16", "I;16L", "I;16B", "I;16N", "F")
EXIF_ORIENTATION = 0x0112


def _side(value: int) -> None:
    """0 (the model's size) or a real side: a crop of under 8 pixels is a typo."""
    if 0 < value < 8:
        raise ConfigError(f"config key 'image_size' must be 0 (the model's) or 8 to 8192: {value}")


@dataclass
class ImageKeys(AugmentationKeys):
    """The images kind's own config keys (`KIND.keys`): `cfg.image_size` and the augmentation's
    (augmentation.py)."""

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


def open_image(source):
    """PIL's Image.open of a path or file object, with the raster decoders only."""
    image_module = pil_image()
    image_module.init()  # registers the plug-ins (TIFF, WebP); a no-op after the first call
    return image_module.open(source, formats=RASTER_FORMATS)


def upright(image):
    """The image turned as its EXIF orientation says (a phone photo taken sideways)."""
    if image.getexif().get(EXIF_ORIENTATION, 1) == 1:
        return image
    from PIL import ImageOps

    return ImageOps.exif_transpose(image)


def high_bit_values(image) -> np.ndarray | None:
    """The float64 values of an image of one channel of more than 8 bits, else None."""
    return np.asarray(image, dtype=np.float64) if image.mode in HIGH_BIT_MODES else None


def scaled(values: np.ndarray, pixel_range) -> torch.Tensor:
    """(3, H, W) float32: values mapped by the dataset's range (low -> 0, high -> 1)."""
    low, high = pixel_range
    values = (values - low) / (high - low if high > low else 1.0)
    return torch.from_numpy(values.astype(np.float32)).expand(3, *values.shape).contiguous()


def decode(data: bytes, where: str, pixel_range=None):
    """Encoded bytes -> an upright RGB PIL image, or for one channel of more than 8 bits a (3, H,
    W) float32 tensor scaled by the dataset's `pixel_range`; bytes that do not decode are one
    line naming `where`."""
    image_module = pil_image()
    try:
        with open_image(io.BytesIO(data)) as image:
            image.load()
            image = upright(image)
            values = high_bit_values(image)
            if values is None:
                return image.convert("RGB")
    except (OSError, SyntaxError, ValueError, image_module.DecompressionBombError) as err:
        raise DatasetError(
            f"{where}: no longer decodes as an image ({first_line(err)}): the shard changed "
            "after make-dataset wrote it; write the dataset again"
        ) from None
    if pixel_range is None:
        raise DatasetError(f"{where}: a {image.mode} image, but index.json has no pixel_range")
    return scaled(values, pixel_range)


# --- reading a dataset directory -------------------------------------------------------------


class ImageSplit(Dataset):
    """The images of one split: item i is (transformed image, label) of record i."""

    def __init__(self, records: np.ndarray, shards: list[ShardFile], transform, pixel_range=None):
        self.records, self.shards, self.transform = records, shards, transform
        self.pixel_range = pixel_range  # of images of more than 8 bits (index.json's)

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, index: int):
        offset, length, label, shard = (int(v) for v in self.records[index])
        data = self.shards[shard].read(offset, length)
        where = f"{self.shards[shard].path}: image {index} (bytes {offset} to {offset + length})"
        image = decode(data, where, self.pixel_range)
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
        if "data_sha256" not in index:  # written before class names were checked
            raise DatasetError(
                f"{Path(directory) / 'index.json'}: written by an earlier make-dataset (no "
                "data_sha256, so its class names cannot be checked); write the dataset again"
            )
        parts = fingerprint_parts(index["classes"], index["data_sha256"], index.get("pixel_range"))
    if len(classes) < 2:
        path = Path(directory) / "index.json"
        raise DatasetError(f"{path}: names {len(classes)} classes; a classifier needs two")
    check_fingerprint(directory, index, *parts)  # the class names are data
    return index


def fingerprint_parts(classes: list, digests: list, pixel_range=None) -> list:
    """What an images dataset's fingerprint is made of: the format, the class names in label
    order, each split's digest of its labels and bytes, and the range that scales its images of
    more than 8 bits (checked: two finite numbers, low <= high)."""
    if pixel_range is None:
        return [FORMAT, classes, digests]
    low, high = (float(v) for v in pixel_range)
    if not (np.isfinite([low, high]).all() and low <= high and len(pixel_range) == 2):
        raise ValueError(f"pixel_range {pixel_range!r} is not [low, high]")
    return [FORMAT, classes, digests, pixel_range]


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
    try:
        records = np.load(io.BytesIO(data), allow_pickle=False)
    except (ValueError, OSError, EOFError) as err:  # not a .npy, or objects it would unpickle
        raise DatasetError(f"{path}: not an array of records ({first_line(err)})") from None
    shards = index[split]["shards"]
    sizes = np.array([int(entry["bytes"]) for entry in shards], dtype=np.int64)
    count = int(index["counts"][split])
    if not isinstance(records, np.ndarray) or records.dtype != RECORD or records.ndim != 1:
        raise DatasetError(f"{path}: not the records of make-dataset --images ({RECORD.descr})")
    if len(records) != count or not len(records) or not shards:
        raise DatasetError(f"{path}: {len(records)} records, not the {count} index.json says")
    if (empty := records["length"] < 1).any():
        raise DatasetError(f"{path}: record {int(np.argmax(empty))} has a length of no bytes")
    inside = (records["shard"] >= 0) & (records["shard"] < len(shards))
    inside &= (records["label"] >= 0) & (records["label"] < len(index["classes"]))
    room = sizes[np.clip(records["shard"], 0, len(shards) - 1)] - records["offset"]
    # the bytes end inside the shard (written so that no sum overflows)
    inside &= (records["offset"] >= 0) & (records["length"] <= room)
    if not inside.all():
        raise DatasetError(f"{path}: record {int(np.argmin(inside))} lies outside its shard")
    return records


def open_images(directory: Path, cfg, spec) -> Splits:
    """The train and val splits of a make-dataset --images directory, every shard checked."""
    directory = Path(directory)
    index = read_image_index(directory)
    datasets = {}
    pre = resolve(cfg, spec)
    transforms = {"train": train_transform(pre, cfg), "val": eval_transform(pre)}
    for split in SPLITS:
        entries = index[split]["shards"]
        shards = [open_checked(directory, e, int(e["bytes"]), np.uint8, "byte") for e in entries]
        records = read_records(directory, index, split)
        pixel_range = index.get("pixel_range")
        datasets[split] = ImageSplit(records, shards, transforms[split], pixel_range)
    classes = tuple(index["classes"])
    train, val = datasets["train"], datasets["val"]
    return image_splits(train, val, index["fingerprint"], classes, pre, cfg)


def image_splits(train, val, fingerprint: str, classes: tuple, pre: Preprocessing, cfg) -> Splits:
    """The Splits of an images dataset; the training split mixes its batches (`mix`: mixup,
    cutmix, label smoothing) where the config says so (batches.py applies it)."""
    train.mix = batch_mix(cfg, len(classes))
    info = DataInfo(
        "images",
        fingerprint,
        num_classes=len(classes),
        class_names=classes,
        details={"image_size": pre.size, "preprocessing": pre.record()},
    )
    return Splits(train=train, val=val, info=info, decodes=True, notes=described(pre, cfg))


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
    augmented = train_transform(pre, cfg)
    train = SyntheticImages(cfg.synthetic_samples, 0, classes, size, cfg.seed, augmented)
    val = SyntheticImages(
        cfg.eval_samples, cfg.synthetic_samples, classes, size, cfg.seed, eval_transform(pre)
    )
    fingerprint = (
        f"synthetic-images:{cfg.synthetic_samples}+{cfg.eval_samples}:{classes}:{size}:"
        f"seed={cfg.seed}"
    )
    names = tuple(f"class{k}" for k in range(classes))
    return image_splits(train, val, fingerprint, names, pre, cfg)


class PackedImagesPlainly(Dataset):
    """The training images of a make-dataset --images directory: item i opens its shard, reads
    record i (offset, length) and decodes it with PIL; (transformed image, int64 label)."""

    def __init__(self, directory: Path, pre: Preprocessing, cfg):
        index = read_json(directory / INDEX_FILE)
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


def plain_training_set(directory: Path, details: dict, cfg) -> tuple[Dataset, str]:
    """benchmark's plain loop reads the training images as torchvision's reference does."""
    dataset = PackedImagesPlainly(directory, recorded(details), cfg)
    return dataset, "each image's shard opened and read at its offset, decoded with PIL"


KIND = DatasetKind(
    name="images",
    format=FORMAT,
    open=open_images,
    synthetic=synthetic,
    keys=ImageKeys,
    export_fields=export_fields,
    plain_training_set=plain_training_set,
)
