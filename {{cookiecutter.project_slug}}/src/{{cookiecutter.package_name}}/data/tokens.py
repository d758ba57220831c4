"""Token datasets for language models: a few large shards of uint16 or uint32 tokens.

A dataset directory (written by `python -m <pkg> make-dataset`: make_dataset/tokens.py, fed by
the sources of make_dataset/text_files.py and make_dataset/hf_datasets.py):

    index.json                            format, dtype, vocab_size, tokenizer, fingerprint, and
                                          each shard's token count, largest id, sha256 (checked
                                          at every training start) and the sha256 of a few
                                          sampled blocks (checked at every open)
    train-00000.bin, train-00001.bin ...  raw little-endian tokens, 2**28 per shard: uint16 for
                                          vocabularies up to 65,536, uint32 above
    val-00000.bin ...                     the last `val_fraction` of the token stream
    tokenizer.json                        the Hugging Face tokenizer that made the ids, if any

Few large files suit Lustre (every file open is a metadata operation), and a batch reads only
its windows (one positional read each, `ShardFile`). Text is tokenised byte by byte (`--stdlib`,
`--text`: UTF-8 bytes, vocabulary 256, nothing to download; a 0 byte ends each document), by a
Hugging Face tokenizer (`--hf ... --tokenizer tokenizer.json`: its end-of-document token ends
each document), or comes pre-tokenised (`--tokens FILE --vocab-size V`).

Training reads random windows of block_size + 1 tokens. Their positions are a function of
(seed, step, rank, micro-step) only, so a resumed run needs no sampler state and every world size
is well defined. A window never crosses a shard boundary (the few positions that would are never
drawn: at most block_size per 2**28 tokens).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..config_keys import ConfigError, key
from .directory import (
    DatasetError,
    ShardFile,
    index_fields,
    open_checked,
    read_index,
    token_dtype,
    token_ids,
)
from .info import DataInfo, DatasetKind, Splits, token_batch
from .tokenizer import VocabularyKeys, recorded_codec
from .windows import ValidationWindows, window_draws

log = logging.getLogger(__name__.split(".")[0])

FORMAT = "tokens/1"
SYNTHETIC_TOKENS = 2**20  # dataset=synthetic: uniform random tokens, nothing to learn
GPT2_VOCAB = 50257  # their vocabulary when vocab_size is 0
MIN_VAL_TOKENS = 1025  # at least one window of block_size 1024 (+1 for the shifted targets)
TEXT_PIECE = 2**20  # evaluate --print-split decodes this many tokens at a time, at most
# A shard rewritten after make-dataset (same size, other tokens) would resume a run on other data
# under the same fingerprint. Every open (evaluate, generate, each rank of a run) reads the sha256
# of 64 blocks spread over the whole dataset (at least one per shard) again: about 1 MiB,
# whatever the dataset's size (directory.record_samples). A training start also hashes every
# shard in full, split over the ranks (`kinds.verify_files`): a change the samples miss is found
# there.


def read_token_index(directory: Path) -> dict:
    """index.json of a token dataset, checked: each problem is one DatasetError line."""
    written_by = (
        f"token datasets are written by `python -m {__name__.split('.')[0]} make-dataset "
        "--stdlib | --text FILE... | --hf SOURCE --tokenizer PATH | --tokens FILE --vocab-size V "
        "--out DIR`"
    )
    index = read_index(directory, FORMAT, written_by)
    path = Path(directory) / "index.json"
    token_ids(directory, index)
    with index_fields(directory):
        for split in ("train", "val"):
            for entry in index[split]["files"]:
                str(entry["name"]), int(entry["tokens"]), int(entry["max_id"])
                if "sample_sha256" not in entry or "sha256" not in entry:
                    raise DatasetError(
                        f"{path}: records no sample hashes for {entry['name']} (written by an "
                        "earlier make-dataset); write the dataset again"
                    )
                int(entry["sampled_blocks"]), str(entry["sample_sha256"]), str(entry["sha256"])
        str(index["fingerprint"])
    for split in ("train", "val"):
        if not index[split]["files"]:
            raise DatasetError(f"{path}: lists no {split} files; write the dataset again")
    return index


class TokenDataset:
    """Train and validation token splits, each a list of shards (ShardFile; 1-D arrays for
    synthetic tokens). `tokenizer`: what made the ids ("bytes", "huggingface", "external",
    "synthetic"); `tokenizer_file`: the Hugging Face tokenizer that made them, or None, and
    `tokenizer_sha256` its recorded sha256."""

    def __init__(
        self,
        train: list,
        val: list,
        vocab_size: int,
        fingerprint: str,
        tokenizer: str,
        tokenizer_file: Path | None = None,
        tokenizer_sha256: str | None = None,
        digests: dict[Path, str] | None = None,
    ):
        self.train, self.val = train, val
        self.vocab_size, self.fingerprint, self.tokenizer = vocab_size, fingerprint, tokenizer
        self.tokenizer_file, self.tokenizer_sha256 = tokenizer_file, tokenizer_sha256
        self.digests = digests or {}  # each shard's sha256 as make-dataset wrote it, by path
        self.train_tokens = sum(len(s) for s in train)
        self.val_tokens = sum(len(s) for s in val)

    @classmethod
    def open(cls, directory: Path) -> TokenDataset:
        """Open the shards of a make-dataset directory, checking their sizes and largest ids
        against the index (an id outside the vocabulary would end training with an IndexError)."""
        directory = Path(directory)
        index = read_token_index(directory)
        dtype, vocab_size = token_ids(directory, index)
        splits = {}
        for split in ("train", "val"):
            shards = []
            for entry in index[split]["files"]:
                size = int(entry["tokens"]) * dtype.itemsize
                shard = open_checked(directory, entry, size, dtype, "token")
                max_id = int(entry["max_id"])
                if max_id >= vocab_size:
                    raise DatasetError(
                        f"{directory / entry['name']}: holds token id {max_id}, but the "
                        f"vocabulary (index.json vocab_size) is {vocab_size}: ids must be below "
                        "it; write the dataset again with the tokenizer's vocabulary size"
                    )
                shards.append(shard)
            splits[split] = shards
        tokenizer_file, recorded = None, index.get("tokenizer_file") or {}
        if recorded:
            tokenizer_file = directory / str(recorded.get("name", "tokenizer.json"))
        digests = {
            directory / entry["name"]: entry["sha256"]
            for split in ("train", "val")
            for entry in index[split]["files"]
        }
        return cls(
            splits["train"],
            splits["val"],
            vocab_size,
            index["fingerprint"],
            index.get("tokenizer", "external"),
            tokenizer_file,
            recorded.get("sha256"),
            digests,
        )

    @classmethod
    def synthetic(
        cls, vocab_size: int, tokens: int, seed: int, val_tokens: int | None = None
    ) -> TokenDataset:
        """Uniform random tokens in memory (for benchmarks: there is nothing to learn)."""
        dtype = token_dtype(vocab_size, "synthetic tokens")
        val_tokens = val_tokens or max(tokens // 100, MIN_VAL_TOKENS)
        rng = np.random.default_rng(seed)
        train = rng.integers(0, vocab_size, tokens, dtype=np.int64).astype(dtype)
        val = rng.integers(0, vocab_size, val_tokens, dtype=np.int64).astype(dtype)
        name = f"synthetic:vocab_size={vocab_size}:tokens={tokens}+{val_tokens}:seed={seed}"
        return cls([train], [val], vocab_size, name, "synthetic")

    def window_starts(
        self, seed: int, step: int, micro: int, rank: int, batch_size: int, block_size: int
    ) -> np.ndarray:
        """`batch_size` random start positions (int64, in the concatenated train split) of
        windows of block_size + 1 tokens, each inside one shard. A function of (seed, step, rank,
        micro) only: uniform over all such windows, drawn with replacement."""
        return self.many_window_starts(seed, [(step, micro)], rank, batch_size, block_size)

    def many_window_starts(
        self, seed: int, keys: list[tuple[int, int]], rank: int, batch_size: int, block_size: int
    ) -> np.ndarray:
        """`window_starts` of each (step, micro) of `keys`, one after the other."""
        window = block_size + 1
        counts = np.array([max(len(s) - window + 1, 0) for s in self.train], dtype=np.int64)
        if counts.sum() == 0:
            raise DatasetError(
                f"no train shard holds a window of block_size + 1 = {window} tokens "
                f"(the longest has {max(len(s) for s in self.train)})"
            )
        draws = window_draws(seed, keys, rank, batch_size, int(counts.sum()))
        shard = np.searchsorted(np.cumsum(counts), draws, side="right")
        shard_starts = np.cumsum([0] + [len(s) for s in self.train[:-1]], dtype=np.int64)
        valid_before = np.concatenate([[0], np.cumsum(counts)[:-1]])
        return shard_starts[shard] + (draws - valid_before[shard])

    def train_batch(
        self, seed: int, step: int, micro: int, rank: int, batch_size: int, block_size: int
    ) -> dict[str, torch.Tensor]:
        """A `token_batch` of CPU int64 (batch_size, block_size): the targets are the inputs
        shifted by one."""
        return self.train_batches(seed, [(step, micro)], rank, batch_size, block_size)[0]

    def train_batches(
        self, seed: int, keys: list[tuple[int, int]], rank: int, batch_size: int, block_size: int
    ) -> list[dict[str, torch.Tensor]]:
        """`train_batch` of each (step, micro) of `keys`, gathered at once (data/batches.py,
        DRAW_AHEAD_STEPS: a draw's fixed cost paid once per call)."""
        starts = self.many_window_starts(seed, keys, rank, batch_size, block_size)
        x, y = split_window(gather(self.train, starts, block_size + 1, self.vocab_size))
        pairs = zip(x.split(batch_size), y.split(batch_size), strict=True)
        return [token_batch(inputs, targets) for inputs, targets in pairs]


def gather(shards: list, starts: np.ndarray, window: int, vocab_size: int) -> np.ndarray:
    """Rows of `window` tokens at `starts` (positions in the concatenated shards; a window lies
    inside one shard): one fancy-indexing read per shard touched, not one per token. An id at or
    above `vocab_size` (a shard changed where the samples did not look) is refused here, in one
    line, instead of an IndexError inside the model."""
    bounds = np.cumsum([len(s) for s in shards], dtype=np.int64)
    shard = np.searchsorted(bounds, starts, side="right")
    out = np.empty((len(starts), window), dtype=np.int64)
    offsets = np.arange(window, dtype=np.int64)
    for i in np.unique(shard):
        rows = np.flatnonzero(shard == i)
        local = starts[rows] - (bounds[i] - len(shards[i]))
        if isinstance(shards[i], ShardFile):
            out[rows] = shards[i].windows(local, window)
        else:  # in memory (synthetic tokens)
            out[rows] = shards[i][local[:, None] + offsets]
        if len(rows) and (largest := int(out[rows].max())) >= vocab_size:
            name = getattr(shards[i], "path", None) or getattr(shards[i], "filename", "a shard")
            raise DatasetError(
                f"{name}: holds token id {largest}, "
                f"but the vocabulary is {vocab_size}: the shard changed after make-dataset "
                "wrote it; write the dataset again"
            )
    return out


def split_window(windows: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    w = torch.from_numpy(windows)
    return w[:, :-1].contiguous(), w[:, 1:].contiguous()


# --- the kind of dataset (data/kinds.py) ------------------------------------------------------


def synthetic_tokens(cfg) -> TokenDataset:  # dataset=synthetic
    return TokenDataset.synthetic(cfg.vocab_size or GPT2_VOCAB, SYNTHETIC_TOKENS, cfg.seed)


def token_splits(dataset: TokenDataset, cfg, spec) -> Splits:
    """Windows of the model's context length + 1 tokens, drawn at random positions as a function
    of (seed, step, micro-step, rank); validation windows tile the val split. The model's info
    records which tokenizer made the ids (`evaluate` compares it with another dataset's)."""
    block = spec.context_length(cfg)
    tokenizer = {"tokenizer": dataset.tokenizer, "tokenizer_sha256": dataset.tokenizer_sha256}
    return Splits(
        train=None,
        val=ValidationWindows(
            [len(s) for s in dataset.val],
            block,
            lambda starts, length: gather(dataset.val, starts, length, dataset.vocab_size),
        ),
        info=DataInfo(
            "tokens", dataset.fingerprint, vocab_size=dataset.vocab_size, details=tokenizer
        ),
        draw=lambda seed, step, micro, rank, batch_size: dataset.train_batch(
            seed, step, micro, rank, batch_size, block
        ),
        files=dataset.digests,
        draw_many=lambda seed, keys, rank, batch_size: dataset.train_batches(
            seed, keys, rank, batch_size, block
        ),
    )


def read_windows(
    dataset: TokenDataset, seed: int, step: int, micro: int, rank: int, batch_size: int, block: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """nanoGPT's get_batch over the package's windows of (seed, step, micro, rank): the shards
    memory-mapped again at every batch (as nanoGPT does, against a memory leak), each window of
    block + 1 tokens sliced from its shard, converted to int64 and stacked."""
    shards = [
        np.memmap(s.path, dtype=s.dtype, mode="r") if isinstance(s, ShardFile) else s
        for s in dataset.train
    ]
    ends = np.cumsum([len(s) for s in shards])
    rows = []
    for start in dataset.window_starts(seed, step, micro, rank, batch_size, block).tolist():
        shard = int(np.searchsorted(ends, start, side="right"))
        local = start - int(ends[shard]) + len(shards[shard])
        rows.append(shards[shard][local : local + block + 1])
    x = torch.stack([torch.from_numpy(row[:-1].astype(np.int64)) for row in rows])
    y = torch.stack([torch.from_numpy(row[1:].astype(np.int64)) for row in rows])
    return x, y


def inline_windows(cfg):
    """benchmark's inline loop reads the run's windows as nanoGPT's get_batch does: the run's
    token dataset opened again, read_windows over it."""
    if cfg.dataset == "synthetic":
        dataset = synthetic_tokens(cfg)
    else:
        dataset = TokenDataset.open(Path(cfg.dataset))
    return functools.partial(read_windows, dataset)


def tokenizer_identity(details: dict) -> str | None:
    """Which tokenizer made a token dataset's ids, from its DataInfo details: "bytes",
    "huggingface sha256:...", or None where nothing says (ids made elsewhere, synthetic)."""
    kind, digest = details.get("tokenizer"), details.get("tokenizer_sha256")
    if kind == "bytes":
        return kind
    return f"{kind} sha256:{digest}" if digest else None


@dataclass
class TokenKeys(VocabularyKeys):
    """The tokens kind's own config keys (`KIND.keys`): the vocabulary's, and whether a run may
    start from weights trained on another tokenizer's ids (`source_ids`)."""

    init_new_vocabulary: bool = key(False, "init_from a run trained on another tokenizer: "
                                    "take its weights for a new vocabulary on purpose")  # fmt: skip


def source_ids(checkpoint: Path, theirs: dict, ours: dict, cfg) -> str:
    """init_from a run trained on token data (`DatasetKind.source_ids`): which tokenizer made its
    ids against which made this run's, from their DataInfo details. Another one is refused
    unless init_new_vocabulary=true, which the log then states ("" when the same, or when
    either side made its ids elsewhere: "external", synthetic)."""
    was, now = tokenizer_identity(theirs), tokenizer_identity(ours)
    if was is None or now is None or was == now:
        return ""
    what = f"{checkpoint} was trained on ids of another tokenizer ({was}; this run's: {now})"
    if not cfg.init_new_vocabulary:
        raise ConfigError(
            f"{what}: the same id would be another word. Tokenise the data with the source's "
            "tokenizer, or set init_new_vocabulary=true to start a new vocabulary from these "
            "weights on purpose"
        )
    log.warning("init_new_vocabulary=true: %s; its embedding rows now mean this run's tokens", what)
    return "; init_new_vocabulary: another tokenizer's ids"


def validation_text(directory: Path) -> Iterator[str]:
    """The validation split as text (evaluate --print-split), decoded by the tokenizer that made
    it, in pieces of at most TEXT_PIECE tokens, each cut after a document's end where one is (so
    that no character is split in two)."""
    tokens = TokenDataset.open(directory)
    if tokens.tokenizer == "external":
        raise ConfigError(
            f"evaluate --print-split: dataset {directory} holds pre-tokenised ids (make-dataset "
            "--tokens): it has no tokenizer to make text of them"
        )
    codec = recorded_codec(Path(directory), read_token_index(directory))
    for shard in tokens.val:
        ids = np.asarray(shard)
        start = 0
        while start < len(ids):
            stop = min(start + TEXT_PIECE, len(ids))
            ends = np.flatnonzero(ids[start:stop] == codec.separator)
            if stop < len(ids) and len(ends):
                stop = start + int(ends[-1]) + 1
            yield codec.decode(ids[start:stop].tolist())
            start = stop


KIND = DatasetKind(
    name="tokens",
    format=FORMAT,
    open=lambda directory, cfg, spec: token_splits(TokenDataset.open(directory), cfg, spec),
    synthetic=lambda cfg, spec: token_splits(synthetic_tokens(cfg), cfg, spec),
    keys=TokenKeys,
    synthetic_keys=("vocab_size",),
    source_ids=source_ids,
    inline_windows=inline_windows,
    as_text=validation_text,
)
