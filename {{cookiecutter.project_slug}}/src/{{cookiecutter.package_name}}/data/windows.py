"""The validation split of a token dataset as windows that score every token once.

A token dataset's validation split is the last `val_fraction` of its token stream (make-dataset:
0.5%, at least 1,025 tokens), in one or more val shards; it starts wherever that cut falls,
usually inside a document. `evaluate` and the evaluations during training read it as windows of
block_size + 1 tokens (the inputs and their next tokens): in each shard windows start every
block_size tokens, so every token but the shard's first is a target exactly once; where the last
of them stops short of the shard's end, one more window is aligned to the end and scores only
the tokens the others left (the tail: its earlier targets are IGNORE_INDEX, they were scored).
A shard shorter than a window is one window padded at the end, its padding IGNORE_INDEX (the
model is causal: what follows a token does not change its prediction).

Training windows start at random positions: `window_draws` (below) draws them.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from .info import IGNORE_INDEX, token_batch


def shard_windows(tokens: int, block_size: int) -> list[tuple[int, int, int]]:
    """(start, length, first scored target) of each window of a shard of `tokens` tokens."""
    window = block_size + 1
    if tokens < 2:
        return []
    if tokens < window:
        return [(0, tokens, 0)]
    found = [(start, window, 0) for start in range(0, tokens - window + 1, block_size)]
    scored = found[-1][0] + block_size  # the last position that is a target so far
    if scored < tokens - 1:  # the tail
        found.append((tokens - window, window, scored - (tokens - window)))
    return found


class ValidationWindows:
    """The val split's windows: item k is window k, `gather(indices)` a batch of them, as a
    `token_batch` (batch, block_size) with the targets not scored IGNORE_INDEX.
    `read(starts, length)`: rows of `length` tokens at positions of the concatenated shards."""

    unit = "windows"

    def __init__(
        self,
        shard_sizes: list[int],
        block_size: int,
        read: Callable[[np.ndarray, int], np.ndarray],
    ):
        self.block, self.read = block_size, read
        offsets = np.cumsum([0, *shard_sizes[:-1]], dtype=np.int64)
        windows = [
            (offset + start, length, first)
            for offset, size in zip(offsets.tolist(), shard_sizes, strict=True)
            for start, length, first in shard_windows(size, block_size)
        ]
        self.starts, self.lengths, self.first = np.array(windows, dtype=np.int64).reshape(-1, 3).T
        self.scoreable = sum(max(size - 1, 0) for size in shard_sizes)  # tokens that are targets
        self.scheme = (
            f"windows of {block_size} tokens every {block_size} tokens of each val shard, the "
            "last aligned to the shard's end scoring only the tokens not yet scored"
        )

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {name: rows[0] for name, rows in self.gather(np.array([index])).items()}

    def gather(self, indices: np.ndarray) -> dict[str, torch.Tensor]:
        indices = np.asarray(indices, dtype=np.int64)
        rows = np.zeros((len(indices), self.block + 1), dtype=np.int64)
        lengths = self.lengths[indices]
        for length in np.unique(lengths).tolist():
            pick = np.flatnonzero(lengths == length)
            rows[pick, :length] = self.read(self.starts[indices[pick]], length)
        window = torch.from_numpy(rows)
        x, y = window[:, :-1].contiguous(), window[:, 1:].contiguous()
        position = torch.arange(self.block)
        first = torch.from_numpy(self.first[indices])[:, None]
        stop = torch.from_numpy(lengths - 1)[:, None]  # targets at and after it are padding
        y[(position < first) | (position >= stop)] = IGNORE_INDEX
        return token_batch(x, y)


GOLDEN_GAMMA = np.uint64(0x9E3779B97F4A7C15)  # SplitMix64's increment: 2**64 / golden ratio


def mix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64's output function (Steele, Lea and Flood 2014; it seeds numpy's and Java's
    generators): a bijection of uint64 arrays that spreads every input bit over the output."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def window_draws(
    seed: int, keys: list[tuple[int, int]], rank: int, batch_size: int, total: int
) -> np.ndarray:
    """`batch_size` integers uniform in [0, total) for each (step, micro) of `keys`, one key's
    after the other (int64): a counter-based generator, SplitMix64's stream from a key hashed
    of (seed, step, rank, micro), computed for all keys in a few array operations. (A numpy
    Generator per key cost ~30 us each after a training step had cooled the caches: 0.5 % of a
    tiny GPT's CPU step.) Modulo bias: below total / 2**64."""
    steps, micros = np.array(keys, dtype=np.uint64).reshape(-1, 2).T
    key = mix64(np.array([seed], dtype=np.uint64) + GOLDEN_GAMMA)
    for part in (steps, np.array([rank], dtype=np.uint64), micros):
        key = mix64((key ^ part) + GOLDEN_GAMMA)
    counters = key[:, None] + GOLDEN_GAMMA * np.arange(1, batch_size + 1, dtype=np.uint64)
    return (mix64(counters) % np.uint64(total)).astype(np.int64).ravel()
