"""`make-dataset --chat SOURCE --tokenizer DIR`: conversations rendered with the tokenizer's chat
template into a chat dataset (its reader: data/chat.py): token ids, a loss mask that selects the
assistant's tokens, and the conversations' lengths.

A conversation is a record with `messages` (OpenAI: `role`, `content`), `conversations`
(ShareGPT: `from`, `value`) or `prompt` and `completion` columns. It is rendered as the model
will see it at inference (`apply_chat_template`), and the loss reads the tokens transformers'
assistant mask marks (chat_template.py says how they are found).

JSONL files are read here, line by line, so that a problem names its line; parquet files, folders
and hub names through `datasets` (as `--hf`), a problem then naming the record.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from ..config_keys import first_line, integer_option
from ..data.chat import FORMAT, LENGTH_DTYPE, MASK_DTYPE, VAL_EVERY, file_names
from ..data.directory import (
    DatasetError,
    check_out,
    json_error,
    record_samples,
    token_dtype,
    written,
)
from ..data.tokenizer import load_chat_tokenizer, tokenizer_file, tokenizer_record
from .chat_template import control_tokens, template_name
from .chat_worker import template_worker
from .hf_datasets import open_source
from .sources import DatasetSource

ROLES = {"system": "system", "user": "user", "assistant": "assistant"}
SHAREGPT_ROLES = {"human": "user", "gpt": "assistant", **ROLES}
RENDER_BATCH = 256  # conversations tokenised in one call of the tokenizer


# --- reading conversations -------------------------------------------------------------------


def records(source: str, split: str) -> Iterator[tuple[str, dict]]:
    """(where, record) of each conversation: `file:line` of a JSONL file, else `SOURCE record N`."""
    path = Path(source).expanduser()
    if path.is_file() and path.suffix.lower() == ".jsonl":
        yield from jsonl_records(path)
        return
    dataset, _ = open_source(source, split)
    number = 0
    try:
        for record in dataset:
            yield f"{source} record {number}", record
            number += 1
    except DatasetError:
        raise
    except Exception as err:  # a corrupt file, a lost connection
        raise DatasetError(f"{source}: cannot read record {number}: {first_line(err)}") from None


def jsonl_records(path: Path) -> Iterator[tuple[str, dict]]:
    """(`file:line`, record) of each line of a JSONL file; a line that is not UTF-8 JSON (a
    latin-1 line, JSON nested too deeply to read) is one line naming file:line. A UTF-8 byte
    order mark before the first line is skipped."""
    try:
        with open(path, "rb") as lines:
            for number, line in enumerate(lines, 1):
                where = f"{path}:{number}"
                try:
                    text = line.decode("utf-8-sig" if number == 1 else "utf-8")
                    record = json.loads(text) if text.strip() else None
                except UnicodeDecodeError as err:  # a ValueError: first
                    why = f"not UTF-8 text ({err.reason} at byte {err.start})"
                    raise DatasetError(f"{where}: {why}") from None
                except (ValueError, RecursionError) as err:
                    raise DatasetError(f"{where}: not a JSON line ({json_error(err)})") from None
                if text.strip() and not isinstance(record, dict):
                    raise DatasetError(f"{where}: not a JSON object")
                if record is not None:
                    yield where, record
    except OSError as err:
        raise DatasetError(f"{path}: cannot read: {err.strerror or err}") from None


def messages_of(record: dict, where: str) -> list[dict]:
    """The record's conversation as [{"role", "content"}], checked: an optional system message,
    then user and assistant turns alternating, from a user turn; at least one answer."""
    if "messages" in record:
        turns = [
            turn_of(m, "role", "content", ROLES, where) for m in listed(record, "messages", where)
        ]
    elif "conversations" in record:
        turns = [
            turn_of(m, "from", "value", SHAREGPT_ROLES, where)
            for m in listed(record, "conversations", where)
        ]
    elif "prompt" in record and "completion" in record:
        turns = [
            {"role": "user", "content": record["prompt"]},
            {"role": "assistant", "content": record["completion"]},
        ]
    else:
        raise DatasetError(
            f"{where}: no conversation: columns {sorted(record)}; expected messages (role, "
            "content), conversations (from, value), or prompt and completion"
        )
    for turn in turns:
        if not isinstance(turn["content"], str) or not turn["content"].strip():
            raise DatasetError(f"{where}: a {turn['role']} message has empty or non-text content")
    roles = [turn["role"] for turn in turns]
    body = roles[1:] if roles[:1] == ["system"] else roles
    expected = ["user", "assistant"] * len(body)
    if body != expected[: len(body)]:
        raise DatasetError(
            f"{where}: roles out of order ({', '.join(roles)}); expected an optional system "
            "message, then user and assistant turns alternating"
        )
    if "assistant" not in body:
        raise DatasetError(f"{where}: the conversation has no assistant turn (nothing to learn)")
    return turns


def listed(record: dict, column: str, where: str) -> list:
    value = record[column]
    if not isinstance(value, list) or not value:
        raise DatasetError(f"{where}: {column} is not a non-empty list of messages")
    return value


def turn_of(message, role_key: str, text_key: str, roles: dict, where: str) -> dict:
    if not isinstance(message, dict) or role_key not in message or text_key not in message:
        raise DatasetError(f"{where}: a message without {role_key!r} and {text_key!r}: {message!r}")
    role = message[role_key]
    if role not in roles:
        raise DatasetError(f"{where}: unknown role {role!r}; accepted: {', '.join(roles)}")
    return {"role": roles[role], "content": message[text_key]}


# --- writing ---------------------------------------------------------------------------------


class SplitWriter:
    """One split's three files: tokens, mask (1: a token the loss reads), lengths."""

    def __init__(self, directory: Path, split: str, dtype: np.dtype):
        self.directory, self.split, self.dtype = directory, split, dtype
        self.names = file_names(split)
        self.handles = {part: open(directory / name, "wb") for part, name in self.names.items()}
        self.conversations = self.tokens = self.targets = self.max_id = 0

    def write(self, ids: np.ndarray, mask: np.ndarray) -> None:
        self.handles["tokens"].write(ids.astype(self.dtype).tobytes())
        self.handles["mask"].write(mask.astype(MASK_DTYPE).tobytes())
        self.handles["lengths"].write(np.array([len(ids)], LENGTH_DTYPE).tobytes())
        self.conversations += 1
        self.tokens += len(ids)
        self.targets += int(mask[1:].sum())  # the first token has nothing before it
        self.max_id = max(self.max_id, int(ids.max()))

    def close(self) -> dict:
        for handle in self.handles.values():
            handle.close()
        if not self.conversations:
            raise DatasetError(
                f"no {self.split} conversations: every {VAL_EVERY}th conversation is a "
                f"validation one, so at least {VAL_EVERY} are needed"
            )
        files = {
            part: {"name": name, "bytes": (self.directory / name).stat().st_size}
            for part, name in self.names.items()
        }
        return {
            "conversations": self.conversations,
            "tokens": self.tokens,
            "targets": self.targets,
            "max_id": self.max_id,
            "files": files,
        }


