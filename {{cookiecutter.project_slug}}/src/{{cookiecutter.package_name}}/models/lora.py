"""LoRA for `model=hf` (`lora_rank > 0`): peft's low-rank adapters beside chosen linear layers of
the decoder layers; the base weights are frozen (requires_grad False), so the optimizer holds
the adapters' state only and checkpoints the adapters only (checkpoint/state.py leaves frozen
parameters out; checkpoint/lora.py reads the base from hf_model at every start and names it by
its fingerprint). A layer `W` becomes `W x + (lora_alpha / lora_rank) B A x`, `A` (rank x in)
random, `B` (out x rank) zeros: training starts from exactly hf_model's function.

peft is imported only when a run uses LoRA: it is the optional extra `[lora]`.
"""

from __future__ import annotations

import copy
import math
import re
import zlib
from dataclasses import dataclass

import torch
from torch import nn
from torch.distributed.tensor import DTensor, distribute_tensor

from ..config_keys import ConfigError, key, optional_import

ADAPTER = "default"  # peft's adapter name: in the tensors' names, `...q_proj.lora_A.default.weight`


# fmt: off
@dataclass
class LoraKeys:
    """LoRA's keys, part of model=hf's own (`cfg.hf.lora_rank`); set for another model they are
    refused."""

    lora_rank: int = key(0, "LoRA adapters' rank; 0: full fine-tuning (every weight trains)",
                         bounds=(0, 2**16), resume=True)
    lora_alpha: float = key(16.0, "LoRA scale numerator: adapters add (lora_alpha / lora_rank) B A",
                            bounds=(0, 1e6), closed="(]", resume=True)
    lora_dropout: float = key(0.0, "dropout on the adapters' input", bounds=(0, 1), closed="[)",
                              resume=True)
    lora_targets: str = key("auto", "comma-separated layer names (q_proj,v_proj); auto: every "
                            "linear layer of the decoder layers", resume=True)
# fmt: on


def peft_module():
    """peft, or a one-line ConfigError saying how to install it."""
    return optional_import("peft", "lora", "lora_rank > 0")


def enabled(cfg) -> bool:
    """A LoRA run (its model's keys are LoRA's too, and lora_rank > 0): its base is frozen and
    read from hf_model at every start."""
    return getattr(getattr(cfg, cfg.model, None), "lora_rank", 0) > 0


def _linear_layers(module: nn.Module) -> dict[str, nn.Module]:
    """Name -> module of the layers LoRA can adapt in the model's decoder layers (the modules
    of a ModuleList, `model.layers.3.self_attn.q_proj`): nn.Linear and transformers' Conv1D
    (GPT-2's projections, which store their weights transposed). The embedding and the output
    layer (often tied to it) are left out."""
    return {
        name: m
        for name, m in module.named_modules()
        if (isinstance(m, nn.Linear) or type(m).__name__ == "Conv1D")
        and re.search(r"\.\d+\.", name)
    }


_LAYERS: dict[str, tuple[tuple[str, ...], bool]] = {}  # by the config's JSON: built once


def _layer_names(config) -> tuple[tuple[str, ...], bool]:
    """(the names of the adaptable layers, whether they store their weights transposed) of the
    transformers config's model, built on the meta device (no memory, no weights read)."""
    text = config.to_json_string()
    if text not in _LAYERS:
        transformers = optional_import("transformers", "hf", "model=hf")
        with torch.device("meta"):
            model = transformers.AutoModelForCausalLM.from_config(
                copy.deepcopy(config), trust_remote_code=False
            )
        layers = _linear_layers(model)
        names = tuple(sorted({name.rpartition(".")[2] for name in layers}))
        _LAYERS[text] = names, any(type(m).__name__ == "Conv1D" for m in layers.values())
    return _LAYERS[text]


def targets(cfg, config) -> list[str]:
    """The names of the layers that get adapters (`config`: hf_model's transformers config):
    lora_targets, or with "auto" every linear layer of the decoder layers (attention and MLP
    projections: q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj of Llama,
    Qwen2, Mistral; c_attn, c_proj, c_fc of GPT-2)."""
    names, _ = _layer_names(config)
    if cfg.hf.lora_targets == "auto":
        return list(names)
    chosen = [name.strip() for name in cfg.hf.lora_targets.split(",") if name.strip()]
    missing = [name for name in chosen if name not in names]
    if missing or not chosen:
        raise ConfigError(
            f"config key 'lora_targets': hf_model's decoder layers have no linear layer named "
            f"{missing[0] if missing else repr(cfg.hf.lora_targets)}; theirs are "
            f"{', '.join(names)}"
        )
    return chosen


