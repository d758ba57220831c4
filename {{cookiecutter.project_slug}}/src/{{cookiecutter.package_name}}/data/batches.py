"""Training data as a function of the step: every batch of every rank is determined by
(seed, step, micro-step, rank), so a resumed run reads exactly the batches it would have read,
with no sampler state to save, and any world size is well defined.

Two kinds of dataset, told apart by the `index.json` of a dataset directory:
- token shards for language models (`tokens.py`, written by `make-dataset --stdlib|--text|
  --tokens`): windows of context_length+1 tokens read from the shard files;
- arrays for classifiers (`x.npy`, `y.npy`, written by `make-dataset --out DIR [--x --y]`): an
  endless stream of samples, reshuffled every epoch; a rank's batch is a slice of that stream at
  `samples_seen` (saved in the checkpoint), so a resume on another number of ranks continues
  the same stream.
"synthetic" makes either in memory (a random linear teacher; uniform random tokens).

How batches reach the GPU (see docs/training.md): an in-memory dataset that fits stays on the GPU
and batches are gathered there; otherwise batches are gathered on the CPU (by `num_workers`
loader processes, or a background thread) and copied on a side stream (`prefetch.py`).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from ..config_keys import AUTO, ConfigError, key
from ..run.atomic import atomic_write_text
from ..run.preemption import SIGNALS
from .info import DataInfo
from .tokens import file_sha256


# fmt: off
@dataclass
class DataKeys:
    dataset: str = key("synthetic", '"synthetic" or a directory written by make-dataset',
                       resume=True)
    vocab_size: int = key(0, "language models: vocabulary (0: the dataset's; synthetic: 50257)",
                          bounds=(0, 2**24), resume=True)
    synthetic_samples: int = key(16384, "classifier synthetic data: samples",
                                 bounds=(1, 2**31 - 1), resume=True)
    eval_samples: int = key(2048, "classifier: samples held out from the end for evaluation",
                            bounds=(0, 2**31 - 1), resume=True)
    num_features: int = key(64, "classifier synthetic data: input features (a directory says "
                            "its own)", bounds=(1, 2**20), resume=True)
    num_classes: int = key(10, "classifier synthetic data: classes (a directory says its own)",
                           bounds=(2, 2**24), resume=True)
    batch_size: int = key(16, "per rank and micro-step (language models: windows of tokens)",
                          bounds=(1, 2**24), resume=True)
    grad_accum_steps: int = key(1, "micro-steps per optimizer step (gradients synced on the "
                                "last)", bounds=(1, 2**16), resume=True)
    num_workers: int = key(-1, "loader processes per rank; -1: min(8, SLURM_CPUS_PER_TASK - 1)",
                           bounds=(-1, 64))
    data_on_gpu: str = key("auto", "in-memory data on the GPU: auto (under 10% of it)",
                           choices=AUTO)
# fmt: on


INDEX_FILE = "index.json"
FORMAT = "npy-arrays/1"
SYNTHETIC_TOKENS = 2**20
GPT2_VOCAB = 50257


class ArraySource:
    """Classification arrays: inputs x (N, features) float32, labels y (N,) int64; numpy arrays,
    memmaps, or torch tensors on the GPU (`to`)."""

    def __init__(self, x, y, num_classes: int, fingerprint: str, eval_samples: int, seed: int):
        split = len(x) - eval_samples
        if split <= 0:
            raise ValueError(f"dataset has {len(x)} samples, not more than eval_samples")
        self.x, self.y, self.split, self.seed = x, y, split, seed
        self.info = DataInfo("arrays", fingerprint, int(x.shape[1]), int(num_classes))
        self._perms: dict[int, np.ndarray] = {}

    @property
    def nbytes(self) -> int:
        return int(self.x.nbytes + self.y.nbytes)

    def to(self, device: torch.device) -> ArraySource:
        """Keep the arrays on `device`: batches are then gathered there (no host copy)."""
        self.x = torch.as_tensor(np.asarray(self.x)).to(device)
        self.y = torch.as_tensor(np.asarray(self.y)).to(device)
        return self

    def _permutation(self, epoch: int) -> np.ndarray:
        if epoch not in self._perms:
            if len(self._perms) > 2:
                self._perms.pop(min(self._perms))
            self._perms[epoch] = np.random.default_rng([self.seed, epoch]).permutation(self.split)
        return self._perms[epoch]

    def stream_indices(self, start: int, count: int) -> np.ndarray:
        """Indices [start, start + count) of the endless stream of epoch permutations."""
        parts, position = [], start
        while position < start + count:
            epoch, offset = divmod(position, self.split)
            take = min(self.split - offset, start + count - position)
            parts.append(self._permutation(epoch)[offset : offset + take])
            position += take
        return np.concatenate(parts)

    def gather(self, idx: np.ndarray):
        idx = np.sort(idx)  # memmap pages in file order; the order within a batch is irrelevant
        if isinstance(self.x, torch.Tensor):
            index = torch.from_numpy(idx).to(self.x.device, non_blocking=True)
            return self.x[index], self.y[index]
        return torch.from_numpy(np.take(self.x, idx, axis=0)), torch.from_numpy(self.y[idx])

    def eval_batches(self, batch_size: int, rank: int, world: int, max_batches: int) -> list:
        """The held-out tail, split over ranks, in fixed batches."""
        rows = np.arange(self.split, len(self.x))[rank::world]
        chunks = [rows[i : i + batch_size] for i in range(0, len(rows), batch_size)]
        return [self.gather(c) for c in chunks[:max_batches] if len(c)]


class TokenSource:
    """Token shards (or synthetic tokens) for a language model: windows of block_size+1 tokens."""

    def __init__(self, dataset, block_size: int, seed: int):  # dataset: tokens.TokenDataset
        self.dataset, self.block_size, self.seed = dataset, block_size, seed
        self.info = DataInfo("tokens", dataset.fingerprint, vocab_size=dataset.vocab_size)
        self.nbytes = 0  # read from the shard files on the host; windows are small

    def eval_batches(self, batch_size: int, rank: int, world: int, max_batches: int) -> list:
        return self.dataset.val_batches(batch_size, self.block_size, rank, world, max_batches)


def open_source(cfg, kind: str, context_length: int = 0):
    """The dataset named by `cfg.dataset` ("synthetic" or a make-dataset directory), of the kind
    the model's task reads (`kind`: "tokens" or "arrays", models.spec.Task.data); a language
    model reads windows of its `context_length` tokens (+1 for the targets)."""
    if kind == "tokens":
        from . import tokens

        if cfg.dataset == "synthetic":
            vocab = cfg.vocab_size or GPT2_VOCAB
            dataset = tokens.TokenDataset.synthetic(vocab, SYNTHETIC_TOKENS, cfg.seed)
        else:
            dataset = tokens.TokenDataset.open(Path(cfg.dataset))
        return TokenSource(dataset, context_length, cfg.seed)
    if cfg.dataset == "synthetic":
        x, y = synthetic_arrays(cfg.synthetic_samples, cfg.num_features, cfg.num_classes, cfg.seed)
        fingerprint = f"synthetic:{cfg.synthetic_samples}x{cfg.num_features}:{cfg.num_classes}"
        return ArraySource(x, y, cfg.num_classes, fingerprint, cfg.eval_samples, cfg.seed)
    x, y, classes, fingerprint = open_dataset(Path(cfg.dataset))
    return ArraySource(x, y, classes, fingerprint, cfg.eval_samples, cfg.seed)


class StepBatches:
    """This rank's micro-batches as a function of (step, micro-step)."""

    def __init__(self, source, cfg, rank: int, world: int, start_step: int, samples_seen: int):
        self.source, self.cfg, self.rank, self.world = source, cfg, rank, world
        self.start_step, self.start_samples = start_step, samples_seen

    def samples_seen(self, step: int) -> int:
        """Samples all ranks have consumed before `step` (the data position a checkpoint saves)."""
        per_step = self.cfg.batch_size * self.cfg.grad_accum_steps * self.world
        return self.start_samples + (step - self.start_step) * per_step

    def batch(self, step: int, micro: int):
        cfg, source = self.cfg, self.source
        if isinstance(source, TokenSource):
            return source.dataset.train_batch(
                cfg.seed, step, micro, self.rank, cfg.batch_size, source.block_size
            )
        start = self.samples_seen(step) + (micro * self.world + self.rank) * cfg.batch_size
        return source.gather(source.stream_indices(start, cfg.batch_size))


