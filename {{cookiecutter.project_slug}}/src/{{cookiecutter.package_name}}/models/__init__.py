"""The models a run can train (`model=<name>`): one module per model in this folder, each with a
`SPEC` (spec.ModelSpec). To add yours, write models/<yours>.py (see docs/your-model.md) and add
its module name to MODEL_MODULES: one line. Nothing else in the package knows a model by name.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..config_keys import ConfigError, Key, key, load_registry, owned_keys
from .spec import ModelSpec
{%- if cookiecutter.workload in ["all", "language"] %}

DEFAULT_MODEL = "gpt"  # the `model` config key's default
{%- elif cookiecutter.workload == "images" %}

DEFAULT_MODEL = "vision"  # the `model` config key's default
{%- endif %}
MODEL_MODULES = (
    {%- if cookiecutter.workload in ["all", "language"] %}
    "gpt",  # a GPT-2 style language model (the default)
    {%- endif %}
    "mlp",  # the minimal classifier example
    {%- if cookiecutter.workload in ["all", "language"] %}
    "hf",  # any transformers causal LM from a directory (hf_model=DIR; the [hf] extra)
    {%- endif %}
    {%- if cookiecutter.workload in ["all", "images"] %}
    "vision",  # any torchvision classifier by name (vision_model=resnet50; the [vision] extra)
    "timm",  # any timm classifier by name (timm_model=convnext_tiny; the [timm] extra)
    {%- endif %}
)


MODELS: dict[str, ModelSpec] = load_registry(__name__, MODEL_MODULES, "SPEC")


@dataclass
class ModelKeys:
    """The model of a run and what it starts from; each model's own keys are in its module."""
{%- if cookiecutter.workload in ["all", "language"] %}

    init_from: str = key("", "start a new run from weights: a run_dir, a Hugging Face model dir "
                         "or a weights file (.pth, .bin, .safetensors)")  # fmt: skip
{%- else %}

    init_from: str = key("", "start a new run from weights: a run_dir or a weights file (.pth, "
                         ".bin, .safetensors)")  # fmt: skip
{%- endif %}
    model: str = key(DEFAULT_MODEL, "the model to train: a module in models/ "
                     "(docs/your-model.md)", choices=tuple(MODELS), resume=True)  # fmt: skip
    dropout: float = key(0.0, "dropout probability", bounds=(0, 1), closed="[)", resume=True)


def spec_of(cfg) -> ModelSpec:
    """The spec of the run's model (`cfg.model`)."""
    try:
        return MODELS[cfg.model]
    except KeyError:
        raise ConfigError(
            f"config key 'model' must be one of {', '.join(MODELS)}; got {cfg.model!r}"
        ) from None


def model_keys() -> dict[str, tuple[Key, list[str]]]:
    """Every model's own config keys: name -> (declaration, the models that declare it)."""
    return owned_keys(MODELS, "models")
