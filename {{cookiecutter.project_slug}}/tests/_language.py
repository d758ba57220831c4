"""The language workload's test helpers: a tiny GPT run (conftest.py's TINY is the classifier
every training workload keeps), and the windows `evaluate` scores on a token split."""

from __future__ import annotations

import torch

# A tiny run of the GPT on CPU: 2 layers, 32 wide, context 32, synthetic tokens; dropout makes
# the result depend on the restored RNG states and grad_accum_steps=2 exercises gradient sync on
# the last micro-batch only.
TINY_GPT = [
    "device=cpu",
    "model=gpt",
    "preset=tiny",
    "n_embd=32",
    "block_size=32",
    "vocab_size=256",
    "dataset=synthetic",
    "batch_size=4",
    "dropout=0.1",
    "lr=0.01",
    "warmup_steps=5",
    "max_steps=80",
    "log_every=1",
    "eval_every=25",
    "eval_batches=2",
    "preempt_check_every=1",
    "checkpoint_every=10",
    "keep_checkpoints=3",
    "async_checkpoint=false",
    "num_workers=0",
    "cpu_threads=1",
    "dist_timeout_s=60",
    "grad_accum_steps=2",
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
