"""`model=hf`: any causal language model that transformers' `AutoModelForCausalLM` builds from a
Hugging Face model directory (`hf_model=DIR`, its config.json): GPT-2, Llama, Qwen2, Mistral...

The model is transformers' own module (attention "sdpa", no KV cache), wrapped so that its
forward maps (batch, time) token ids to (batch, time, vocab) logits as the package's language
models do; its state-dict names are transformers' with the prefix `hf.`. Its decoder layers are
the blocks that FSDP shards one by one, activation checkpointing wraps and `compile=true`
compiles. `build` gives the architecture with new, seeded weights (the same on every rank); a
new run then starts from DIR's own weights (`hf_weights=pretrained`, the default, through
init_from's loader, checkpoint/initial_hf.py) or keeps the random ones (`hf_weights=random`).
The names of DIR's tensors map to the model's by adding the prefix (`from_hf`, `to_hf`);
checkpoint/ reads and writes the files.

transformers is imported only when a run uses model=hf (here, and by checkpoint/hf_format.py for
files whose names do not map one to one): it is the optional extra `[hf]`.
"""

from __future__ import annotations

import copy
import functools
import json
import re
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

from ..config_keys import ConfigError, first_line, optional_import
from ..config_keys import key as config_key  # `key` names tensors below
from ..run.atomic import atomic_write_text
from . import lora, spec

if TYPE_CHECKING:
    from ..data.info import DataInfo

PREFIX = "hf."  # state-dict name = PREFIX + transformers' name


def transformers_module():
    """transformers, or a one-line ConfigError saying how to install it."""
    return optional_import("transformers", "hf", "model=hf")


RUN_COPY = "hf_model"  # <run_dir>/hf_model/config.json: the architecture the run trains
# Bidirectional encoders that AutoModelForCausalLM builds all the same (BertLMHeadModel...):
# unless their config.json says is_decoder=true, each position's attention sees the tokens
# after it, so next-token training would learn to copy.
ENCODERS = frozenset(
    "bert bert-generation big_bird camembert data2vec-text electra ernie megatron-bert rembert "
    "roberta roberta-prelayernorm roc_bert roformer xlm-roberta xlm-roberta-xl xmod".split()
)
# config.json fields that do not change the model's function: where and by which version it
# was written, the dtype its files are stored in, generation defaults
NOT_THE_FUNCTION = frozenset(
    {"_name_or_path", "transformers_version", "architectures", "dtype", "torch_dtype", "use_cache"}
    | {"bos_token_id", "eos_token_id", "pad_token_id"}
)


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
        # trust_remote_code=False: code in the directory (an auto_map) is never run, and
        # transformers never stops to ask on the terminal whether to run it
        config = transformers.AutoConfig.from_pretrained(
            directory, local_files_only=True, trust_remote_code=False
        )
    except Exception as err:  # unknown model_type, broken JSON: transformers' own words
        if custom_code(path / "config.json"):
            raise ConfigError(
                f"config key 'hf_model': {path / 'config.json'} names custom code (auto_map), "
                "which this package does not run (trust_remote_code=False); use a model "
                f"transformers {transformers.__version__} builds by itself"
            ) from None
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
    if config.model_type in ENCODERS and not config.is_decoder:
        raise ConfigError(
            f"config key 'hf_model': {directory} holds a {config.model_type!r} encoder: its "
            "attention sees the tokens after each position (not causal), so it cannot learn "
            "to predict them; use a decoder-only model (GPT-2, Llama, Qwen2...)"
        )
    return config


def custom_code(config_file: Path) -> bool:
    """Whether a config.json names code of its own (`auto_map`) for transformers to run."""
    try:
        return "auto_map" in json.loads(config_file.read_text())
    except (OSError, ValueError, TypeError):  # unreadable: transformers' own words say so
        return False


def source_dir(cfg) -> str:
    """`hf_model` as an absolute path (a trailing slash or `..` do not make another one)."""
    if not cfg.hf.hf_model:
        raise ConfigError(
            "config key 'hf_model' is required with model=hf: a Hugging Face model directory "
            "(config.json and *.safetensors)"
        )
    try:
        return str(Path(cfg.hf.hf_model).expanduser().resolve())
    except (OSError, RuntimeError) as err:  # a symlink loop
        raise ConfigError(f"config key 'hf_model': {cfg.hf.hf_model}: {first_line(err)}") from None


def run_copy(run_dir) -> Path:
    """The run directory's copy of hf_model's config.json (`keep_config` writes it)."""
    return Path(run_dir) / RUN_COPY / "config.json"