class _LoaderView(Dataset):
    """Item k = the k-th micro-batch from the start step, so loader processes can prepare them
    in parallel and in order."""

    def __init__(self, batches: StepBatches, stop_step: int):
        self.batches, self.accum = batches, batches.cfg.grad_accum_steps
        self.length = max(0, (stop_step - batches.start_step) * self.accum)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, k: int):
        step, micro = divmod(k, self.accum)
        return self.batches.batch(self.batches.start_step + step, micro)


def micro_batches(batches: StepBatches, stop_step: int, workers: int, pin: bool) -> Iterator:
    """Every micro-batch from the start step to `stop_step`, in order."""
    if workers == 0:
        accum = batches.cfg.grad_accum_steps
        return (
            batches.batch(step, micro)
            for step in range(batches.start_step, stop_step)
            for micro in range(accum)
        )
    loader = DataLoader(
        _LoaderView(batches, stop_step),
        batch_size=None,  # items are whole batches
        shuffle=False,
        num_workers=workers,
        pin_memory=pin,
        worker_init_fn=worker_init,
        prefetch_factor=4,
    )
    return iter(loader)


def worker_init(worker_id: int) -> None:
    """Loader workers ignore the preemption signals: only the training process acts on them
    (sites with SignalChildrenProcesses=yes send them to every process of a task), and a worker
    killed by SIGTERM would crash the loader before the checkpoint is written."""
    for sig in SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    seed = torch.initial_seed() % 2**32
    random.seed(seed)
    np.random.seed(seed)


