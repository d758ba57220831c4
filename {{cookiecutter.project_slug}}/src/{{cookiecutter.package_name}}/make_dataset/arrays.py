"""`make-dataset --out DIR [--x X.npy --y Y.npy]`: the classifier example's arrays (its reader:
data/arrays.py), `x.npy` (N, features) float32, `y.npy` (N,) int64 and index.json, written into
a temporary directory beside DIR and renamed to DIR when complete (data/directory.py,
`written`). Without --x and --y: synthetic arrays, a random linear teacher's labels. What
make-dataset writes when no other source is named.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from ..config_keys import ConfigError, integer_option
from ..data.arrays import FORMAT, synthetic_arrays
from ..data.directory import DatasetError, check_out, file_sha256, written
from .sources import DatasetSource


def write_dataset(
    out: Path,
    x: np.ndarray,
    y: np.ndarray,
    num_classes: int | None = None,
    chunk_rows: int = 1 << 16,
    names: tuple[str, str] = ("x", "y"),
) -> dict:
    """Write `x.npy`, `y.npy` and `index.json` as the dataset directory `out`; its index.
    `names`: what the messages call x and y (their files)."""
    out = Path(out)
    if x.ndim != 2 or y.ndim != 1 or len(x) != len(y):
        raise ValueError(
            f"need x of shape (N, features) and y of shape (N,); got {x.shape}, {y.shape}"
        )
    num_classes = checked_labels(y, num_classes, names[1], chunk_rows)
    checked_features(x, names[0], chunk_rows)
    check_out(out, "arrays dataset")

    def write(tmp: Path) -> dict:
        arrays = {"x": (x, np.float32), "y": (y, np.int64)}
        entries, digest = {}, hashlib.sha256()
        for name, (array, dtype) in arrays.items():
            path = tmp / f"{name}.npy"
            dst = np.lib.format.open_memmap(path, mode="w+", dtype=dtype, shape=array.shape)
            for start in range(0, len(array), chunk_rows):  # bounded memory for large inputs
                dst[start : start + chunk_rows] = array[start : start + chunk_rows]
            dst.flush()
            del dst
            digest.update(file_sha256(path).encode())
            entries[name] = {
                "file": path.name,
                "dtype": np.dtype(dtype).name,
                "shape": list(array.shape),
            }
        classes = num_classes
        return {
            "format": FORMAT,
            "num_samples": len(x),
            "num_features": int(x.shape[1]),
            "num_classes": classes,
            "arrays": entries,
            "fingerprint": digest.hexdigest(),  # a resume refuses a rewritten dataset
        }

    return written(out, "arrays dataset", write)


def checked_labels(y: np.ndarray, classes: int | None, name: str, chunk_rows: int) -> int:
    """The number of classes (given, or the largest label + 1), once every label is a whole
    number from 0 to classes - 1: a float label would be cut to an integer when stored, and a
    label out of range stops the loss with an index error in the middle of training."""
    if not (np.issubdtype(y.dtype, np.integer) or np.issubdtype(y.dtype, np.floating)):
        raise DatasetError(f"{name}: labels of dtype {y.dtype}; need integers 0 to classes - 1")
    largest = -1
    for start in range(0, len(y), chunk_rows):
        part = np.asarray(y[start : start + chunk_rows])
        whole = np.isfinite(part) & (part == np.floor(part)) if part.dtype.kind == "f" else None
        bad = (part < 0) if whole is None else ~whole | (part < 0)
        if classes is not None:
            bad |= part >= classes
        if bad.any():
            row = start + int(np.argmax(bad))
            wanted = f"0 to {classes - 1} (--classes {classes})" if classes else "0 or more"
            label = np.asarray(y[row]).item()
            raise DatasetError(
                f"{name}: row {row} has label {label!r}; labels are whole numbers {wanted}"
            )
        largest = max(largest, int(part.max()) if len(part) else -1)
    return int(classes if classes is not None else largest + 1)


FLOAT32_MAX = float(np.finfo(np.float32).max)


def checked_features(x: np.ndarray, name: str, chunk_rows: int) -> None:
    """Numbers, all finite, also as the float32 they are stored as: a NaN or inf feature makes
    every loss it reaches NaN (a float64 beyond float32's range is stored as inf)."""
    if not (np.issubdtype(x.dtype, np.number) or x.dtype == np.bool_):
        raise DatasetError(f"{name}: features of dtype {x.dtype}; need numbers")
    for start in range(0, len(x), chunk_rows):
        part = np.asarray(x[start : start + chunk_rows], dtype=np.float64)
        finite = np.isfinite(part)
        if not finite.all():
            row = start + int(np.argmin(finite.all(axis=1)))
            raise DatasetError(f"{name}: row {row} holds a NaN or infinite feature")
        beyond = (np.abs(part) > FLOAT32_MAX).any(axis=1)
        if beyond.any():
            row = start + int(np.argmax(beyond))
            value = part[row - start][np.abs(part[row - start]) > FLOAT32_MAX][0]
            raise DatasetError(
                f"{name}: row {row} holds a feature beyond float32's range ({value:g}; float32 "
                f"ends at {FLOAT32_MAX:.3g}, the features are stored as float32): scale it"
            )


def add_arguments(make, source) -> None:
    source.add_argument("--x", type=Path, help="MLP: inputs .npy (N, features)")
    make.add_argument("--y", type=Path, help="MLP: integer labels .npy (N,)")
    make.add_argument(
        "--samples", type=integer_option, default=16384, help="MLP synthetic: samples"
    )
    make.add_argument(
        "--features", type=integer_option, default=64, help="MLP synthetic: input features"
    )
    make.add_argument(
        "--classes",
        type=integer_option,
        help="MLP: number of classes (synthetic: 10; .npy: max label + 1)",
    )
    make.add_argument("--seed", type=integer_option, default=1234, help="MLP synthetic: seed")


def write(args) -> dict:
    if (args.x is None) != (args.y is None):
        raise ConfigError("make-dataset needs both --x and --y, or neither (synthetic data)")
    if args.x is not None:
        x, y = np.load(args.x, mmap_mode="r"), np.load(args.y, mmap_mode="r")
        classes = args.classes  # None: the largest label + 1
    else:
        classes = args.classes or 10
        x, y = synthetic_arrays(args.samples, args.features, classes, args.seed)
    names = (str(args.x), str(args.y)) if args.x is not None else ("x", "y")
    return write_dataset(args.out, x, y, classes, names=names)


def summary(index: dict, args) -> str:
    return (
        f"wrote {index['num_samples']} samples x {index['num_features']} features to "
        f"{args.out} (model=mlp dataset={args.out})"
    )


SOURCES = (DatasetSource("--x", add_arguments, write, summary),)
