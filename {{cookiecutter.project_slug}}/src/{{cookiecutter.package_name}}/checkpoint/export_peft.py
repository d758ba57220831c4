"""`export run_dir=R --format peft --out DIR`: a LoRA run's adapters as the directory peft writes
(adapter_config.json, adapter_model.safetensors), which `PeftModel.from_pretrained(base, DIR)`
loads onto the base model (hf_model: adapter_config.json names its directory) and vLLM serves
as a LoRA adapter. Megabytes, where `--format hf` writes the whole merged model."""

from __future__ import annotations

from pathlib import Path

from ..config.settings import saved_config
from ..config_keys import ConfigError
from ..models import lora
from ..models.hf import PREFIX, hf_config
from ..run.atomic import atomic_directory
from . import hf_format
from .export import ExportFormat, check_outside_checkpoints, load_model_state

WEIGHTS = "adapter_model.safetensors"


def peft_name(name: str) -> str:
    """Our name of an adapter tensor -> peft's in an adapter file:
    `hf.model.layers.0.self_attn.q_proj.lora_A.default.weight` ->
    `base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight`."""
    inner = name.removeprefix(PREFIX).replace(f".{lora.ADAPTER}.", ".")
    return f"base_model.model.{inner}"


def export_peft(run_dir: Path, out: Path) -> Path:
    check_outside_checkpoints(run_dir, out)
    values, state = load_model_state(run_dir, merge_adapters=False)
    cfg = saved_config(values)
    if not lora.enabled(cfg):
        raise ConfigError(
            f"export --format peft: {run_dir} is not a LoRA run (lora_rank is 0); "
            "--format hf exports its model"
        )
    base = str(Path(cfg.hf.hf_model).expanduser().resolve())
    config = lora.lora_config(cfg, hf_config(cfg), base_model=base)
    config.inference_mode = True  # as PeftModel.save_pretrained records it
    tensors = {peft_name(name): t.contiguous() for name, t in state.items()}
    return write_adapter_dir(Path(out), config, tensors)


def write_adapter_dir(out: Path, config, tensors: dict) -> Path:
    """The directory complete or not at all: written under a temporary name, then renamed."""
    if out.exists():
        raise ConfigError(f"{out} exists: export writes a new directory")
    with atomic_directory(out) as tmp:
        hf_format.save_tensors(tensors, tmp / WEIGHTS, out)
        config.save_pretrained(str(tmp))  # adapter_config.json
    return out


EXPORT_FORMAT = ExportFormat(
    "peft", "a LoRA run's adapters, a directory peft loads onto the base", export_peft, "peft"
)