def resolve_num_workers(requested: int) -> int:
    if requested >= 0:
        return requested
    cpus = int(os.environ.get("SLURM_CPUS_PER_TASK", "1"))
    return min(8, cpus - 1) if cpus > 1 else 0  # leave one core to the training process


def fits_on_gpu(nbytes: int, device: torch.device, setting: str) -> bool:
    """data_on_gpu: "true", "false", or "auto" = an in-memory dataset under 10% of the GPU."""
    if device.type != "cuda" or nbytes == 0 or setting == "false":
        return False
    if setting == "true":
        return True
    free, total = torch.cuda.mem_get_info(device)
    return nbytes < 0.1 * total and nbytes < 0.5 * free


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
    entries, digest = {}, hashlib.sha256()
    for name, (array, dtype) in arrays.items():
        path = out / f"{name}.npy"
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
    index = {
        "format": FORMAT,
        "num_samples": len(x),
        "num_features": int(x.shape[1]),
        "num_classes": classes,
        "arrays": entries,
        "fingerprint": digest.hexdigest(),  # a resume refuses a rewritten dataset
    }
    atomic_write_text(out / INDEX_FILE, json.dumps(index, indent=2) + "\n")
    return out


def open_dataset(directory: Path):
    """(x, y, num_classes, fingerprint) of a make-dataset array directory, as memmaps."""
    directory = Path(directory)
    try:
        index = json.loads((directory / INDEX_FILE).read_text())
    except FileNotFoundError:
        raise FileNotFoundError(
            f"{directory / INDEX_FILE} not found: dataset directories are written by "
            f"`python -m {__name__.split('.')[0]} make-dataset --out DIR`"
        ) from None
    if index.get("format") != FORMAT:
        raise ConfigError(
            f"dataset {directory} holds {index.get('format')!r} data, not a classifier's arrays "
            f"({FORMAT}): token shards train a language model (model=gpt), a classifier reads "
            "make-dataset --x/--y arrays"
        )
    x = np.load(directory / index["arrays"]["x"]["file"], mmap_mode="r")
    y = np.load(directory / index["arrays"]["y"]["file"], mmap_mode="r")
    if len(x) != len(y):
        raise ValueError(f"{directory}: x has {len(x)} rows but y has {len(y)}")
    fingerprint = index.get("fingerprint") or f"{directory}:{len(x)}"
    return x, y, int(index["num_classes"]), fingerprint