def hf_config(cfg):
    """The transformers config of the run's model (read once per process), checked: the run
    directory's copy of hf_model's config.json once the run has one (the architecture it
    trains, whatever becomes of hf_model), else hf_model's."""
    if cfg.run_dir and run_copy(cfg.run_dir).is_file():
        return _read_config(str(run_copy(cfg.run_dir).parent.resolve()))
    return _read_config(source_dir(cfg))


def differences(ours, theirs) -> list[str]:
    """`field: ours -> theirs` for each config.json setting that changes the function."""
    a, b = ours.to_dict(), theirs.to_dict()
    return [
        f"{field}: {a.get(field)!r} -> {b.get(field)!r}"
        for field in sorted((set(a) | set(b)) - NOT_THE_FUNCTION)
        if a.get(field) != b.get(field)
    ]


def keep_config(cfg, run_dir: Path) -> None:
    """At a run's start, on rank 0, before any checkpoint is read: a new run keeps a copy of
    hf_model's config.json, the architecture it trains (`hf_config` reads it from then on); a
    run that has one is refused where hf_model's, if still there, changed a setting that changes
    the function (hf_model may be gone: the copy is the run's)."""
    copy_file = run_copy(run_dir)
    if copy_file.is_file():
        source = source_dir(cfg)
        if not (Path(source) / "config.json").is_file():
            return
        now = _read_config.__wrapped__(source)  # as it is now, not as read before
        changed = differences(_read_config(str(copy_file.parent.resolve())), now)
        if changed:
            raise ConfigError(
                f"hf_model's config.json ({source}) is not the one the run in {run_dir} trains "
                f"({copy_file}): {'; '.join(changed)}. Restore it, or use a new run_dir"
            )
        return
    source_file = Path(source_dir(cfg)) / "config.json"
    try:
        copy_file.parent.mkdir(exist_ok=True)
        atomic_write_text(copy_file, source_file.read_text())
    except OSError as err:
        raise ConfigError(
            f"cannot copy {source_file} to {copy_file}: {err.strerror or err}"
        ) from None


class HFCausalLM(nn.Module):
    """(batch, time) token ids -> (batch, time, vocab) logits of a transformers causal LM."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.hf = model

    def forward(self, idx: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """`positions` (B, T): of packed documents, restarting at 0 with each (data/chat.py).
        transformers then keeps attention inside each (it finds the documents where the
        positions do not rise by 1, with no attention mask given)."""
        return self.hf(input_ids=idx, position_ids=positions, use_cache=False).logits


def build(cfg, info: DataInfo) -> HFCausalLM:
    """The architecture of `hf_model` with new weights from torch's RNG (seeded by the caller),
    in fp32; the dataset's vocabulary must fit in the model's embedding."""
    transformers = transformers_module()
    config = hf_config(cfg)
    check_vocab(config, info)
    model = transformers.AutoModelForCausalLM.from_config(  # a copy: the model changes its own
        copy.deepcopy(config),
        attn_implementation="sdpa",
        dtype=torch.float32,
        trust_remote_code=False,
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
        "", "a Hugging Face model directory (config.json, *.safetensors)"
    )  # not a resume key: the run keeps a copy of its config.json (keep_config)
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
    changed = differences(ours, type(ours).from_dict(config))
    if changed:
        raise ValueError(f"its config.json is not the run's model's: {'; '.join(changed)}")
    found = {}
    for key in model_names:
        name = lora.base_name(key.removeprefix(PREFIX))  # LoRA: `q_proj.base_layer.weight`
        candidate = next((c for c in (name, name.partition(".")[2]) if c in names), None)
        if candidate is not None:
            found[key] = spec.HFName(candidate)
    if len(found) != len(model_names):
        return None
    unused = unused_tensors(ours, set(names) - {hf.name for hf in found.values()})
    if "lm_head.weight" in unused and ours.tie_word_embeddings:
        raise ValueError(
            "its files hold an output layer (lm_head.weight) that its config.json's "
            "tie_word_embeddings=true replaces by the token embedding: set it to false if "
            "the output layer is its own"
        )
    if unused:
        raise ValueError(
            f"{len(unused)} of its tensors are not in the model its config.json describes "
            f"(e.g. more layers than num_hidden_layers): {', '.join(unused[:5])}"
            + (" ..." if len(unused) > 5 else "")
        )
    return found


def unused_tensors(config, names: Collection[str]) -> list[str]:
    """The tensors among `names` that no model tensor reads, but those transformers' class
    ignores too (GPT-2's causal mask buffers `attn.bias`, which older files carry)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    ignored = MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]._keys_to_ignore_on_load_unexpected or ()
    return sorted(n for n in names if not any(re.search(pattern, n) for pattern in ignored))


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
    reads=("tokens", "chat"),
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
    keep_files=keep_config,
)
