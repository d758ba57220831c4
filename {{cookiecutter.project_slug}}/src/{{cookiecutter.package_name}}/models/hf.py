"""`model=hf`: any causal language model that transformers' `AutoModelForCausalLM` builds from a
Hugging Face model directory (`hf_model=DIR`, its config.json): GPT-2, Llama, Qwen2, Mistral...

The model is transformers' own module (attention "sdpa", no KV cache), wrapped so that its
forward maps (batch, time) token ids to (batch, time, vocab) logits as the package's language
models do; its state-dict names are transformers' with the prefix `hf.`. Its decoder layers are
the blocks that FSDP shards one by one, activation checkpointing wraps and `compile=true`
compiles. `build` gives the architecture with new, seeded weights (the same on every rank); a
new run then starts from DIR's own weights (`hf_weights=pretrained`, the default, through
init_from's loader, checkpoint/initial.py) or keeps the random ones (`hf_weights=random`).
The names of DIR's tensors map to the model's by adding the prefix (`from_hf`, `to_hf`);
checkpoint/ reads and writes the files.

transformers is imported only when a run uses model=hf (here, and by checkpoint/hf_format.py for
files whose names do not map one to one): it is the optional extra `[hf]`.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

from ..config_keys import ConfigError, first_line, optional_import
from ..config_keys import key as config_key  # `key` names tensors below
from . import lora, spec

if TYPE_CHECKING:
    from ..data.info import DataInfo

PREFIX = "hf."  # state-dict name = PREFIX + transformers' name


def transformers_module():
    """transformers, or a one-line ConfigError saying how to install it."""
    return optional_import("transformers", "hf", "model=hf")


@functools.lru_cache(maxsize=8)
def _read_config(directory: str):
    transformers = transformers_module()
    path = Path(directory)
    if not (path / "config.json").is_file():
        what = "does not exist" if not path.exists() else "has no config.json"
        raise ConfigError(
            f"config key 'hf_model': {directory} {what} (a Hugging Face model directory holds "
            "config.json and *.safetensors)"
        )
    try:
        config = transformers.AutoConfig.from_pretrained(directory, local_files_only=True)
    except Exception as err:  # unknown model_type, broken JSON: transformers' own words
        raise ConfigError(
            f"config key 'hf_model': transformers {transformers.__version__} cannot read "
            f"{path / 'config.json'}: {first_line(err)}"
        ) from None
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    if type(config) not in MODEL_FOR_CAUSAL_LM_MAPPING:
        raise ConfigError(
            f"config key 'hf_model': {directory} holds a {config.model_type!r} model, which is "
            "not a causal language model (AutoModelForCausalLM does not build it)"
        )
    return config


def hf_config(cfg):
    """The transformers config of `hf_model` (read once per process), checked."""
    if not cfg.hf.hf_model:
        raise ConfigError(
            "config key 'hf_model' is required with model=hf: a Hugging Face model directory "
            "(config.json and *.safetensors)"
        )
    return _read_config(str(Path(cfg.hf.hf_model).expanduser().resolve()))


class HFCausalLM(nn.Module):
    """(batch, time) token ids -> (batch, time, vocab) logits of a transformers causal LM."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.hf = model

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.hf(input_ids=idx, use_cache=False).logits


def build(cfg, info: DataInfo) -> HFCausalLM:
    """The architecture of `hf_model` with new weights from torch's RNG (seeded by the caller),
    in fp32; the dataset's vocabulary must fit in the model's embedding."""
    transformers = transformers_module()
    config = hf_config(cfg)
    check_vocab(config, info)
    model = transformers.AutoModelForCausalLM.from_config(  # a copy: the model changes its own
        copy.deepcopy(config), attn_implementation="sdpa", dtype=torch.float32
    )
    model.config.use_cache = False
    return HFCausalLM(lora.add_adapters(cfg, model))


