"""Datasets and loaders.

- `synthetic`: a deterministic classification problem (a fixed random linear teacher), in memory.
- a dataset directory written by `python -m <pkg> make-dataset`: one `.npy` file per array plus a
  small `index.json`, read with numpy memmap. Few large files suit Lustre (every file open is a
  metadata operation); memmap reads only the pages a batch touches.

Batches are fetched with one fancy-indexing call per batch (`__getitems__`), not one call per
sample, and the training position (epoch, batch in epoch) is part of the checkpoint: a resumed
run starts the sampler at that offset instead of loading and discarding batches.
"""

from __future__ import annotations

import json
import os
import random
import signal
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler

INDEX_FILE = "index.json"
FORMAT = "npy-arrays/1"


class ArrayDataset(Dataset):
    """Inputs `x` (N, features) float32 and labels `y` (N,) int64, numpy arrays or memmaps
    (a memmap reads only the pages a batch touches)."""

    def __init__(self, x: np.ndarray, y: np.ndarray, num_classes: int):
        if len(x) != len(y):
            raise ValueError(f"x has {len(x)} rows but y has {len(y)}")
        self.x, self.y, self.num_classes = x, y, num_classes

    @property
    def num_features(self) -> int:
        return int(self.x.shape[1])

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = self.__getitems__([i])
        return x[0], y[0]

    def __getitems__(self, indices: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        idx = np.asarray(indices, dtype=np.intp)  # one gather per batch, not one per sample
        return torch.from_numpy(np.take(self.x, idx, axis=0)), torch.from_numpy(self.y[idx])

    def subset(self, start: int, stop: int) -> ArrayDataset:
        return ArrayDataset(self.x[start:stop], self.y[start:stop], self.num_classes)


def keep_batch(batch):
    """collate_fn: `__getitems__` already returns a batch."""
    return batch


def synthetic_arrays(samples: int, features: int, classes: int, seed: int):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((samples, features), dtype=np.float32)
    teacher = rng.standard_normal((features, classes), dtype=np.float32)
    noise = 0.5 * rng.standard_normal((samples, classes), dtype=np.float32)
    y = np.argmax(x @ teacher + noise, axis=1).astype(np.int64)
    return x, y


def write_dataset(
    out: Path,
    x: np.ndarray,
    y: np.ndarray,
    num_classes: int | None = None,
    chunk_rows: int = 1 << 16,
) -> Path:
    """Write `x.npy`, `y.npy` and `index.json` (last, so a directory with an index is complete)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if x.ndim != 2 or y.ndim != 1 or len(x) != len(y):
        raise ValueError(
            f"need x of shape (N, features) and y of shape (N,); got {x.shape}, {y.shape}"
        )
    arrays = {"x": (x, np.float32), "y": (y, np.int64)}
    entries = {}
    for name, (array, dtype) in arrays.items():
        path = out / f"{name}.npy"
        dst = np.lib.format.open_memmap(path, mode="w+", dtype=dtype, shape=array.shape)
        for start in range(0, len(array), chunk_rows):  # bounded memory for large inputs
            dst[start : start + chunk_rows] = array[start : start + chunk_rows]
        dst.flush()
        del dst
        entries[name] = {
            "file": path.name,
            "dtype": np.dtype(dtype).name,
            "shape": list(array.shape),
        }
    classes = int(num_classes if num_classes is not None else int(np.max(y)) + 1)
    index = {
        "format": FORMAT,
        "num_samples": len(x),
        "num_features": int(x.shape[1]),
        "num_classes": classes,
        "arrays": entries,
    }
    tmp = out / (INDEX_FILE + ".tmp")
    tmp.write_text(json.dumps(index, indent=2) + "\n")
    os.replace(tmp, out / INDEX_FILE)
    return out


def open_dataset(directory: Path) -> ArrayDataset:
    directory = Path(directory)
    try:
        index = json.loads((directory / INDEX_FILE).read_text())
    except FileNotFoundError:
        raise FileNotFoundError(
            f"{directory / INDEX_FILE} not found: dataset directories are written by "
            f"`python -m {__package__} make-dataset --out DIR`"
        ) from None
    if index.get("format") != FORMAT:
        raise ValueError(f"{directory}: unknown dataset format {index.get('format')!r}")
    x = np.load(directory / index["arrays"]["x"]["file"], mmap_mode="r")
    y = np.load(directory / index["arrays"]["y"]["file"], mmap_mode="r")
    return ArrayDataset(x, y, int(index["num_classes"]))


def load_datasets(cfg) -> tuple[ArrayDataset, ArrayDataset]:
    """(train, eval): the last `eval_samples` samples are held out for evaluation."""
    if cfg.dataset == "synthetic":
        x, y = synthetic_arrays(cfg.synthetic_samples, cfg.num_features, cfg.num_classes, cfg.seed)
        full = ArrayDataset(x, y, cfg.num_classes)
    else:
        full = open_dataset(Path(cfg.dataset))
    split = len(full) - cfg.eval_samples
    if split <= 0:
        raise ValueError(f"dataset has {len(full)} samples, not more than eval_samples")
    return full.subset(0, split), full.subset(split, len(full))


class ResumableSampler(DistributedSampler):
    """DistributedSampler that can start an epoch at an offset (samples of this rank)."""

    start = 0

    def __iter__(self):
        return iter(list(super().__iter__())[self.start :])

    def __len__(self) -> int:
        return self.num_samples - self.start


def worker_init(worker_id: int) -> None:
    """Loader workers ignore the preemption signals: only the training process acts on them
    (sites with SignalChildrenProcesses=yes send them to every process of a task), and a worker
    killed by SIGTERM would crash the loader before the checkpoint is written."""
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    seed = torch.initial_seed() % 2**32  # differs per worker, derived from the loader generator
    random.seed(seed)
    np.random.seed(seed)


def resolve_num_workers(requested: int) -> int:
    if requested >= 0:
        return requested
    cpus = int(os.environ.get("SLURM_CPUS_PER_TASK", "1"))
    return min(8, cpus - 1) if cpus > 1 else 0  # leave one core to the training process


def make_loader(
    dataset: ArrayDataset,
    batch_size: int,
    rank: int,
    world: int,
    seed: int,
    shuffle: bool,
    workers: int,
    pin: bool,
) -> DataLoader:
    sampler = ResumableSampler(
        dataset, num_replicas=world, rank=rank, shuffle=shuffle, seed=seed, drop_last=True
    )
    # The loader's own generator: without it, creating an iterator draws from the global torch
    # RNG, so a mid-epoch resume would shift every later random number (dropout diverges).
    generator = torch.Generator()
    generator.manual_seed(seed + rank)
    return DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        drop_last=shuffle,
        collate_fn=keep_batch,
        num_workers=workers,
        pin_memory=pin,
        generator=generator,
        worker_init_fn=worker_init if workers else None,
        persistent_workers=workers > 0,
    )


class Batches:
    """Endless iterator over training batches that knows its position for checkpoints."""

    def __init__(self, loader: DataLoader, epoch: int = 0, batch_in_epoch: int = 0):
        if len(loader.sampler) < loader.batch_size:
            raise ValueError("the training set has fewer samples per rank than one batch")
        self.loader, self.epoch, self.batch_in_epoch = loader, epoch, batch_in_epoch
        self._it = None

    def __iter__(self):
        return self

    def __next__(self):
        if self._it is None:
            self.loader.sampler.set_epoch(self.epoch)  # a new shuffle every epoch
            self.loader.sampler.start = self.batch_in_epoch * self.loader.batch_size
            self._it = iter(self.loader)
        try:
            batch = next(self._it)
        except StopIteration:
            self.epoch, self.batch_in_epoch, self._it = self.epoch + 1, 0, None
            return next(self)
        self.batch_in_epoch += 1
        return batch

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "batch_in_epoch": self.batch_in_epoch}
