"""The answers' tokens of `make-dataset --chat` (chat.py): conversations rendered with the
tokenizer's chat template (loaded by data/tokenizer.py, without running code from its directory),
and the tokens the loss reads: those transformers' `apply_chat_template(...,
return_assistant_tokens_mask=True)` marks (docs/finetune.md#what-the-loss-reads).

- A template with generation blocks (Jinja's `generation` ... `endgeneration` tags, which
  transformers adds) marks the answers itself, and the mask is transformers' own: every token
  that holds a character the blocks wrote.
- A template without them (most published ones): each assistant turn is what the conversation
  rendered through the turn adds to it rendered up to the turn with the generation prompt (what
  a chat client sends); every token that holds a character of that is the answer's, as
  transformers maps a block's characters to tokens. An answer whose first token begins on the
  prompt's last character (the space of `Assistant: `) keeps that token. A template that
  renders earlier turns differently once later ones follow is refused.

Control tokens typed inside a message (`<|im_end|>` as text) are refused: the tokenizer would
read them as the tokens themselves, a forged turn in the training data.

A conversation rendered to more than RENDER_CHARS characters beyond RENDER_GROWTH times its
messages' text is refused (`RenderedTooLong`); chat_worker.py runs all of this in a process of its
own within a time bound.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from ..config_keys import first_line
from ..data.chat import MASK_DTYPE
from ..data.directory import DatasetError

# A generation tag, as transformers finds one (its chat_template_utils)
GENERATION_BLOCK = re.compile(r"\{\%-?\s*generation\s*-?\%\}")
# A conversation is rendered to at most RENDER_CHARS characters more than RENDER_GROWTH times its
# messages' text (a template adds a few headers, a system prompt, tool descriptions)
RENDER_CHARS = 2**20
RENDER_GROWTH = 16


class RenderedTooLong(Exception):
    """A conversation rendered beyond the bound: (where, its size in words, the limit)."""


def too_long(template: str, where: str, size: str, limit: int) -> str:
    return (
        f"{template}: renders {where} to {size}, more than {limit} characters ({RENDER_GROWTH} "
        f"times its messages' text + {RENDER_CHARS}): the template's strings grow without "
        "bound; fix the template or give another with --chat-template"
    )


def rendering_limit(turns: list[dict]) -> int:
    return RENDER_CHARS + RENDER_GROWTH * message_chars(turns)


def template_name(tokenizer_path: Path, template_file: Path | None) -> str:
    """The file the chat template came from, for messages: --chat-template, else the file of
    the tokenizer's directory that holds it."""
    if template_file is not None:
        return str(template_file)
    for name in ("chat_template.jinja", "chat_template.json", "tokenizer_config.json"):
        if (Path(tokenizer_path) / name).is_file():
            return str(Path(tokenizer_path) / name)
    return f"the chat template of {tokenizer_path}"


def message_chars(turns: list[dict]) -> int:
    return sum(len(turn["content"]) for turn in turns)


def control_tokens(tokenizer) -> re.Pattern | None:
    """The tokenizer's special tokens (`<|im_end|>`, `<|eot_id|>`: those that mark turns), as
    one pattern, the longest first. Added tokens that are not special (`<think>`) are text that
    a chat client's tokenizer reads as the same token, and are kept."""
    special = {t.content for t in tokenizer.added_tokens_decoder.values() if t.special}
    special |= set(tokenizer.all_special_tokens)
    ordered = sorted((s for s in special if s.strip()), key=len, reverse=True)
    return re.compile("|".join(map(re.escape, ordered))) if ordered else None


def check_text(turns: list[dict], controls: re.Pattern | None, where: str) -> None:
    for number, turn in enumerate(turns, 1):
        if controls is not None and (found := controls.search(turn["content"])):
            raise DatasetError(
                f"{where}: message {number} ({turn['role']}) holds {found.group()!r}, a "
                "control token of the tokenizer: it would be read as that token, not as text (a "
                "forged turn); remove it from the data"
            )


def render(tokenizer, turns: list[dict], generation_prompt: bool, where: str) -> str:
    try:
        text = tokenizer.apply_chat_template(
            turns, tokenize=False, add_generation_prompt=generation_prompt
        )
    except MemoryError:  # the template's process's bound (chat_worker.py) says it
        raise
    except Exception as err:  # the template's own raise_exception, a Jinja error
        raise DatasetError(
            f"{where}: the chat template cannot render it: {first_line(err)}"
        ) from None
    if len(text) > (limit := rendering_limit(turns)):
        raise RenderedTooLong(where, f"{len(text)} characters", limit)
    return text


