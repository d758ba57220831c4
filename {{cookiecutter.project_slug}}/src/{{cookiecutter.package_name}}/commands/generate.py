"""`python -m <pkg> generate run_dir=DIR --prompt TEXT --tokens N`: sample from the newest
checkpoint of a language-model run (any model whose spec's task generates), on CPU or GPU, in
one process (a sharded checkpoint is read whole).

Prompts and output are encoded and decoded with the Hugging Face tokenizer the run's dataset was
made with (`make-dataset --hf`, recorded in its index.json; `--tokenizer PATH` to choose one), and
as bytes for byte-level datasets (`make-dataset --stdlib/--text`).
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
from collections.abc import Iterator
from pathlib import Path

import torch

from ..checkpoint import load_model_state
from ..config.settings import ConfigError, saved_config
from ..config_keys import first_line, integer_option, number_option
from ..data.directory import file_sha256
from ..data.info import DataInfo, saved_data_info
from ..data.recorded_tokenizer import check_run_tokenizer, recorded_tokenizer_sha256, text_codec
from ..data.tokenizer import load_chat_tokenizer, tokenizer_file
from ..models import spec_of
from ..models.spec import sample
from . import PROG
from .arguments import run_dir_argument

log = logging.getLogger(__name__.split(".")[0])


MAX_TOKENS = 100_000  # a typo such as --tokens 1e9 is refused instead of running for days


def check_arguments(prompt: str, n_tokens: int, temperature: float, top_k: int | None) -> None:
    if not 1 <= n_tokens <= MAX_TOKENS:
        raise ConfigError(f"generate needs 1 <= --tokens <= {MAX_TOKENS}; got {n_tokens}")
    if not (math.isfinite(temperature) and temperature >= 0):
        raise ConfigError(f"generate needs a finite --temperature >= 0; got {temperature}")
    if top_k is not None and top_k < 1:
        raise ConfigError(f"generate needs --top-k >= 1; got {top_k}")
    if not prompt:
        raise ConfigError("generate needs a --prompt of at least one character to continue")


def check_codec(codec, info: DataInfo, cfg, tokenizer: Path | None) -> None:
    """The codec's ids must be the model's: refuse a larger vocabulary (its ids index past the
    embedding), warn about a tokenizer the run was not trained with (other words, same ids)."""
    if codec.vocab_size > info.vocab_size:
        raise ConfigError(
            f"the tokenizer has {codec.vocab_size} ids but the model was trained on "
            f"{info.vocab_size}: use the tokenizer of the run's dataset ({cfg.dataset})"
        )
    if tokenizer is None:
        return
    recorded = recorded_tokenizer_sha256(cfg.dataset)
    if recorded != file_sha256(tokenizer_file(tokenizer)):
        trained = "byte tokens" if recorded is None else "another tokenizer"
        log.warning(
            "%s is not the tokenizer the run was trained with (%s, dataset %s): the ids are "
            "the model's, the words may not be",
            tokenizer,
            trained,
            cfg.dataset,
        )


def encode_prompt(codec, prompt: str, tokenizer: Path | None) -> list[int]:
    try:
        return codec.encode(prompt)
    except Exception as err:  # the tokenizers library raises plain Exception (no [UNK] token)
        raise ConfigError(
            f"the tokenizer {tokenizer or 'of the run'} cannot encode the prompt: {first_line(err)}"
        ) from None


def stream(
    run_dir: Path,
    prompt: str,
    n_tokens: int,
    temperature: float = 0.8,
    top_k: int | None = 200,
    device: str = "auto",
    seed: int = 0,
    tokenizer: Path | None = None,
    chat: bool = False,
) -> Iterator[str]:
    """The prompt, then the sampled text piece by piece as it is generated (one token at a
    time: a caller that stops early, e.g. on Ctrl-C, keeps what it has). `chat`: the prompt is
    a user's message, given to the model in the chat template of its tokenizer."""
    check_arguments(prompt, n_tokens, temperature, top_k)
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError(
            "--device cuda: no GPU is usable here (torch "
            f"{torch.__version__}, CUDA build: {torch.version.cuda or 'no'}); use --device cpu"
        )
    values, state = load_model_state(Path(run_dir))
    cfg = saved_config(values)
    spec = spec_of(cfg)
    if not spec.task.generates:
        raise ConfigError(
            f"{run_dir} trained model={cfg.model!r}, a {spec.task.name}; generate needs a "
            "language model"
        )
    info = saved_data_info(values, run_dir)
    model = spec.build(cfg, info)
    model.load_state_dict(state)
    use_cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
    target = torch.device("cuda" if use_cuda else "cpu")
    model.to(target).eval()
    if tokenizer is None:  # the dataset's: still the run's?
        check_run_tokenizer(cfg.dataset, info.fingerprint)
    codec = text_codec(cfg.dataset, tokenizer, info.vocab_size)
    check_codec(codec, info, cfg, tokenizer)
    stop = None  # a chat's answer ends at the template's end-of-turn token (eos)
    if chat:
        prompt, stop = chat_prompt(prompt, Path(tokenizer or tokenizer_file(cfg.dataset)))
    ids = torch.tensor([encode_prompt(codec, prompt, tokenizer)], dtype=torch.int64, device=target)
    generator = torch.Generator(target).manual_seed(seed)
    shown = text = codec.decode(ids[0].tolist())
    yield shown
    context = spec.context_length(cfg)
    for _ in range(n_tokens):
        # only the tokenizer's ids are text (the rest is padding of the vocabulary)
        ids = sample(model, ids, 1, context, temperature, top_k, generator, codec.vocab_size)
        text = codec.decode(ids[0].tolist())
        # hold back an incomplete character (the bytes of one may span several tokens)
        ready = text.rstrip("\ufffd") if text.startswith(shown) else shown
        if len(ready) > len(shown):
            yield ready[len(shown) :]
            shown = ready
        if stop is not None and int(ids[0, -1]) == stop:
            break
    if len(text) > len(shown) and text.startswith(shown):
        yield text[len(shown) :]


