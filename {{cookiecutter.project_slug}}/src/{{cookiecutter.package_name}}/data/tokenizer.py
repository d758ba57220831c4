"""Tokenizers as a run reads them: the byte-level one (UTF-8 bytes, vocabulary 256), Hugging Face
tokenizers (the optional `[data]` extra: a `tokenizer.json`, its end-of-document token, a chat
template), and the codec `generate` encodes and decodes with. Which tokenizer a dataset
recorded is data/recorded_tokenizer.py's; training one is make_dataset/tokenizer.py's.

`import tokenizers` happens inside the functions: the package runs on torch and numpy alone.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..config_keys import first_line, key, optional_import
from .directory import DatasetError, file_sha256

BYTE_VOCAB = 256  # the byte-level tokenizer: an id per byte
DOCUMENT_END = 0  # the byte-level tokenizer: the token after every document
TOKENIZER_FILE = "tokenizer.json"
# What a Hugging Face tokenizer directory holds beside tokenizer.json (save_pretrained's files):
# the special tokens, the chat template, the generation defaults. make-dataset --tokenizer DIR
# keeps those DIR has in the dataset; export --format hf writes them beside the model.
COMPANION_FILES = (
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "chat_template.json",
    "generation_config.json",
)
SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "pad_token")
# End-of-document tokens of common tokenizers, tried in this order when the tokenizer's own
# tokenizer_config.json (next to tokenizer.json) names no eos_token: GPT-2/Qwen, Llama 3,
# Llama 2/Mistral, Gemma.
SEPARATORS = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>")


@dataclass
class VocabularyKeys:
    """The config key of the vocabulary, the token and chat kinds' (`KIND.keys`): the GPT's
    embedding rows and synthetic tokens read it (`cfg.vocab_size`)."""

    vocab_size: int = key(0, "a language model's vocabulary (0: the dataset's; synthetic: 50257)",
                          bounds=(0, 2**24), resume=True)  # fmt: skip


def encode_bytes(text: str) -> np.ndarray:
    """Text -> its UTF-8 bytes as uint16 tokens (vocabulary 256)."""
    return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.uint16)


def decode_bytes(tokens) -> str:
    """Tokens -> text; bytes that are not valid UTF-8 (and ids > 255) become U+FFFD."""
    values = np.asarray(tokens, dtype=np.int64).reshape(-1)
    values = np.where((values >= 0) & (values < BYTE_VOCAB), values, 0xFF)  # 0xFF: never UTF-8
    return values.astype(np.uint8).tobytes().decode("utf-8", errors="replace")


def tokenizer_file(path: Path) -> Path:
    """A tokenizer.json file, or a pretrained directory holding one."""
    path = Path(path)
    file = path / TOKENIZER_FILE if path.is_dir() else path
    if not file.is_file():
        where = f"{path}: no {TOKENIZER_FILE} in this directory" if path.is_dir() else f"{path}"
        raise DatasetError(
            f"{where}: not found; give a Hugging Face tokenizer.json or a directory holding one "
            "(a tokenizer saved only as a SentencePiece model must be converted first)"
        )
    return file


def tokenizer_record(directory: Path, source: Path) -> dict:
    """The index.json entry of the tokenizer a dataset keeps beside its ids (make-dataset writes
    it, data/recorded_tokenizer.py reads it): its tokenizer.json and the COMPANION_FILES in
    `directory`, each with its sha256 (export carries them, and refuses one changed since), and
    where it came from."""
    companions = {
        name: file_sha256(directory / name)
        for name in COMPANION_FILES
        if (directory / name).is_file()
    }
    return {
        "name": TOKENIZER_FILE,
        "sha256": file_sha256(directory / TOKENIZER_FILE),
        "source": str(source),
        "companions": companions,
    }


def companion_files(file: Path) -> list[Path]:
    """The COMPANION_FILES beside the tokenizer.json `file` (those that exist)."""
    return [
        Path(file).parent / name for name in COMPANION_FILES if (Path(file).parent / name).is_file()
    ]


def load_tokenizer(path: Path):
    """(the `tokenizers.Tokenizer`, its tokenizer.json path)."""
    file = tokenizer_file(path)
    tokenizers = optional_import("tokenizers", "data", f"the tokenizer {file}", DatasetError)
    try:
        return tokenizers.Tokenizer.from_file(str(file)), file
    except Exception as err:  # the Rust side raises plain Exception for a bad file
        raise DatasetError(f"{file}: not a readable tokenizer.json: {first_line(err)}") from None


def load_chat_tokenizer(path: Path, template_file: Path | None):
    """A transformers tokenizer with a chat template: a tokenizer directory (tokenizer.json,
    tokenizer_config.json, chat_template.jinja) or a tokenizer.json; `template_file` replaces
    or provides the template. Code in the directory (an `auto_map`) is never run, and
    transformers never asks whether to run it: a tokenizer only such code loads is refused."""
    transformers = optional_import("transformers", "hf", "make-dataset --chat", DatasetError)
    path = Path(path)
    try:
        if path.is_dir():
            tokenizer = transformers.AutoTokenizer.from_pretrained(
                path, local_files_only=True, trust_remote_code=False
            )
        elif path.is_file():
            tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_file=str(path))
        else:
            raise DatasetError(f"{path}: no such tokenizer file or directory")
    except DatasetError:
        raise
    except Exception as err:  # transformers' and the Rust side's many error types
        if custom := custom_code(path):
            raise DatasetError(
                f"{path / 'tokenizer_config.json'}: its tokenizer is custom code ({custom}), "
                "which this package does not run (trust_remote_code=False); use a tokenizer "
                "transformers loads by itself (tokenizer.json)"
            ) from None
        raise DatasetError(f"{path}: not a readable tokenizer: {first_line(err)}") from None
    if template_file is not None:
        try:
            tokenizer.chat_template = Path(template_file).read_text()
        except (OSError, UnicodeDecodeError) as err:
            raise DatasetError(f"{template_file}: cannot read: {err}") from None
    if not tokenizer.chat_template:
        raise DatasetError(
            f"{path}: the tokenizer has no chat template; give one with --chat-template FILE "
            "(a Jinja template, e.g. the chat_template.jinja of the model's instruct version)"
        )
    return tokenizer


def custom_code(directory: Path) -> str:
    """The classes a tokenizer directory's `auto_map` names ("" without one)."""
    try:
        settings = json.loads((directory / "tokenizer_config.json").read_text())
        return ", ".join(str(c) for c in settings["auto_map"]["AutoTokenizer"] if c)
    except Exception:  # no such file, not JSON, no auto_map: nothing names custom code
        return ""


