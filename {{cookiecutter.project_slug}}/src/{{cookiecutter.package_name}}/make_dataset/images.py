"""`make-dataset --images DIR --out OUT [--val DIR2 | --val-fraction F] [--shard-mb MB]`: an
ImageFolder (`DIR/<class>/<image>`, classes = the sorted folder names) packed into the shards
of an images dataset (the format, and its reader: data/images.py).

Files are taken by their extension, as torchvision's ImageFolder takes them (IMG_EXTENSIONS:
.jpg, .png, .tif, .webp, ...); others (README.txt, Thumbs.db) and hidden ones (.DS_Store) are
skipped and counted in the summary. Every image is decoded once first (image_check.py: PIL's
raster decoders, in a process pool when there are many, progress on stderr), so a file that does
not decode is one line naming it before anything is written; so is one whose pixels PIL would
read wrongly (colour of more than 8 bits per channel). Single-channel images of more than 8 bits
keep their range: the smallest and largest value over them go into index.json ("pixel_range"),
which the reader scales them by (data/images.py). The encoded bytes are then
copied unchanged, in the order of (class, file name), into shards of about --shard-mb each: the
same input gives the same bytes. Everything is written into a hidden temporary directory next to
OUT and renamed to OUT at the end (data/directory.py, `written`): an error, Ctrl-C or SIGTERM
leaves nothing that looks like a dataset.
"""

from __future__ import annotations

import hashlib
import io
import os
from pathlib import Path

import numpy as np

from ..config_keys import number_option
from ..data.directory import (
    DatasetError,
    check_out,
    content_fingerprint,
    record_samples,
    written,
)
from ..data.images import (
    FORMAT,
    HIGH_BIT_MODES,
    IMG_EXTENSIONS,
    RECORD,
    SPLITS,
    fingerprint_parts,
)
from .image_check import Progress, check_images
from .sources import DatasetSource, default_workers

DEFAULT_VAL_FRACTION = 0.05
DEFAULT_SHARD_MB = 128


# --- the ImageFolder -------------------------------------------------------------------------


def hidden(name: str) -> bool:
    return name.startswith(".")  # .DS_Store, ._name (macOS), .ipynb_checkpoints


def image_folder(root: Path, skipped: list | None = None) -> tuple[list[str], list]:
    """(class names, (file, label) of every image): the class folders of `root` in sorted
    order, each one's image files (in subfolders too) sorted by their path. Hidden files and
    files that are not images by their extension are appended to `skipped`."""
    skipped = [] if skipped is None else skipped
    if not root.exists():
        raise DatasetError(f"{root}: no such directory")
    if not root.is_dir():
        raise DatasetError(f"{root}: not a directory (an ImageFolder: {root}/<class>/<image>)")
    classes = sorted(p.name for p in root.iterdir() if p.is_dir() and not hidden(p.name))
    if len(classes) < 2:
        found = f"only one class folder, {classes[0]!r}" if classes else "no class folders"
        raise DatasetError(
            f"{root}: {found}; a classifier needs at least two ({root}/<class>/<image>)"
        )
    files = []
    for label, name in enumerate(classes):
        folder = root / name
        found = []
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):
            inside = path.relative_to(folder)
            if any(map(hidden, inside.parts)) or path.suffix.lower() not in IMG_EXTENSIONS:
                skipped.append(path.relative_to(root.parent))
            else:
                found.append(inside.as_posix())
        found.sort()
        if not found:
            raise DatasetError(f"{folder}: empty class folder (no images)")
        files += [(folder / path, label) for path in found]
    return classes, files


def hold_out(
    files: list[tuple[Path, int]], classes: list[str], fraction: float
) -> tuple[list, list]:
    """(train, val): `fraction` of each class's images (at least one, and never all) for
    validation, chosen by the sha256 of their names: the same files for the same folder, and
    adding images to a class moves few of the others."""
    by_class: list[list[tuple[Path, int]]] = [[] for _ in classes]
    for item in files:
        by_class[item[1]].append(item)
    train, val = [], []
    for mine in by_class:
        count = min(max(1, round(len(mine) * fraction)), len(mine) - 1)
        rank = sorted(mine, key=lambda item: hashlib.sha256(item[0].name.encode()).digest())
        chosen = {path for path, _ in rank[:count]}
        train += [item for item in mine if item[0] not in chosen]
        val += [item for item in mine if item[0] in chosen]
    return train, val


# --- writing ---------------------------------------------------------------------------------


def write_split(
    tmp: Path, split: str, files: list[tuple[Path, int]], shard_bytes: int, progress=None
) -> tuple[dict, str]:
    """The split's shards and record array in `tmp`: (its index.json entry, the sha256 of its
    bytes for the fingerprint). A new shard starts where the next image would pass shard_bytes."""
    records = np.zeros(len(files), dtype=RECORD)
    shards: list[dict] = []
    digest = hashlib.sha256()
    handle = None
    try:
        for row, (path, label) in enumerate(files):
            data = path.read_bytes()
            size = shards[-1]["bytes"] if shards else 0
            if handle is None or (size and size + len(data) > shard_bytes):  # a large image: alone
                if handle is not None:
                    close_shard(handle)
                shards.append({"name": f"{split}-{len(shards):05d}.bin", "bytes": 0, "images": 0})
                handle = open(tmp / shards[-1]["name"], "wb")
            handle.write(data)
            records[row] = (shards[-1]["bytes"], len(data), label, len(shards) - 1)
            shards[-1]["bytes"] += len(data)
            shards[-1]["images"] += 1
            digest.update(f"{label} {len(data)}\n".encode())
            digest.update(data)
            if progress is not None:
                progress.update()
    finally:
        if handle is not None:
            close_shard(handle)
    buffer = io.BytesIO()
    np.save(buffer, records, allow_pickle=False)
    name = f"{split}-index.npy"
    (tmp / name).write_bytes(buffer.getvalue())
    sha256 = "sha256:" + hashlib.sha256(buffer.getvalue()).hexdigest()
    return {"index": name, "sha256": sha256, "shards": shards}, digest.hexdigest()


