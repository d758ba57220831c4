"""Training data as a function of the step: every batch of every rank is determined by
(seed, step, micro-step, rank), so a resumed run reads exactly the batches it would have read,
with no sampler state to save, and any world size is well defined.

A dataset kind (kinds.py) opens the splits. The training split is read as an endless stream of
epochs, each a permutation of its indices that depends on (seed, epoch) alone; a rank's
micro-batch is its slice of that stream at `samples_seen` (saved in the checkpoint), so a resume
on another number of ranks continues the same stream. Each sample is read under its own seed,
(seed, epoch, index): its random augmentation is the same in any loader process, for any
`num_workers`; a split's `mix` (images: mixup, cutmix, label smoothing) mixes each collated
micro-batch under (seed, step, micro-step, rank). (A kind may draw its own batches instead: token
windows at random positions.)

How batches reach the GPU (see docs/training.md): an in-memory dataset that fits stays on the GPU
and batches are gathered there; otherwise batches are gathered on the CPU (by `num_workers`
loader processes, or a background thread) and copied on a side stream (`prefetch.py`).
"""

from __future__ import annotations

import atexit
import hashlib
import os
import random
import signal
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, get_worker_info

from .. import distributed
from ..config_keys import AUTO, key
from ..run.preemption import SIGNALS
from .directory import DatasetError
from .info import Splits


# fmt: off
@dataclass
class DataKeys:
    dataset: str = key("synthetic", '"synthetic" or a directory written by make-dataset',
                       resume=True)
    synthetic_samples: int = key(16384, "classifier synthetic data: samples",
                                 bounds=(1, 2**31 - 1), resume=True)
    eval_samples: int = key(2048, "classifier: samples held out from the end for evaluation",
                            bounds=(0, 2**31 - 1), resume=True)
    num_features: int = key(64, "classifier synthetic data: input features (a directory says "
                            "its own)", bounds=(1, 2**20), resume=True)
    num_classes: int = key(10, "classifier synthetic data: classes (a directory says its own)",
                           bounds=(2, 2**24), resume=True)
    batch_size: int = key(16, "per rank and micro-step{% if cookiecutter.workload in ("all", "language") %} (language models: windows of tokens){% endif %}",
                          bounds=(1, 2**24), resume=True)
    grad_accum_steps: int = key(1, "micro-steps per optimizer step (gradients synced on the "
                                "last)", bounds=(1, 2**16), resume=True)
    num_workers: int = key(-1, "loader processes per rank; -1: SLURM_CPUS_PER_TASK - 1 (at most "
                           "8 unless samples are decoded)", bounds=(-1, 256))
    data_on_gpu: str = key("auto", "in-memory data on the GPU: auto (under 10% of it)",
                           choices=AUTO)
# fmt: on


PREFETCH_FACTOR = 4  # micro-batches each loader process prepares ahead
# Without loader processes, a kind with `draw_many` (token windows) or whose split gathers many
# batches at once (arrays: `gather_many`) reads the micro-batches of this many steps together:
# after a training step the CPU caches are cold, and a read's fixed cost (about 0.5 ms for token
# windows on a busy 2-core machine, ten times its warm time) is then paid once per block.
DRAW_AHEAD_STEPS = 10


def draws_ahead(data: Splits) -> bool:
    """Whether this process reads DRAW_AHEAD_STEPS steps' micro-batches at once (no loaders)."""
    return data.draw_many is not None or hasattr(data.train, "gather_many")


class SampleStream:
    """The training split's indices as an endless stream of epochs: epoch e is a permutation of
    range(size) drawn from (seed, e) alone."""

    def __init__(self, size: int, seed: int):
        if size < 1:
            raise ValueError("the training split is empty")
        self.size, self.seed = size, seed
        self._perms: dict[int, np.ndarray] = {}

    def permutation(self, epoch: int) -> np.ndarray:
        if epoch not in self._perms:
            if len(self._perms) > 2:
                self._perms.pop(min(self._perms))
            self._perms[epoch] = np.random.default_rng([self.seed, epoch]).permutation(self.size)
        return self._perms[epoch]

    def take(self, start: int, count: int) -> tuple[np.ndarray, np.ndarray]:
        """Positions [start, start + count) of the stream: (indices, the epoch of each)."""
        parts, epochs, position = [], [], start
        while position < start + count:
            epoch, offset = divmod(position, self.size)
            take = min(self.size - offset, start + count - position)
            parts.append(self.permutation(epoch)[offset : offset + take])
            epochs.append(np.full(take, epoch, dtype=np.int64))
            position += take
        return np.concatenate(parts), np.concatenate(epochs)


