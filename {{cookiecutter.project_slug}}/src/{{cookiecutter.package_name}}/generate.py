"""`python -m <pkg> generate run_dir=DIR --prompt TEXT --tokens N`: sample from the newest
checkpoint of a language-model run (any model whose spec's task generates), on CPU or GPU, in
one process (a sharded checkpoint is read whole).

Prompts and output are encoded and decoded with the Hugging Face tokenizer the run's dataset was
made with (`make-dataset --hf`, recorded in its index.json; `--tokenizer PATH` to choose one), and
as bytes for byte-level datasets (`make-dataset --stdlib/--text`).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from .checkpoint import load_model_state
from .config import Config, ConfigError
from .data import DataInfo
from .models import spec_of
from .models.spec import sample
from .tokenizer import text_codec


def saved_config(values: dict) -> Config:
    known = {f.name for f in dataclasses.fields(Config)}
    return Config(**{k: v for k, v in values.items() if k in known})


def saved_data_info(values: dict, state: dict) -> DataInfo:
    """The dataset's info the run was built with (recorded in the checkpoint by train.py)."""
    if "data_info" in values:
        return DataInfo(**values["data_info"])
    # Checkpoints written before data_info was recorded: the only language model then was the
    # GPT, whose token embedding holds the (padded) vocabulary.
    return DataInfo("tokens", "", vocab_size=state["wte.weight"].shape[0])


def generate(
    run_dir: Path,
    prompt: str,
    n_tokens: int,
    temperature: float = 0.8,
    top_k: int | None = 200,
    device: str = "auto",
    seed: int = 0,
    tokenizer: Path | None = None,
) -> str:
    if n_tokens < 1 or temperature < 0 or (top_k is not None and top_k < 1):
        raise ConfigError("generate needs --tokens >= 1, --temperature >= 0 and --top-k >= 1")
    if not prompt:
        raise ConfigError("generate needs a --prompt of at least one character to continue")
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
    info = saved_data_info(values, state)
    model = spec.build(cfg, info)
    model.load_state_dict(state)
    use_cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
    target = torch.device("cuda" if use_cuda else "cpu")
    model.to(target).eval()
    codec = text_codec(cfg.dataset, tokenizer, info.vocab_size)
    context = torch.tensor([codec.encode(prompt)], dtype=torch.int64, device=target)
    generator = torch.Generator(target).manual_seed(seed)
    # only the tokenizer's ids are text (the rest is padding of the vocabulary)
    out = sample(
        model,
        context,
        n_tokens,
        spec.context_length(cfg),
        temperature,
        top_k,
        generator,
        codec.vocab_size,
    )
    return codec.decode(out[0].tolist())