def close_shard(handle) -> None:
    handle.flush()
    os.fsync(handle.fileno())
    handle.close()


def write_image_dataset(
    images: Path,
    out: Path,
    val: Path | None = None,
    val_fraction: float | None = None,
    shard_mb: float = DEFAULT_SHARD_MB,
    workers: int | None = None,
) -> dict:
    """Pack the ImageFolder `images` (validation: the ImageFolder `val`, or `val_fraction` of
    each class, default 0.05) into an images dataset at `out`. Returns its index."""
    images, out = Path(images), Path(out)
    if val is not None and val_fraction is not None:
        raise DatasetError("make-dataset --images: give --val DIR or --val-fraction F, not both")
    fraction = DEFAULT_VAL_FRACTION if val_fraction is None else val_fraction
    if not 0.0 < fraction < 1.0:
        raise DatasetError(f"--val-fraction must be between 0 and 1, got {fraction}")
    if not shard_mb > 0:
        raise DatasetError(f"--shard-mb must be positive, got {shard_mb}")
    skipped: list[Path] = []
    classes, train = image_folder(images, skipped)
    if val is None:
        train, held = hold_out(train, classes, fraction)
        validation = f"{fraction:g} of each class held out (at least one image)"
    else:
        val_classes, held = image_folder(Path(val), skipped)
        if val_classes != classes:
            only = sorted(set(classes) ^ set(val_classes))
            raise DatasetError(
                f"{val}: its classes differ from {images}'s ({', '.join(only[:5]) or 'order'}): "
                "the same class folders are needed"
            )
        validation = f"from {val}"
    check_out(out, "images dataset")
    paths = [path for path, _ in train + held]
    modes, pixel_range = check_images(paths, workers or default_workers())

    def write(tmp: Path) -> dict:
        index = {"format": FORMAT, "classes": classes}
        index["counts"] = {"train": len(train), "val": len(held)}
        index["converted"] = sum(mode not in ("RGB", *HIGH_BIT_MODES) for mode in modes)
        index["scaled"] = sum(mode in HIGH_BIT_MODES for mode in modes)
        index["skipped"] = len(skipped)
        index["skipped_example"] = str(skipped[0]) if skipped else ""
        index["validation"] = validation
        progress, digests = Progress("packed", len(train) + len(held)), []
        for split, files in zip(SPLITS, (train, held), strict=True):
            index[split], digest = write_split(tmp, split, files, int(shard_mb * 2**20), progress)
            digests.append(digest)
        progress.close()
        shards = [entry for split in SPLITS for entry in index[split]["shards"]]
        record_samples(tmp, shards, [entry["bytes"] for entry in shards])
        index["data_sha256"] = digests  # the images and labels, not their paths
        if pixel_range is not None:
            index["pixel_range"] = pixel_range
        parts = fingerprint_parts(classes, digests, pixel_range)
        index["fingerprint"] = content_fingerprint(*parts)
        index["sources"] = [str(images)] + ([str(val)] if val is not None else [])
        return index

    # a file gone since the check, a full disk: one line, nothing left
    return written(out, "images dataset", write)


# --- make-dataset's options (sources.py) ---------------------------------------------------


def add_arguments(make, source) -> None:
    source.add_argument(
        "--images",
        type=Path,
        metavar="DIR",
        help="vision: an ImageFolder DIR/<class>/<image> packed into shards",
    )
    make.add_argument("--val", type=Path, metavar="DIR", help="with --images: validation images")
    make.add_argument(
        "--val-fraction",
        type=number_option,
        help=f"with --images: the share of each class held out (default {DEFAULT_VAL_FRACTION})",
    )
    make.add_argument(
        "--shard-mb",
        type=number_option,
        default=DEFAULT_SHARD_MB,
        help=f"with --images: shard size in MB (default {DEFAULT_SHARD_MB})",
    )


def write(args) -> dict:
    return write_image_dataset(
        args.images, args.out, args.val, args.val_fraction, args.shard_mb, args.workers
    )


def summary(index: dict, args) -> str:
    counts, shards = index["counts"], len(index["train"]["shards"]) + len(index["val"]["shards"])
    skipped = index.get("skipped", 0)
    example = f", e.g. {index['skipped_example']}" if skipped else ""
    scaled = ""
    if "pixel_range" in index:
        low, high = index["pixel_range"]
        scaled = (
            f"; {index['scaled']} of more than 8 bits scaled from [{low:g}, {high:g}] to [0, 1]"
        )
    return (
        f"wrote {counts['train']} training and {counts['val']} validation images of "
        f"{len(index['classes'])} classes in {shards} shards to {args.out} (validation: "
        f"{index['validation']}; {index['converted']} converted to RGB when read{scaled}; "
        f"{skipped} file{'' if skipped == 1 else 's'} skipped, hidden or not images by their "
        f"extension{example}); train "
        f"with model=vision dataset={args.out}"
    )


SOURCES = (DatasetSource("--images", add_arguments, write, summary),)