@contextmanager
def seeded(*key) -> Iterator[None]:
    """torch's (CPU), numpy's and Python's global random generators seeded from `key` while a
    sample (seed, epoch, index) or a batch's mixing (seed, "mix", step, micro-step, rank) is
    read: its random augmentation is a function of the key, in any process. The training
    process gets its generators back (dropout draws from torch's); a loader process needs
    nothing back, which saves about 0.1 ms a sample."""
    digest = hashlib.blake2b(",".join(map(str, key)).encode(), digest_size=8).digest()
    value = int.from_bytes(digest, "little")
    restore = get_worker_info() is None
    if restore:
        saved = torch.random.get_rng_state(), np.random.get_state(), random.getstate()
    torch.random.default_generator.manual_seed(value)  # torch.manual_seed also seeds CUDA's
    np.random.seed(value % 2**32)
    random.seed(value)
    try:
        yield
    finally:
        if restore:
            torch.random.set_rng_state(saved[0])
            np.random.set_state(saved[1])
            random.setstate(saved[2])


def read_samples(split: Dataset, indices: np.ndarray, epochs: np.ndarray, seed: int, collate):
    """One batch of `split`: its `gather` (a whole batch at once), or each sample read under its
    own seed, then collated."""
    gather = getattr(split, "gather", None)
    if gather is not None:
        return gather(indices)
    samples = []
    for index, epoch in zip(indices.tolist(), epochs.tolist(), strict=True):
        with seeded(seed, epoch, index):
            samples.append(split[index])
    return collate(samples)


@dataclass
class EvalSet:
    """One rank's share of the validation split, read batch by batch as it is scored (or once,
    `keep`). Its first `scored` batches are the rank's samples; any after them repeat one batch
    only so that every rank runs as many forward passes as the others (FSDP's collectives need
    that) and are not counted. `scoreable`: what the whole split holds in the task's count (its
    samples, or what the split says: the target tokens of token windows); `scheme`: which
    samples are scored, in words."""

    split: Dataset
    collate: Callable
    chunks: list[np.ndarray]  # the sample indices of each batch
    scored: int
    scoreable: int
    scheme: str
    kept: list | None = None

    def __iter__(self) -> Iterator:
        if self.kept is not None:
            return iter(self.kept)
        return (
            read_samples(self.split, c, np.full(len(c), -1), 0, self.collate) for c in self.chunks
        )

    def sums(self, score, device: torch.device, autocast) -> dict[str, float]:
        """The sums `score(batch)` returns (scalar tensors: "loss", "count", ...) over every
        rank's scored batches, added in float64 (exact counts of billions of tokens) and
        all-reduced once; `autocast()`: the context each batch is scored in."""
        sums: dict[str, torch.Tensor] = {}
        for index, batch in enumerate(self):
            batch = map_tensors(lambda t: t.to(device, non_blocking=True), batch)
            with autocast():
                scores = score(batch)
            if index >= self.scored:  # run only to keep the ranks' forward passes in step
                scores = {name: torch.zeros_like(value) for name, value in scores.items()}
            sums = {name: sums.get(name, 0) + value.double() for name, value in scores.items()}
        names = sorted(sums)  # the same on every rank: the same task, as many batches
        totals = distributed.all_reduce(torch.stack([sums[name] for name in names]))
        return dict(zip(names, totals.tolist(), strict=True))

    def keep(self) -> EvalSet:
        """Read every batch now and keep them (training scores the same few again and again)."""
        self.kept = list(self)
        return self