def fit(ids, mask, max_length: int, too_long: str, counts: dict):
    """The conversation as the window takes it: whole, truncated, or None (dropped)."""
    if len(ids) <= max_length:
        return ids, mask
    if too_long == "truncate" and mask[1:max_length].any():
        counts["truncated"] += 1
        return ids[:max_length], mask[:max_length]
    counts["dropped"] += 1  # too long, or nothing of the answer left after truncation
    return None


def write_chat_dataset(
    source: str,
    tokenizer_path: Path,
    out: Path,
    split: str = "train",
    template_file: Path | None = None,
    train_on_prompt: bool = False,
    too_long: str = "truncate",
    max_length: int = 2048,
) -> dict:
    """Render, tokenise and write the conversations of `source` as a chat dataset at `out`
    (written beside it and renamed at the end: data/directory.py, `written`)."""
    out = Path(out)
    if max_length < 2:
        raise DatasetError(f"--max-length {max_length}: a conversation needs at least 2 tokens")
    check_out(out, "chat dataset")
    tokenizer = load_chat_tokenizer(tokenizer_path, template_file)
    vocab_size = max(tokenizer.get_vocab().values()) + 1  # ids run from 0 to the largest
    dtype = token_dtype(vocab_size, tokenizer_path)

    def write(tmp: Path) -> dict:
        counts = {"truncated": 0, "dropped": 0}
        writers = {}
        try:
            writers = {name: SplitWriter(tmp, name, dtype) for name in ("train", "val")}
            kept_count = 0
            template = template_name(tokenizer_path, template_file)
            for ids, mask in encoded(source, split, tokenizer, train_on_prompt, template):
                kept = fit(ids, mask, max_length, too_long, counts)
                if kept is not None:
                    kept_count += 1
                    writers["val" if kept_count % VAL_EVERY == 0 else "train"].write(*kept)
            if counts["dropped"] and kept_count < VAL_EVERY:
                raise DatasetError(
                    f"{source}: {counts['dropped']} conversations longer than --max-length "
                    f"{max_length} tokens dropped, {kept_count} left: too few to write (at least "
                    f"{VAL_EVERY}); raise --max-length"
                    + (" or use --too-long truncate" if too_long == "drop" else "")
                )
            index = {"format": FORMAT, "dtype": dtype.name, "vocab_size": vocab_size}
            index.update(tokenizer="huggingface", document_end=tokenizer.eos_token_id)
            index["tokenizer_file"] = save_tokenizer(tokenizer, tmp, tokenizer_path)
            index.update(max_length=max_length, train_on_prompt=train_on_prompt, **counts)
            index["train"], index["val"] = writers["train"].close(), writers["val"].close()
        finally:
            for writer in writers.values():
                for handle in writer.handles.values():
                    handle.close()
        files = [entry for name in ("train", "val") for entry in index[name]["files"].values()]
        record_samples(tmp, files, [entry["bytes"] for entry in files])
        index["fingerprint"] = fingerprint(tmp, index)
        index["sources"] = [f"{source} (split {split})"]
        return index

    return written(out, "chat dataset", write)


