"""Adapters trained on a frozen base (LoRA: checkpoint/lora.py): one module per adapter, each
with an `ADAPTER` (an `Adapter`), and its module name in ADAPTER_MODULES: one line. The start of
a run, init_from, export, evaluate and benchmark ask this table what an adapter needs from them;
none of them knows an adapter by name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..config_keys import load_registry
{%- if cookiecutter.workload in ["all", "language"] %}

ADAPTER_MODULES = (
    "lora",  # LoRA for model=hf (lora_rank > 0; the [lora] extra)
)
{%- else %}

ADAPTER_MODULES: tuple[str, ...] = ()  # none yet: LoRA comes with the language workload
{%- endif %}


@dataclass(frozen=True)
class Adapter:
    """What an adapter needs from the shared code. `enabled(cfg)`: the run trains it (its base
    is then loaded at every start, a resume too). `init_adapters(state, seed)`: set its tensors
    in a model state that init_from fills, and return their names (not read from the source).
    `record_base(extra, cfg)`: name the base in the checkpoints' record (`extra`), or refuse a
    resume on another base. `merged(record, state)`: a checkpoint's record and model state ->
    the config and the full state of the plain model (other runs' as they are). `state_sizes`
    and `describe_sizes`: benchmark's figures of its state and their words in the verdict."""

    name: str
    enabled: Callable[[object], bool]
    init_adapters: Callable[[dict, int], set[str]]
    record_base: Callable[[dict, object], None]
    merged: Callable[[dict, dict], tuple[dict, dict]]
    state_sizes: Callable[[object], dict]
    describe_sizes: Callable[[dict], str]


ADAPTERS: dict[str, Adapter] = load_registry(__package__, ADAPTER_MODULES, "ADAPTER")


def trains_adapters(cfg) -> bool:
    return any(adapter.enabled(cfg) for adapter in ADAPTERS.values())


def init_adapters(state: dict, seed: int) -> set[str]:
    return set().union(*(adapter.init_adapters(state, seed) for adapter in ADAPTERS.values()))


def record_base(extra: dict, cfg) -> None:
    for adapter in ADAPTERS.values():
        adapter.record_base(extra, cfg)


def merged(record: dict, state: dict) -> tuple[dict, dict]:
    config = record.get("config", {})
    for adapter in ADAPTERS.values():
        config, state = adapter.merged(record | {"config": config}, state)
    return config, state


def state_sizes(model) -> dict:
    return {k: v for adapter in ADAPTERS.values() for k, v in adapter.state_sizes(model).items()}


def describe_sizes(result: dict) -> str:
    return "".join(adapter.describe_sizes(result) for adapter in ADAPTERS.values())
