"""Chat datasets for instruction tuning: conversations as token ids with a loss mask that selects
the assistant's tokens, packed into windows whose conversations never see each other.

A dataset directory (written by `make-dataset --chat`: make_dataset/chat.py):

    index.json              format "chat/1", dtype, vocab_size, the tokenizer, max_length, the
                            number of conversations truncated and dropped, the fingerprint, and
                            for each split its files' sizes and sampled hashes
    train-tokens.bin        every conversation's ids, one after the other (uint16 or uint32)
    train-mask.bin          one byte per token: 1 where the loss reads it (the answers)
    train-lengths.bin       each conversation's number of tokens (uint32): its boundaries
    val-*.bin               the same for every VAL_EVERY-th conversation
    tokenizer.json, tokenizer_config.json, chat_template.jinja
                            the tokenizer with its chat template (generate --chat, export)

A training sample is a window of the model's context length: whole conversations in their
order, packed until the next does not fit, the rest padding. Its inputs are the tokens, its
targets each token's successor where the mask selects it and IGNORE_INDEX elsewhere (at the
padding and at each conversation's last token: nothing of it follows), and its positions restart
at 0 with each conversation, which is how the models see where one ends (document masking: no
token attends to another conversation's): a `token_batch` with positions. The windows are the
epoch stream's samples (batches.py).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from .directory import (
    DatasetError,
    ShardFile,
    index_fields,
    open_checked,
    read_index,
    token_ids,
)
from .info import IGNORE_INDEX, DataInfo, DatasetKind, Splits, token_batch
from .tokenizer import VocabularyKeys

FORMAT = "chat/1"
MASK_DTYPE = np.dtype("u1")
LENGTH_DTYPE = np.dtype("<u4")
VAL_EVERY = 20  # every 20th conversation is a validation one (5%)
PARTS = ("tokens", "mask", "lengths")  # a split's files


def file_names(split: str) -> dict[str, str]:
    return {part: f"{split}-{part}.bin" for part in PARTS}


def read_chat_index(directory: Path) -> dict:
    """index.json of a chat dataset, checked: each problem is one DatasetError line."""
    index = read_index(directory, FORMAT)
    with index_fields(directory):
        for split in ("train", "val"):
            int(index[split]["conversations"]), int(index[split]["max_id"])
            for part in PARTS:
                entry = index[split]["files"][part]
                str(entry["name"]), int(entry["bytes"]), int(entry["sampled_blocks"])
                str(entry["sample_sha256"])
        str(index["fingerprint"])
    token_ids(directory, index)
    return index


def pack(lengths: np.ndarray, window: int) -> np.ndarray:
    """Greedy packing in order: (first, stop) conversation ranges whose tokens fit `window`."""
    ranges, first, used = [], 0, 0
    for i, length in enumerate(lengths.tolist()):
        if used + length > window:
            ranges.append((first, i))
            first, used = i, 0
        used += length
    ranges.append((first, len(lengths)))
    return np.array(ranges, dtype=np.int64).reshape(-1, 2)


def window_arrays(tokens: np.ndarray, mask: np.ndarray, lengths: np.ndarray, window: int):
    """(inputs, targets, positions) of `window` slots for conversations laid end to end."""
    used, tokens = len(tokens), tokens.astype(np.int64)
    ends = np.cumsum(lengths)
    starts = ends - lengths
    inputs = np.zeros(window, np.int64)
    inputs[:used] = tokens
    targets = np.full(window, IGNORE_INDEX, np.int64)
    targets[: used - 1] = np.where(mask[1:] == 1, tokens[1:], IGNORE_INDEX)
    targets[ends - 1] = IGNORE_INDEX  # a conversation's last token: the next one is another's
    positions = np.arange(window, dtype=np.int64)
    positions[:used] -= np.repeat(starts, lengths)
    positions[used:] -= used  # the padding: one more document, that nothing reads
    return inputs, targets, positions


class ChatSplit(Dataset):
    """A split's packed windows; item k is a `token_batch` of (window,) int64 tensors: inputs,
    targets, positions (the default collate stacks them)."""

    def __init__(self, tokens: ShardFile, mask: ShardFile, lengths: np.ndarray, window: int):
        self.tokens, self.mask, self.lengths, self.window = tokens, mask, lengths, window
        self.offsets = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])
        self.ranges = pack(lengths, window)

    def __len__(self) -> int:
        return len(self.ranges)

    @property
    def units(self) -> np.ndarray:
        """Each window's tokens that are not padding (the tokens seen that the log counts)."""
        return self.offsets[self.ranges[:, 1]] - self.offsets[self.ranges[:, 0]]

    @property
    def scoreable(self) -> int:
        """The answer tokens the windows score (evaluate's count): in each conversation, the
        masked tokens after its first (the first has nothing before it to predict it)."""
        total = int(self.offsets[-1])
        mask = self.mask.windows(np.array([0]), total)[0] if total else np.zeros(0, MASK_DTYPE)
        seen = np.concatenate([[0], np.cumsum(mask, dtype=np.int64)])
        return int((seen[self.offsets[1:]] - seen[self.offsets[:-1] + 1]).sum())

    @property
    def scheme(self) -> str:
        return (
            f"{len(self)} windows of {self.window} tokens packing the split's "
            f"{len(self.lengths)} conversations whole; the loss reads the answers' tokens"
        )

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        first, stop = self.ranges[index]
        start, end = self.offsets[first], self.offsets[stop]
        span = np.array([start])
        tokens = self.tokens.windows(span, end - start)[0]
        mask = self.mask.windows(span, end - start)[0]
        arrays = window_arrays(tokens, mask, self.lengths[first:stop], self.window)
        return token_batch(*(torch.from_numpy(array) for array in arrays))