def check(cfg, config) -> None:
    """Config-time checks of the LoRA keys (model=hf's check calls this with hf_model's
    transformers config)."""
    own = cfg.hf
    if own.lora_rank == 0:
        defaults = LoraKeys()
        changed = [
            k
            for k in ("lora_alpha", "lora_dropout", "lora_targets")
            if getattr(own, k) != getattr(defaults, k)
        ]
        if changed:
            raise ConfigError(
                f"config key {changed[0]!r} is set but lora_rank is 0 (LoRA off): set lora_rank "
                "(e.g. 16) to train adapters, or remove it"
            )
        return
    peft_module()
    if cfg.init_from or own.hf_weights != "pretrained":
        raise ConfigError(
            "lora_rank > 0 trains adapters on hf_model's own weights: remove init_from and "
            "hf_weights=random (the frozen base is read from hf_model at every start)"
        )
    targets(cfg, config)


def lora_config(cfg, config, base_model: str | None = None):
    """peft's LoraConfig of the run (fan_in_fan_out for GPT-2's transposed Conv1D layers)."""
    peft = peft_module()
    own = cfg.hf
    return peft.LoraConfig(
        r=own.lora_rank,
        lora_alpha=own.lora_alpha,
        lora_dropout=own.lora_dropout,
        target_modules=targets(cfg, config),
        fan_in_fan_out=transposed(config),
        base_model_name_or_path=base_model,
        task_type="CAUSAL_LM",
    )


def transposed(config) -> bool:
    """Whether the model's layers store their weights (in, out): GPT-2's Conv1D."""
    return _layer_names(config)[1]


def add_adapters(cfg, model: nn.Module) -> nn.Module:
    """Adapters into the transformers model `model`, in place (peft's inject_adapter_in_model:
    no PeftModel wrapper, so the names stay transformers' plus `.base_layer` and
    `.lora_A.default`); every other parameter frozen. Their initial values are set when the
    base weights are loaded (`init_adapters`)."""
    if not enabled(cfg):
        return model
    peft = peft_module()
    peft.inject_adapter_in_model(lora_config(cfg, model.config), model, adapter_name=ADAPTER)
    for name, param in model.named_parameters():
        param.requires_grad = is_adapter(name)
    return model


def is_adapter(name: str) -> bool:
    """A tensor of an adapter (`...lora_A.default.weight`), not of the base model."""
    return ".lora_A." in name or ".lora_B." in name


def base_name(name: str) -> str:
    """The base model's name of a tensor of an adapted layer (`q_proj.base_layer.weight` ->
    `q_proj.weight`); other names unchanged."""
    return name.replace(".base_layer.", ".")


def scale(cfg) -> float:
    return cfg.hf.lora_alpha / cfg.hf.lora_rank


def init_adapters(state: dict, seed: int) -> set[str]:
    """Set the adapters' tensors in `state` (the model's, plain or FSDP-sharded) to their
    initial values: A uniform as nn.Linear initialises (peft's default), B zeros. Each A is
    drawn whole from a generator seeded by the run's seed and the tensor's name, and each rank
    keeps its part: the same values for any number of ranks. Returns their names."""
    names = {name for name in state if is_adapter(name)}
    with torch.no_grad():
        for name in names:
            tensor = state[name]
            value = torch.zeros(tensor.shape, dtype=tensor.dtype)
            if ".lora_A." in name:
                generator = torch.Generator().manual_seed(zlib.crc32(name.encode()) ^ seed)
                nn.init.kaiming_uniform_(value, a=math.sqrt(5), generator=generator)
            if isinstance(tensor, DTensor):  # this rank's part, as the tensor is placed
                part = distribute_tensor(
                    value, tensor.device_mesh, tensor.placements, src_data_rank=None
                )
                tensor.to_local().copy_(part.to_local())
            else:
                tensor.copy_(value)
    return names


def state_sizes(model: nn.Module) -> dict:
    """A LoRA model's AdamW state and checkpoint size beside full fine-tuning's of its base, in
    GiB, from parameter counts: AdamW keeps two fp32 moments per trained parameter (8 bytes), a
    checkpoint holds the trained parameters in fp32 and those moments (12 bytes). {} for a
    model without adapters."""
    sizes = {}
    for name, param in model.named_parameters():
        kind = "lora" if is_adapter(name) else "full"
        sizes[kind] = sizes.get(kind, 0) + param.numel()
    if "lora" not in sizes:
        return {}
    return {
        f"{kind}_{what}_gib": sizes[kind] * size / 2**30
        for kind in ("lora", "full")
        for what, size in (("optimizer_state", 8), ("checkpoint", 12))
    }
