"""The chat template's work, bounded: `make-dataset --chat` renders and encodes its conversations
in a process of its own (forked once, so nothing is loaded twice), batch by batch, and waits for
each batch a bounded time. A template is code from the tokenizer's directory, run in Jinja's
sandbox (transformers'): it cannot reach files or Python, but its loops can run for ever and its
strings grow without end, also while Jinja compiles it (`'x' * 10**9` is computed then). A batch
that takes longer than its bound ends the process (SIGKILL: no step of the template can delay
it) and the command, in one line naming the template; a conversation rendered beyond
chat_template.RENDER_CHARS is refused inside the process. Its memory is bounded too (Linux:
RLIMIT_AS, see `memory_bound`): a template whose strings grew reached 7 GB within its time.

The process dies with make-dataset (kill -9 included: PR_SET_PDEATHSIG on Linux), leaves Ctrl-C
and SIGTERM to it, and is killed when the write ends, however it ends. It encodes on one thread
(the parent's tokenizer threads are not in a forked process). `rendered_within` gives generate
--chat's prompt, rendered in a dataset's template, the same bounds.
"""

from __future__ import annotations

import multiprocessing
import os
import resource
import signal
from collections.abc import Iterator
from contextlib import contextmanager

from ..config_keys import first_line
from ..data.directory import DatasetError
from ..run.interrupts import die_with_parent
from .chat_template import (
    RENDER_CHARS,
    RenderedTooLong,
    encode_conversations,
    message_chars,
    too_long,
)

# A batch's bound: RENDER_SECONDS, plus RENDER_SECONDS_PER_MB for each MB of its messages' text
# (tokenizers encode several MB/s on one core; a template adds a few headers per turn)
RENDER_SECONDS = 30.0
RENDER_SECONDS_PER_MB = 10.0
# Its memory: RENDER_MEMORY more than the process holds when the batch comes, plus
# RENDER_MEMORY_PER_CHAR for each character of its messages (the rendered text as Python and
# Rust strings, and the tokens with their offsets, many times over)
RENDER_MEMORY = 2 * 2**30
RENDER_MEMORY_PER_CHAR = 64


def batch_seconds(batch: list[tuple[str, list[dict]]]) -> float:
    mb = sum(message_chars(turns) for _, turns in batch) / 2**20
    return RENDER_SECONDS + RENDER_SECONDS_PER_MB * mb


def batch_memory(batch: list[tuple[str, list[dict]]]) -> int:
    return RENDER_MEMORY + RENDER_MEMORY_PER_CHAR * sum(message_chars(t) for _, t in batch)