def encoded(source: str, split: str, tokenizer, train_on_prompt: bool, template: str) -> Iterator:
    """(ids, mask) of every conversation of the source, in its order, rendered and encoded in a
    process bounded in time (chat_worker.py; `template`: the file the chat template came from,
    named when it exceeds its bounds)."""
    batch = []
    with template_worker(tokenizer, train_on_prompt, control_tokens(tokenizer), template) as worker:
        for where, record in records(source, split):
            batch.append((where, messages_of(record, where)))
            if len(batch) == RENDER_BATCH:
                yield from worker.encode(batch)
                batch = []
        if batch:
            yield from worker.encode(batch)


def save_tokenizer(tokenizer, directory: Path, source: Path) -> dict:
    """The tokenizer and its chat template, saved in the dataset (tokenizer.json,
    tokenizer_config.json, chat_template.jinja: generate and export read them there) with the
    source's generation defaults; recorded as make-dataset --tokenizer records them."""
    tokenizer.save_pretrained(directory)
    generation = tokenizer_file(source).parent / "generation_config.json"
    if generation.is_file():
        shutil.copyfile(generation, directory / generation.name)
    return tokenizer_record(directory, source)


def fingerprint(directory: Path, index: dict) -> str:
    """sha256 over the format, dtype, vocabulary, tokenizer and every file's bytes."""
    header = f"{FORMAT} {index['dtype']} vocab_size={index['vocab_size']}\n"
    header += f"tokenizer {index['tokenizer_file']['sha256']}\n"
    digest = hashlib.sha256(header.encode())
    for split in ("train", "val"):
        for part, entry in index[split]["files"].items():
            digest.update(f"{split} {part} {entry['bytes']}\n".encode())
            with open(directory / entry["name"], "rb") as f:
                while block := f.read(1 << 24):
                    digest.update(block)
    return "sha256:" + digest.hexdigest()


# --- command line (sources.py) -----------------------------------------------------------------


def add_arguments(make, source) -> None:
    source.add_argument(
        "--chat",
        metavar="SOURCE",
        help="conversations (messages, conversations or prompt/completion) as --hf reads them, "
        "rendered with the --tokenizer's chat template; the loss reads the answers",
    )
    make.add_argument("--chat-template", type=Path, metavar="FILE", help="with --chat: a Jinja "
                      "chat template for a tokenizer without one")  # fmt: skip
    make.add_argument(
        "--train-on-prompt", action="store_true", help="with --chat: the loss reads every token"
    )
    make.add_argument(
        "--too-long",
        choices=("truncate", "drop"),
        default="truncate",
        help="with --chat: conversations longer than --max-length (default: truncate)",
    )
    make.add_argument(
        "--max-length",
        type=integer_option,
        default=2048,
        help="with --chat: tokens per conversation, at most the model's context (default 2048)",
    )


def make_dataset(args) -> dict:
    if args.tokenizer is None:
        raise DatasetError("make-dataset --chat needs --tokenizer (a tokenizer directory)")
    return write_chat_dataset(
        args.chat,
        args.tokenizer,
        args.out,
        args.split,
        args.chat_template,
        args.train_on_prompt,
        args.too_long,
        args.max_length,
    )


def summary(index: dict, args) -> str:
    train, val = index["train"], index["val"]
    return (
        f"wrote {train['conversations']} training and {val['conversations']} validation "
        f"conversations ({train['tokens']} and {val['tokens']} tokens, {train['targets']} and "
        f"{val['targets']} of them answers the loss reads; {index['truncated']} truncated, "
        f"{index['dropped']} dropped, longer than {index['max_length']} tokens) to {args.out}; "
        f"train with dataset={args.out}"
    )


SOURCES = (DatasetSource("--chat", add_arguments, make_dataset, summary),)