def vocabulary_size(tokenizer) -> int:
    """Ids run from 0 to the largest id of the vocabulary and the added tokens."""
    return max(tokenizer.get_vocab(with_added_tokens=True).values()) + 1


def document_separator(tokenizer, file: Path, name: str | None = None) -> tuple[str, int]:
    """(token, id) written after every document: `name` if given, else the eos_token of the
    tokenizer_config.json beside `file`, else the first of SEPARATORS the vocabulary has."""
    if name is None:
        config = Path(file).parent / "tokenizer_config.json"
        try:
            eos = json.loads(config.read_text()).get("eos_token")
            name = eos.get("content") if isinstance(eos, dict) else eos
        except (OSError, ValueError, AttributeError):
            name = None
    candidates = [name] if name else list(SEPARATORS)
    for token in candidates:
        token_id = tokenizer.token_to_id(token)
        if token_id is not None:
            return token, int(token_id)
    if name:
        raise DatasetError(f"{file}: the end-of-document token {name!r} is not in the vocabulary")
    raise DatasetError(
        f"{file}: defines none of the usual end-of-document tokens {list(SEPARATORS)}; "
        "name the token that ends a document with --separator TOKEN"
    )


def decode(tokenizer, ids) -> str:
    """Ids -> text, special tokens (the document ends) kept visible."""
    return tokenizer.decode([int(i) for i in ids], skip_special_tokens=False)


class TextCodec:
    """Text <-> ids for `generate`: the Hugging Face tokenizer a dataset was made with, or bytes.
    `vocab_size` limits sampling to real ids (the model's vocabulary is padded)."""

    def __init__(self, tokenizer=None, separator: int = 0):
        self.tokenizer, self.separator = tokenizer, separator
        self.vocab_size = vocabulary_size(tokenizer) if tokenizer is not None else BYTE_VOCAB

    def encode(self, text: str) -> list[int]:
        if self.tokenizer is None:
            ids = encode_bytes(text).tolist()
        else:
            ids = self.tokenizer.encode(text, add_special_tokens=False).ids
        return ids or [self.separator]  # an empty prompt starts a new document

    def decode(self, ids) -> str:
        return decode_bytes(ids) if self.tokenizer is None else decode(self.tokenizer, ids)


def unchanged(file: Path, sha256: str) -> Path:
    """`file` of a dataset, refused when it is not the one index.json recorded (swapped after
    the dataset was written: the same ids would mean other words)."""
    if file.is_file() and file_sha256(file) != sha256:
        raise DatasetError(f"{file}: changed since the dataset was written (sha256 differs)")
    return file


def special_tokens(files: dict[str, Path], document_end: int | None) -> dict[str, str]:
    """bos/eos/unk/pad token -> its text, as the tokenizer's own tokenizer_config.json (or
    special_tokens_map.json) names them; a tokenizer without them (a bare tokenizer.json,
    train-tokenizer's BPE) gets its end-of-document token as eos and bos, as GPT-2's has."""
    named: dict[str, str] = {}
    for name in ("special_tokens_map.json", "tokenizer_config.json"):
        if name in files:
            settings = json.loads(files[name].read_text())
            for key in SPECIAL_TOKENS:
                value = settings.get(key)
                value = value.get("content") if isinstance(value, dict) else value
                if isinstance(value, str):
                    named[key] = value
    if named or document_end is None:
        return named
    tokenizer, _ = load_tokenizer(files[TOKENIZER_FILE])
    end = tokenizer.id_to_token(document_end)
    return {"bos_token": end, "eos_token": end} if end is not None else {}


def recorded_codec(directory: Path, index: dict) -> TextCodec:
    """The codec of a token or chat dataset: the tokenizer its index.json (`index`, read and
    checked) records, unchanged since, or bytes."""
    recorded = index.get("tokenizer_file")
    if index.get("tokenizer") != "huggingface" or not recorded:
        return TextCodec()
    file = unchanged(directory / recorded["name"], recorded["sha256"])
    tokenizer, _ = load_tokenizer(file)
    return TextCodec(tokenizer, int(index.get("document_end") or 0))
