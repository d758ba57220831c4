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
from ..data.directory import check_out, file_sha256, written
from .sources import DatasetSource


def write_dataset(
    out: Path,
    x: np.ndarray,
    y: np.ndarray,
    num_classes: int | None = None,
    chunk_rows: int = 1 << 16,
) -> dict:
    """Write `x.npy`, `y.npy` and `index.json` as the dataset directory `out`; its index."""
    out = Path(out)
    if x.ndim != 2 or y.ndim != 1 or len(x) != len(y):
        raise ValueError(
            f"need x of shape (N, features) and y of shape (N,); got {x.shape}, {y.shape}"
        )
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
        classes = int(num_classes if num_classes is not None else int(np.max(y)) + 1)
        return {
            "format": FORMAT,
            "num_samples": len(x),
            "num_features": int(x.shape[1]),
            "num_classes": classes,
            "arrays": entries,
            "fingerprint": digest.hexdigest(),  # a resume refuses a rewritten dataset
        }

    return written(out, "arrays dataset", write)


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
    return write_dataset(args.out, x, y, classes)


def summary(index: dict, args) -> str:
    return (
        f"wrote {index['num_samples']} samples x {index['num_features']} features to "
        f"{args.out} (model=mlp dataset={args.out})"
    )


SOURCES = (DatasetSource("--x", add_arguments, write, summary),)