def chat_prompt(message: str, tokenizer: Path) -> tuple[str, int | None]:
    """`message` as a user's turn in the chat template of the tokenizer (a directory, or the
    one holding the tokenizer.json: a chat dataset's), up to where the answer starts; and the
    id of the token that ends the answer (the tokenizer's eos)."""
    from ..make_dataset.chat_worker import rendered_within  # a dataset's template is code

    turn = [{"role": "user", "content": message}]
    directory = tokenizer if tokenizer.is_dir() else tokenizer.parent
    chat = load_chat_tokenizer(directory, None)
    prompt = rendered_within(
        lambda: chat.apply_chat_template(turn, tokenize=False, add_generation_prompt=True),
        f"{directory}: its chat template",
    )
    return prompt, chat.eos_token_id


def generate(run_dir: Path, prompt: str, n_tokens: int, *args, **kwargs) -> str:
    """The prompt and its continuation as one string (see `stream`)."""
    return "".join(stream(run_dir, prompt, n_tokens, *args, **kwargs))


def add_arguments(cmd: argparse.ArgumentParser) -> None:
    cmd.add_argument("run", type=run_dir_argument, metavar="run_dir=DIR", help="the run directory")
    prompt = cmd.add_mutually_exclusive_group()
    prompt.add_argument("--prompt", default="\n", help="text to continue")
    prompt.add_argument(
        "--chat", metavar="MESSAGE", help="a user's message, in the tokenizer's chat template"
    )
    cmd.add_argument(
        "--tokens", type=integer_option, default=200, help="number of tokens to generate"
    )
    cmd.add_argument("--temperature", type=number_option, default=0.8)
    cmd.add_argument("--top-k", type=integer_option, default=200)
    cmd.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    cmd.add_argument("--seed", type=integer_option, default=0)
    cmd.add_argument(
        "--tokenizer", type=Path, help="tokenizer.json (default: the one in the run's dataset)"
    )


def run(args: argparse.Namespace) -> int:
    """Print the text as it is sampled; Ctrl-C stops and keeps what was printed."""
    pieces = stream(
        args.run,
        args.prompt if args.chat is None else args.chat,
        args.tokens,
        args.temperature,
        args.top_k,
        args.device,
        args.seed,
        args.tokenizer,
        args.chat is not None,
    )
    printed = False
    try:
        for piece in pieces:
            print(piece, end="", flush=True)
            printed = True
    except KeyboardInterrupt:
        print(flush=True)
        what = "the text above is what was sampled" if printed else "nothing was sampled yet"
        print(f"{PROG} generate: stopped (Ctrl-C); {what}", file=sys.stderr)
        return 130
    print()
    return 0
