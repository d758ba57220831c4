"""The tokenizer a token or chat dataset recorded (its index.json's `tokenizer_file`, kept in the
dataset's directory with its companions): the codec of a run trained on it (`generate`), the
files `export --format hf` writes beside the model, and a check that the directory still holds
the run's data. Loading and decoding are data/tokenizer.py's."""

from __future__ import annotations

from pathlib import Path

from .chat import FORMAT as CHAT_FORMAT
from .chat import read_chat_index
from .directory import DatasetError, read_json
from .tokenizer import (
    BYTE_VOCAB,
    TOKENIZER_FILE,
    TextCodec,
    load_tokenizer,
    recorded_codec,
    unchanged,
)
from .tokens import read_token_index


def dataset_index(directory: Path) -> dict:
    """index.json of a token or a chat dataset: both record their tokenizer alike."""
    try:
        found = read_json(directory / "index.json").get("format")
    except (OSError, ValueError, AttributeError, RecursionError):
        found = None  # read_index names the problem
    return read_chat_index(directory) if found == CHAT_FORMAT else read_token_index(directory)


def recorded_tokenizer_sha256(dataset: str) -> str | None:
    """The sha256 of the tokenizer.json a dataset was made with; None for bytes (or when the
    dataset is not here to say)."""
    directory = Path(dataset)
    if dataset == "synthetic" or not (directory / "index.json").is_file():
        return None
    recorded = dataset_index(directory).get("tokenizer_file") or {}
    return recorded.get("sha256")


def check_run_tokenizer(dataset: str, fingerprint: str) -> None:
    """The tokenizer in a run's dataset directory is the run's only while the directory holds
    the data the run trained on (`fingerprint`, from its checkpoint): a dataset remade there
    with another tokenizer has the same ids and other words. Byte datasets need no tokenizer."""
    directory = Path(dataset)
    if dataset == "synthetic" or not (directory / "index.json").is_file():
        return
    index = dataset_index(directory)
    if index.get("tokenizer_file") and index.get("fingerprint") != fingerprint:
        raise DatasetError(
            f"{dataset} no longer holds the data the run trained on (fingerprint "
            f"{fingerprint[:12]} -> {str(index.get('fingerprint'))[:12]}): its tokenizer may "
            "not be the run's; give the run's tokenizer with --tokenizer"
        )


def run_tokenizer_files(dataset: str, fingerprint: str) -> dict[str, Path]:
    """The tokenizer files of a run's dataset, name -> path: tokenizer.json and the companions
    make-dataset kept, each the one the dataset was written with ({} for byte tokens)."""
    check_run_tokenizer(dataset, fingerprint)
    directory = Path(dataset)
    if dataset == "synthetic" or not (directory / "index.json").is_file():
        return {}
    recorded = dataset_index(directory).get("tokenizer_file")
    if not recorded:
        return {}
    files = {TOKENIZER_FILE: unchanged(directory / recorded["name"], recorded["sha256"])}
    for name, sha256 in (recorded.get("companions") or {}).items():
        files[name] = unchanged(directory / name, sha256)
    missing = [str(path) for path in files.values() if not path.is_file()]
    if missing:
        raise DatasetError(f"{missing[0]}: the dataset's tokenizer file is gone")
    return files


def text_codec(dataset: str, tokenizer_path: Path | None = None, model_vocab: int = 0) -> TextCodec:
    """The codec of a run trained on `dataset` (its config value): `tokenizer_path` if given,
    else the tokenizer.json recorded in the dataset's index.json, else bytes (byte datasets)."""
    if tokenizer_path is not None:
        return TextCodec(load_tokenizer(tokenizer_path)[0])
    directory = Path(dataset)
    if dataset != "synthetic" and not (directory / "index.json").is_file():
        if model_vocab > BYTE_VOCAB:  # not a byte model: bytes would decode nonsense
            raise DatasetError(
                f"{directory}: the run's dataset is not here to give its tokenizer (run from the "
                "directory you trained in, or pass --tokenizer PATH)"
            )
        return TextCodec()
    if dataset == "synthetic":
        return TextCodec()
    return recorded_codec(directory, dataset_index(directory))