def check_vocab(config, info: DataInfo) -> None:
    """The dataset's token ids must have rows in the embedding. A larger embedding is accepted
    (padding rows: Qwen2's 151936 rows serve a 151665-token tokenizer); a smaller one is not."""
    if info.vocab_size > config.vocab_size:
        raise ConfigError(
            f"the dataset's vocabulary has {info.vocab_size} tokens but hf_model's embedding "
            f"has {config.vocab_size} rows (vocab_size in its config.json); tokenise the data "
            "with the model's own tokenizer (make-dataset --tokenizer DIR)"
        )


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The ModuleList of the model's num_hidden_layers decoder layers (transformer.h of GPT-2,
    model.layers of Llama and Qwen2)."""
    inner = model.hf if isinstance(model, HFCausalLM) else model
    layers = inner.config.num_hidden_layers
    for module in inner.modules():
        if isinstance(module, nn.ModuleList) and len(module) == layers:
            return module
    raise ValueError(f"no list of {layers} decoder layers in {type(inner).__name__}")


def training_flops(cfg, model: nn.Module, info: DataInfo) -> float:
    """Per window of hf_context_length tokens: 6 N + 12 L d T per token, as for the GPT
    (models/gpt.py flops_per_token): N the parameters without position embeddings (a tied
    embedding counted once), L layers, d = heads x head size, T the context length."""
    config = hf_config(cfg)
    token_embedding = model.hf.get_input_embeddings() if isinstance(model, HFCausalLM) else None
    position = {
        id(p)
        for m in model.modules()
        if isinstance(m, nn.Embedding) and m is not token_embedding
        for p in m.parameters()
    }
    n_params = sum(p.numel() for p in model.parameters() if id(p) not in position)
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    T = cfg.hf.hf_context_length
    return (6.0 * n_params + 12.0 * config.num_hidden_layers * heads * head_dim * T) * T


def check(cfg) -> None:
    """Config-time checks, before anything is written: the directory, transformers, the
    architecture, the context length, and keys model=hf does not use."""
    config = hf_config(cfg)
    longest = getattr(config, "max_position_embeddings", None)
    if longest and cfg.hf.hf_context_length > longest:
        raise ConfigError(
            f"config key 'hf_context_length' is {cfg.hf.hf_context_length} but hf_model reads at "
            f"most {longest} tokens (max_position_embeddings in its config.json)"
        )
    if cfg.dropout:
        raise ConfigError(
            "config key 'dropout' is not used by model=hf: the dropout rates are those of "
            "hf_model's config.json (e.g. resid_pdrop, attention_dropout); remove it"
        )
    lora.check(cfg, config)


@dataclass
class HFKeys(lora.LoraKeys):
    """The own config keys of model=hf: `cfg.hf` (`[hf]` in a config file), LoRA's with them."""

    hf_model: str = config_key(
        "", "a Hugging Face model directory (config.json, *.safetensors)", resume=True
    )
    hf_weights: str = config_key(
        "pretrained",
        "start from hf_model's weights, or random ones of its architecture",
        choices=("pretrained", "random"),
    )
    hf_context_length: int = config_key(
        1024,
        "tokens per training window (at most max_position_embeddings)",
        bounds=(1, 2**20),
        resume=True,
    )


def describe(cfg) -> str:
    return f"hf:{hf_config(cfg).model_type}:{Path(cfg.hf.hf_model).name}"


def from_hf(
    cfg, info: DataInfo, config: dict, names: Collection[str], model_names: Collection[str]
) -> dict[str, spec.HFName] | None:
    """Where each of the model's tensors is among a Hugging Face model's: under its own name
    (what save_pretrained writes), or without the base model's prefix (GPT-2's `h.0...` for
    `transformer.h.0...`, as older writers store it). None when some have no such name (e.g.
    Mixtral: one tensor per expert in the files, one fused tensor in the module): transformers'
    loader, which knows each architecture's renamings, is then asked for the tensors."""
    ours = hf_config(cfg)
    if _settings(type(ours).from_dict(config)) != _settings(ours):
        raise ValueError(f"its config.json is not hf_model's ({cfg.hf.hf_model})")
    found = {}
    for key in model_names:
        name = lora.base_name(key.removeprefix(PREFIX))  # LoRA: `q_proj.base_layer.weight`
        candidate = next((c for c in (name, name.partition(".")[2]) if c in names), None)
        if candidate is not None:
            found[key] = spec.HFName(candidate)
    return found if len(found) == len(model_names) else None


def _settings(config) -> dict:
    """A transformers config's settings, without where it was read from."""
    return {k: v for k, v in config.to_dict().items() if k != "_name_or_path"}


def to_hf(cfg, info: DataInfo, state: dict) -> dict:
    """The trained model's tensors under transformers' names (the output layer left out when
    it is tied to the embedding, as save_pretrained does)."""
    tensors = {name.removeprefix(PREFIX): t.contiguous() for name, t in state.items()}
    if hf_config(cfg).to_dict().get("tie_word_embeddings", True):
        tensors.pop("lm_head.weight", None)
    return tensors


SPEC = spec.ModelSpec(
    name="hf",
    task=spec.LANGUAGE_MODEL,
    reads=("tokens",),
    build=build,
    keys=HFKeys,
    context_length=lambda cfg: cfg.hf.hf_context_length,
    blocks=decoder_layers,
    flops_per_sample=training_flops,
    check=check,
    describe=describe,
    hf=spec.HFAdapter(
        from_hf=from_hf, to_hf=to_hf, config=lambda cfg, info: hf_config(cfg).to_dict()
    ),
    initial_weights=lambda cfg: cfg.hf.hf_model if cfg.hf.hf_weights == "pretrained" else None,
)