@contextmanager
def memory_bound(extra: int) -> Iterator[None]:
    """This process's address space bounded to what it has now plus `extra` bytes (RLIMIT_AS:
    an allocation beyond it raises MemoryError); where /proc/self/statm tells no size (not
    Linux), unbounded."""
    try:
        with open("/proc/self/statm") as statm:
            size = int(statm.read().split()[0]) * resource.getpagesize()
    except OSError:
        yield
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    bound = min([size + extra, *(x for x in (soft, hard) if x != resource.RLIM_INFINITY)])
    resource.setrlimit(resource.RLIMIT_AS, (bound, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def serve(conn, parent_end, parent: int, tokenizer, train_on_prompt: bool, controls) -> None:
    """The process's loop: a batch in, its (ids, mask) or the reason it has none out."""
    parent_end.close()  # so that make-dataset's end is this end's EOF
    dying_with(parent)
    # The tokenizer's thread pool (rayon) of the parent has no threads in a forked child: a
    # parallel encode would wait for them for ever. tokenizers turns its parallelism off after
    # a fork unless TOKENIZERS_PARALLELISM=true says otherwise (make-dataset --hf sets it, and
    # users do, to silence its warning): off here whatever it says.
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    while True:
        try:
            batch = conn.recv()
        except (EOFError, OSError):  # make-dataset closed its end: done
            return
        try:
            with memory_bound(batch_memory(batch)):
                encoded = list(encode_conversations(tokenizer, batch, train_on_prompt, controls))
            answer = ("ok", encoded)
        except DatasetError as err:
            answer = ("error", str(err))
        except RenderedTooLong as err:
            answer = ("too long", err.args)
        except MemoryError:
            answer = ("memory", batch_memory(batch))
        conn.send(answer)


def dying_with(parent: int) -> None:
    """Leave the stop signals to make-dataset, and die with it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    die_with_parent(parent)


class TemplateWorker:
    """The process that renders and encodes; `encode(batch)` waits for it within the bound."""

    def __init__(self, tokenizer, train_on_prompt: bool, controls, template: str):
        context = multiprocessing.get_context("fork")  # the tokenizer as loaded, not again
        self.conn, child_end = context.Pipe()
        self.template = template
        self.process = context.Process(
            target=serve,
            args=(child_end, self.conn, os.getpid(), tokenizer, train_on_prompt, controls),
            daemon=True,
        )
        self.process.start()
        child_end.close()

    def encode(self, batch: list[tuple[str, list[dict]]]) -> list:
        """(ids, mask) of each conversation of the batch, or one DatasetError line."""
        seconds = batch_seconds(batch)
        self.conn.send(batch)
        if not self.conn.poll(seconds):
            self.close()
            raise DatasetError(
                f"{self.template}: rendering and encoding {batch[0][0]} and the "
                f"{len(batch) - 1} conversations after it took more than {seconds:.0f} s: the "
                "template's loops or strings grow without bound; fix the template or give "
                "another with --chat-template"
            )
        try:
            kind, value = self.conn.recv()
        except (EOFError, OSError):
            self.close()
            raise DatasetError(
                f"{self.template}: the process rendering {batch[0][0]} ended (exit status "
                f"{self.process.exitcode}: out of memory?)"
            ) from None
        if kind == "ok":
            return value
        if kind == "too long":
            raise DatasetError(too_long(self.template, *value))
        if kind == "memory":
            raise DatasetError(
                f"{self.template}: rendering and encoding {batch[0][0]} and the "
                f"{len(batch) - 1} conversations after it needed more than {value / 2**30:.1f} "
                "GiB of memory: the template's loops or strings grow without bound; fix the "
                "template or give another with --chat-template"
            )
        raise DatasetError(value)

    def close(self) -> None:
        self.conn.close()
        self.process.kill()
        self.process.join()


def rendered_within(render, where: str, seconds: float | None = None) -> str:
    """`render()`'s text, computed in a forked process within `seconds` (RENDER_SECONDS) and
    RENDER_CHARS characters, as a batch of make-dataset --chat is: a prompt in a dataset's
    template for `generate --chat`. Beyond either bound, one DatasetError line naming `where`."""
    seconds = RENDER_SECONDS if seconds is None else seconds
    context = multiprocessing.get_context("fork")
    receiver, sender = context.Pipe(duplex=False)
    process = context.Process(target=render_into, args=(sender, os.getpid(), render), daemon=True)
    process.start()
    sender.close()
    try:
        if not receiver.poll(seconds):
            raise DatasetError(
                f"{where}: rendering took more than {seconds:.0f} s: the template's loops or "
                "strings grow without bound"
            )
        try:
            kind, value = receiver.recv()
        except (EOFError, OSError):
            raise DatasetError(
                f"{where}: the process rendering it ended (out of memory?)"
            ) from None
    finally:
        receiver.close()
        process.kill()
        process.join()
    if kind == "too long":
        raise DatasetError(f"{where}: rendered to {value} characters, more than {RENDER_CHARS}")
    if kind == "error":
        raise DatasetError(f"{where}: {value}")
    return value


def render_into(sender, parent: int, render) -> None:
    """The forked process of `rendered_within`."""
    dying_with(parent)
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # as in `serve`
    try:
        with memory_bound(RENDER_MEMORY):
            text = render()
        answer = ("ok", text) if len(text) <= RENDER_CHARS else ("too long", len(text))
    except MemoryError:
        answer = ("error", f"rendering it needed more than {RENDER_MEMORY / 2**30:.1f} GiB")
    except Exception as err:  # jinja2's and transformers' many error types
        answer = ("error", first_line(err))
    sender.send(answer)


@contextmanager
def template_worker(tokenizer, train_on_prompt: bool, controls, template: str) -> Iterator:
    worker = TemplateWorker(tokenizer, train_on_prompt, controls, template)
    try:
        yield worker
    finally:
        worker.close()