def answer_spans(tokenizer, turns: list[dict], text: str, where: str) -> list[tuple[int, int]]:
    """The character spans of `text` (the whole conversation rendered) that the assistant writes:
    from the end of the rendering up to its turn (with the generation prompt) to the end of the
    rendering through its turn."""
    spans = []
    for i, turn in enumerate(turns):
        if turn["role"] != "assistant":
            continue
        before = render(tokenizer, turns[:i], True, where)
        through = render(tokenizer, turns[: i + 1], False, where)
        if not (text.startswith(before) and text.startswith(through)) or through == before:
            raise DatasetError(
                f"{where}: the chat template renders earlier turns differently once later ones "
                "follow, so the assistant's tokens cannot be found; use --chat-template FILE"
            )
        spans.append((len(before), len(through)))
    return spans


def selected_tokens(offsets: list, spans: list[tuple[int, int]]) -> np.ndarray:
    """1 for each token that holds a character of one of the spans, else 0: transformers' rule,
    the tokens from the one holding a span's first character to the one holding its last."""
    bounds = np.array(offsets, dtype=np.int64).reshape(-1, 2)
    starts, ends = bounds[:, 0], np.maximum(bounds[:, 1], bounds[:, 0] + 1)
    mask = np.zeros(len(bounds), dtype=MASK_DTYPE)
    for begin, end in spans:
        mask[(starts < end) & (ends > begin)] = 1
    return mask


def rendered_answers(tokenizer, batch: list[tuple[str, list[dict]]]):
    """(ids, mask) of each conversation, for a template without generation blocks."""
    texts = [render(tokenizer, turns, False, where) for where, turns in batch]
    spans = [answer_spans(tokenizer, t, text, w) for (w, t), text in zip(batch, texts, strict=True)]
    try:
        encoded = tokenizer(texts, add_special_tokens=False, return_offsets_mapping=True)
    except Exception as err:
        raise DatasetError(
            f"{batch[0][0]}: the tokenizer cannot encode it: {first_line(err)}"
        ) from None
    for ids, offsets, answer in zip(
        encoded["input_ids"], encoded["offset_mapping"], spans, strict=True
    ):
        yield ids, selected_tokens(offsets, answer)


def marked_answers(tokenizer, batch: list[tuple[str, list[dict]]]):
    """(ids, mask) of each conversation, for a template with generation blocks:
    transformers' own mask (one call for the batch: the tokenizer encodes it on every core).
    The rendering is not seen here: a token holds at least one of its characters, so more
    tokens than its bound allows characters is a rendering beyond it."""
    try:
        encoded = tokenizer.apply_chat_template(
            [turns for _, turns in batch],
            tokenize=True,
            return_dict=True,
            return_assistant_tokens_mask=True,
        )
    except Exception as err:
        for where, turns in batch:  # the conversation the template fails on, by its name
            render(tokenizer, turns, False, where)
        raise DatasetError(
            f"{batch[0][0]}: the tokenizer cannot encode it: {first_line(err)}"
        ) from None
    for (where, turns), ids in zip(batch, encoded["input_ids"], strict=True):
        if len(ids) > (limit := rendering_limit(turns)):
            raise RenderedTooLong(where, f"{len(ids)} tokens", limit)
    yield from zip(encoded["input_ids"], encoded["assistant_masks"], strict=True)


def encode_conversations(
    tokenizer, batch: list[tuple[str, list[dict]]], train_on_prompt: bool, controls=None
):
    """(ids, mask) of each conversation of the batch; `controls`: control_tokens(tokenizer)."""
    for where, turns in batch:
        check_text(turns, controls, where)
    marked = GENERATION_BLOCK.search(tokenizer.get_chat_template())  # the default of several
    answers = (marked_answers if marked else rendered_answers)(tokenizer, batch)
    for (where, _), (ids, mask) in zip(batch, answers, strict=True):
        mask = np.asarray(mask, dtype=MASK_DTYPE)
        if train_on_prompt:
            mask[:] = 1
        elif not mask.any():
            raise DatasetError(
                f"{where}: the chat template's generation blocks hold none of its answers "
                "(nothing to learn)"
            )
        yield np.asarray(ids, dtype=np.int64), mask