def eval_batches(
    data: Splits, batch_size: int, rank: int, world: int, max_batches: int | None
) -> EvalSet:
    """This rank's share of the validation split: the whole split, or `max_batches` batches of
    samples spread evenly over it (`eval_batches`), the same samples on any number of ranks.
    Sample k of those goes to rank k % world: none is left out or scored twice."""
    split = data.val
    total = len(split)
    if total == 0:
        raise DatasetError("the validation split is empty: evaluation needs at least one sample")
    chosen = np.arange(total, dtype=np.int64)
    unit = getattr(split, "unit", "samples")
    coverage = f"all {total} {unit}"
    if max_batches is not None and max_batches * batch_size < total:
        spread = np.linspace(0, total - 1, max_batches * batch_size)
        chosen = np.unique(spread.round().astype(np.int64))
        coverage = f"{len(chosen)} of its {total} {unit} evenly spaced (eval_batches={max_batches})"
    mine = chosen[rank::world]
    chunks = [mine[i : i + batch_size] for i in range(0, len(mine), batch_size)]
    scored = len(chunks)
    per_rank = -(-len(chosen) // world)  # samples of the ranks with the most
    most = -(-per_rank // batch_size)
    chunks += [chunks[0] if chunks else chosen[:1]] * (most - scored)
    scheme = "; ".join(filter(None, [getattr(split, "scheme", None), coverage]))
    scoreable = getattr(split, "scoreable", total)
    return EvalSet(split, data.collate, chunks, scored, scoreable, scheme)


def example_batch(data: Splits, cfg):
    """A batch of one training sample (to count a model's FLOPs by running it)."""
    if data.draw is not None:
        return data.draw(cfg.seed, 0, 0, 0, 1)
    first = np.zeros(1, np.int64)
    return read_samples(data.train, first, first, cfg.seed, data.collate)


def map_tensors(fn, batch):
    """`fn` applied to every tensor of a batch: a tensor, or tuples, lists and dicts of them
    (other values are kept as they are)."""
    if isinstance(batch, torch.Tensor):
        return fn(batch)
    if isinstance(batch, dict):
        return {k: map_tensors(fn, v) for k, v in batch.items()}
    if isinstance(batch, list | tuple):
        return type(batch)(map_tensors(fn, v) for v in batch)
    return batch


class StepBatches:
    """This rank's micro-batches as a function of (step, micro-step)."""

    def __init__(
        self, data: Splits, cfg, rank: int, world: int, start_step: int, samples_seen: int
    ):
        self.data, self.cfg, self.rank, self.world = data, cfg, rank, world
        self.start_step, self.start_samples = start_step, samples_seen
        self.stream = None if data.draw else SampleStream(len(data.train), cfg.seed)
        self._units: tuple | None = None  # the training split's own counts (units_seen)

    def samples_seen(self, step: int) -> int:
        """Samples all ranks have consumed before `step` (the data position a checkpoint saves)."""
        per_step = self.cfg.batch_size * self.cfg.grad_accum_steps * self.world
        return self.start_samples + (step - self.start_step) * per_step

    def units_seen(self, samples: int, per_sample: int) -> int:
        """What the first `samples` samples of the stream hold, padding excluded: a split with
        `units` (each sample's own count: a chat window's tokens that are not padding) adds
        those of the samples the stream gave; any other sample counts `per_sample` (a token
        window's tokens, one image)."""
        if self._units is None:  # counted once: (each sample's, the split's total) or ()
            units = getattr(self.data.train, "units", None) if self.stream else None
            self._units = () if units is None else (np.asarray(units), int(np.sum(units)))
        if not self._units:
            return samples * per_sample
        units, total = self._units
        epochs, rest = divmod(samples, len(units))
        indices = self.stream.take(epochs * len(units), rest)[0] if rest else []
        return epochs * total + int(units[indices].sum())

    def batch(self, step: int, micro: int):
        cfg, data = self.cfg, self.data
        if data.draw is not None:
            return data.draw(cfg.seed, step, micro, self.rank, cfg.batch_size)
        indices, epochs = self.samples(step, micro)
        batch = read_samples(data.train, indices, epochs, cfg.seed, data.collate)
        mix = getattr(data.train, "mix", None)  # images: mixup, cutmix, label smoothing
        if mix is not None:
            with seeded(cfg.seed, "mix", step, micro, self.rank):
                batch = mix(batch)
        return batch

    def samples(self, step: int, micro: int) -> tuple[np.ndarray, np.ndarray]:
        """The sample indices of this rank's micro-batch (and the epoch of each)."""
        start = self.samples_seen(step) + (micro * self.world + self.rank) * self.cfg.batch_size
        return self.stream.take(start, self.cfg.batch_size)

    def inline(self, stop_step: int) -> Iterator:
        """Every micro-batch from the start step to `stop_step`, in order, read in this process:
        DRAW_AHEAD_STEPS steps at once where the kind can (`draw_many`, or a split's
        `gather_many`: the same batches), else one by one."""
        cfg, accum = self.cfg, self.cfg.grad_accum_steps
        gather_many = None if self.stream is None else getattr(self.data.train, "gather_many", None)
        for first in range(self.start_step, stop_step, DRAW_AHEAD_STEPS):
            steps = range(first, min(first + DRAW_AHEAD_STEPS, stop_step))
            keys = [(step, micro) for step in steps for micro in range(accum)]
            if self.data.draw_many is not None:
                yield from self.data.draw_many(cfg.seed, keys, self.rank, cfg.batch_size)
            elif gather_many is not None:
                yield from gather_many([self.samples(step, micro)[0] for step, micro in keys])
            else:
                yield from (self.batch(step, micro) for step, micro in keys)


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
        return batches.inline(stop_step)
    loader = DataLoader(
        _LoaderView(batches, stop_step),
        batch_size=None,  # items are whole batches
        shuffle=False,
        num_workers=workers,
        pin_memory=pin,
        worker_init_fn=worker_init,
        prefetch_factor=PREFETCH_FACTOR,
        # its own generator: starting the loader must not draw from the training process's,
        # whose state a checkpoint saves (a resumed run starts its loader once more)
        generator=torch.Generator().manual_seed(0),
    )
    return LoaderBatches(loader)


class LoaderBatches:
    """A DataLoader's batches, whose `close()` ends its loader processes at once, which torch
    and multiprocessing cannot: the processes ignore SIGTERM (worker_init), torch's shutdown
    ends a busy one with SIGTERM, and multiprocessing at exit sends SIGTERM to every process
    left and then waits for it for ever (a run stopped by an error in a loader process held
    its nodes until the time limit). The training loop closes it on every way out, and any
    still open at exit is closed before multiprocessing's turn (atexit runs the last
    registered first)."""

    def __init__(self, loader: DataLoader):
        self._batches = iter(loader)  # starts the loader processes
        _open_loaders.add(self)

    def __iter__(self) -> Iterator:
        return self

    def __next__(self):
        return next(self._batches)

    def close(self) -> None:
        """Ask the loader processes to end, and kill those still running a moment later."""
        batches, self._batches = self._batches, iter(())
        _open_loaders.discard(self)
        processes = list(getattr(batches, "_workers", []))
        shutdown = getattr(batches, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()  # sends each its end, waits a moment, SIGTERM (which they ignore)
        for process in processes:
            if process.is_alive():
                process.kill()
                process.join()


_open_loaders: weakref.WeakSet[LoaderBatches] = weakref.WeakSet()


@atexit.register
def _close_open_loaders() -> None:
    for loader in list(_open_loaders):
        loader.close()


def worker_init(worker_id: int) -> None:
    """Loader workers ignore the preemption signals: only the training process acts on them
    (sites with SignalChildrenProcesses=yes send them to every process of a task), and a worker
    killed by SIGTERM would crash the loader before the checkpoint is written. The training
    process ends them itself when it stops (LoaderBatches.close)."""
    for sig in SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    seed = torch.initial_seed() % 2**32
    random.seed(seed)
    np.random.seed(seed)


def resolve_num_workers(requested: int, decodes: bool) -> int:
    """num_workers=-1: the CPUs Slurm gives the rank less one (the training process's) for a
    dataset whose samples cost CPU (decoding, augmentation: 72 Grace cores per GH200 GPU in the
    job scripts), at most 8 for one that only slices arrays or token windows."""
    if requested >= 0:
        return requested
    cpus = int(os.environ.get("SLURM_CPUS_PER_TASK", "1"))
    if cpus <= 1:
        return 0
    return cpus - 1 if decodes else min(8, cpus - 1)


def place_on_gpu(data: Splits, device: torch.device, setting: str) -> bool:
    """An in-memory dataset moved to the GPU when it fits (data_on_gpu); whether it moved."""
    if data.to is None or not fits_on_gpu(data.nbytes, device, setting):
        return False
    data.to(device)
    return True


def fits_on_gpu(nbytes: int, device: torch.device, setting: str) -> bool:
    """data_on_gpu: "true", "false", or "auto" = an in-memory dataset under 10% of the GPU."""
    if device.type != "cuda" or nbytes == 0 or setting == "false":
        return False
    if setting == "true":
        return True
    free, total = torch.cuda.mem_get_info(device)
    return nbytes < 0.1 * total and nbytes < 0.5 * free
