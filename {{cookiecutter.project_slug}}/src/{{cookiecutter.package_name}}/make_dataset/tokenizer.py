"""`train-tokenizer`: a byte-level BPE (GPT-2 style: any text, no unknown tokens) trained on your
own text files or on the documents make-dataset --hf would read, saved as a tokenizer.json that
`make-dataset --hf SOURCE --tokenizer FILE` tokenises with (loading one: data/tokenizer.py).

`import tokenizers` happens inside the function: the package runs on torch and numpy alone.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from ..config_keys import optional_import
from ..data.directory import MAX_VOCAB, DatasetError
from ..run.atomic import atomic_write
from .text_files import describe

BPE_SEPARATOR = "<|endoftext|>"  # the one special token of train-tokenizer's BPE (id 0)


def train_tokenizer(
    files: list[Path], vocab_size: int, out: Path, documents: Iterable[list[str]] | None = None
) -> int:
    """Train a byte-level BPE (GPT-2 style: any text, no unknown tokens) of `vocab_size` ids on
    the text files (or on `documents`, batches of texts: make-dataset --hf's sources), with
    `<|endoftext|>` as id 0, and save it to `out` atomically. Returns the vocabulary size reached
    (smaller when the text has too few distinct merges)."""
    if not 257 <= vocab_size <= MAX_VOCAB:
        raise DatasetError(
            f"--vocab-size {vocab_size}: a byte-level BPE needs at least 257 ids "
            "(256 bytes and the end-of-document token)"
        )
    for path in files:
        if not Path(path).is_file():
            raise DatasetError(f"{path}: cannot read: not a file")
    tokenizers = optional_import("tokenizers", "data", "train-tokenizer", DatasetError)
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tokenizer = tokenizers.Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[BPE_SEPARATOR],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    try:
        if documents is None:
            tokenizer.train([str(f) for f in files], trainer)
        else:
            tokenizer.train_from_iterator(documents, trainer)
    except DatasetError:  # a source's own error, already one line
        raise
    except Exception as err:  # e.g. a file that is not UTF-8 text
        raise DatasetError(f"train-tokenizer: cannot train on {describe(files)}: {err}") from None
    out = Path(out)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(out, lambda tmp: tokenizer.save(str(tmp)))
    except Exception as err:  # OSError, or the Rust side's plain Exception for a failed write
        raise DatasetError(
            f"{out}: cannot write: {getattr(err, 'strerror', None) or err}"
        ) from None
    return tokenizer.get_vocab_size()