def check_lengths(directory: Path, split: str, count: int, lengths, tokens, mask) -> None:
    """The conversations' lengths against the files they cut: as many as index.json says, none
    empty, adding up to the tokens and the mask bytes there are (a sum beyond the files would
    end a run mid-epoch on a read past their end)."""
    where = directory / file_names(split)["lengths"]
    if len(lengths) != count:
        raise DatasetError(f"{where}: {len(lengths)} conversations, but index.json says {count}")
    if len(lengths) and int(lengths.min()) < 1:
        raise DatasetError(f"{where}: conversation {int(np.argmin(lengths))} has no tokens")
    total = int(lengths.sum())
    if total != len(tokens) or total != len(mask):
        raise DatasetError(
            f"{where}: the conversations' lengths add up to {total} tokens, but "
            f"{tokens.path.name} holds {len(tokens)} and {mask.path.name} {len(mask)}; write the "
            "dataset again"
        )


def open_chat(directory: Path, cfg, spec) -> Splits:
    """The train and validation windows of a chat dataset, packed to the model's context."""
    directory = Path(directory)
    index = read_chat_index(directory)
    window = spec.context_length(cfg)
    dtype, _ = token_ids(directory, index)
    splits = {}
    for split in ("train", "val"):
        files = index[split]["files"]
        tokens, mask, lengths = (
            open_checked(directory, files[part], int(files[part]["bytes"]), item, "token")
            for part, item in zip(PARTS, (dtype, MASK_DTYPE, LENGTH_DTYPE), strict=True)
        )
        lengths = np.asarray(lengths, np.int64)
        check_lengths(directory, split, int(index[split]["conversations"]), lengths, tokens, mask)
        if int(index[split]["max_id"]) >= int(index["vocab_size"]):
            raise DatasetError(f"{directory}: holds ids beyond its vocabulary; write it again")
        if len(lengths) and int(lengths.max()) > window:
            raise DatasetError(
                f"{directory}: holds conversations of up to {int(lengths.max())} tokens, longer "
                f"than the model's context of {window}; write it with --max-length {window}"
            )
        splits[split] = ChatSplit(tokens, mask, lengths, window)
    info = DataInfo("chat", index["fingerprint"], vocab_size=int(index["vocab_size"]))
    return Splits(train=splits["train"], val=splits["val"], info=info)


KIND = DatasetKind(name="chat", format=FORMAT, open=open_chat, keys=VocabularyKeys)
