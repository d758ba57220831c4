"""The language workload's test helpers: a tiny GPT run (conftest.py's TINY is the classifier
every training workload keeps), and the windows `evaluate` scores on a token split."""

from __future__ import annotations

import torch
from conftest import TINY_RUN

# A tiny run of the GPT on CPU: 2 layers, 32 wide, context 32, synthetic tokens, with the run
# keys of conftest.py's TINY (dropout, grad_accum_steps=2).
TINY_GPT = [
    "model=gpt",
    "preset=tiny",
    "n_embd=32",
    "block_size=32",
    "vocab_size=256",
    *TINY_RUN,
]


def validation_windows(ids, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The windows `evaluate` scores on a one-shard validation split `ids`, written out here
    independently of the package: block + 1 tokens every block tokens, and a last one aligned
    to the end whose tokens scored before are -100 (ignored) in its labels. (windows, labels)
    as transformers takes them (`labels=` is shifted inside): every token after the first is a
    target once."""
    ids = torch.as_tensor(ids, dtype=torch.int64)
    starts = list(range(0, len(ids) - block, block))
    rows = [ids[s : s + block + 1] for s in starts]
    labels = [row.clone() for row in rows]
    covered = starts[-1] + block  # the last position scored by the windows so far
    if covered < len(ids) - 1:
        tail = ids[-block - 1 :]
        label = tail.clone()
        label[: covered - (len(ids) - block - 1) + 1] = -100
        rows.append(tail)
        labels.append(label)
    return torch.stack(rows), torch.stack(labels)
