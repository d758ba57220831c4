"""The classifier example's kind of dataset: feature vectors and labels, `x.npy` (N, features)
float32 and `y.npy` (N,) int64, written by `make-dataset --out DIR [--x X.npy --y Y.npy]`
(make_dataset/arrays.py); the
last `eval_samples` rows are the validation split. "synthetic" makes them in memory (a random
linear teacher). Small enough to live on the GPU (data_on_gpu), where batches are gathered with
no host copy.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from .directory import DatasetError, file_name, index_fields, read_index
from .info import DataInfo, DatasetKind, Splits

FORMAT = "npy-arrays/1"


class Arrays:
    """Inputs x and labels y: numpy arrays, memmaps, or torch tensors on the GPU (`to`)."""

    def __init__(self, x, y):
        self.x, self.y = x, y

    @property
    def nbytes(self) -> int:
        return int(self.x.nbytes + self.y.nbytes)

    def to(self, device: torch.device) -> None:
        """Keep the arrays on `device`: batches are then gathered there (no host copy)."""
        self.x = torch.as_tensor(np.asarray(self.x)).to(device)
        self.y = torch.as_tensor(np.asarray(self.y)).to(device)

    def gather(self, idx: np.ndarray):
        return self.gather_many([idx])[0]

    def gather_many(self, chunks: list[np.ndarray]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """`gather` of each chunk of rows, read in one go (one call's fixed cost for several
        batches, as token windows are drawn: data/batches.py, DRAW_AHEAD_STEPS)."""
        # each chunk sorted: memmap pages in file order; the order within a batch is irrelevant
        idx = np.concatenate([np.sort(chunk) for chunk in chunks])
        if isinstance(self.x, torch.Tensor):
            index = torch.from_numpy(idx).to(self.x.device, non_blocking=True)
            x, y = self.x[index], self.y[index]
        else:
            x, y = torch.from_numpy(np.take(self.x, idx, axis=0)), torch.from_numpy(self.y[idx])
        sizes = [len(chunk) for chunk in chunks]
        return list(zip(x.split(sizes), y.split(sizes), strict=True))


class ArraySplit(Dataset):
    """Rows [start, stop) of the arrays; `gather` reads a whole batch at once (no randomness:
    the samples need no seeds of their own)."""

    def __init__(self, arrays: Arrays, start: int, stop: int):
        self.arrays, self.start, self.stop = arrays, start, stop

    def __len__(self) -> int:
        return self.stop - self.start

    def __getitem__(self, index: int):
        x, y = self.gather(np.array([index]))
        return x[0], y[0]

    def gather(self, indices: np.ndarray):
        return self.arrays.gather(self.start + np.asarray(indices, dtype=np.int64))

    def gather_many(self, chunks: list[np.ndarray]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return self.arrays.gather_many([self.start + np.asarray(c, dtype=np.int64) for c in chunks])


def splits(x, y, num_classes: int, fingerprint: str, eval_samples: int) -> Splits:
    train_rows = len(x) - eval_samples
    if train_rows <= 0:
        raise DatasetError(f"dataset has {len(x)} samples, not more than eval_samples")
    arrays = Arrays(x, y)
    info = DataInfo("arrays", fingerprint, int(x.shape[1]), int(num_classes))
    return Splits(
        train=ArraySplit(arrays, 0, train_rows),
        val=ArraySplit(arrays, train_rows, len(x)),
        info=info,
        nbytes=arrays.nbytes,
        to=arrays.to,
    )


def open_arrays(directory: Path, cfg, spec) -> Splits:
    x, y, classes, fingerprint = open_dataset(directory)
    return splits(x, y, classes, fingerprint, cfg.eval_samples)


def synthetic(cfg, spec) -> Splits:
    x, y = synthetic_arrays(cfg.synthetic_samples, cfg.num_features, cfg.num_classes, cfg.seed)
    fingerprint = f"synthetic:{cfg.synthetic_samples}x{cfg.num_features}:{cfg.num_classes}"
    return splits(x, y, cfg.num_classes, fingerprint, cfg.eval_samples)


def synthetic_arrays(samples: int, features: int, classes: int, seed: int):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((samples, features), dtype=np.float32)
    teacher = rng.standard_normal((features, classes), dtype=np.float32)
    noise = 0.5 * rng.standard_normal((samples, classes), dtype=np.float32)
    y = np.argmax(x @ teacher + noise, axis=1).astype(np.int64)
    return x, y


def open_dataset(directory: Path):
    """(x, y, num_classes, fingerprint) of a make-dataset array directory, as memmaps."""
    directory = Path(directory)
    index = read_index(directory, FORMAT)
    with index_fields(directory):
        names = [file_name(directory, index["arrays"][name]["file"]) for name in ("x", "y")]
        int(index["num_classes"])
    try:
        x, y = (np.load(directory / name, mmap_mode="r") for name in names)
    except (OSError, ValueError) as err:
        raise DatasetError(f"dataset {directory}: unreadable arrays ({err})") from None
    if len(x) != len(y):
        raise DatasetError(f"{directory}: x has {len(x)} rows but y has {len(y)}")
    classes = int(index["num_classes"])
    if len(y) and (int(y.min()) < 0 or int(y.max()) >= classes):
        raise DatasetError(
            f"{directory}: y.npy holds labels {int(y.min())} to {int(y.max())}, but index.json "
            f"says {classes} classes (0 to {classes - 1})"
        )
    fingerprint = index.get("fingerprint") or f"{directory}:{len(x)}"
    return x, y, classes, fingerprint


KIND = DatasetKind(name="arrays", format=FORMAT, open=open_arrays, synthetic=synthetic)
