"""A LoRA run's weights (models/lora.py): the frozen base is hf_model's, read at every start (a
new run and each resume: start.py); checkpoints hold the adapters and their optimizer state only
(ModelAndOptimizer leaves frozen parameters out) and name the base by its fingerprint, so a
resume on another base is refused. Outside training the adapters are merged into the base
(`merged`: export, generate), or exported as they are (export_peft.py).

The base's fingerprint: sha256 of config.json, each safetensors file's name, size and header
(every tensor's name, dtype, shape and offsets) and the first 4 KiB of every tensor's bytes. It
tells apart two models of one architecture (a base and its instruct fine-tune differ in every
tensor) in one read per tensor, without reading 140 GB for a 70B model at every start; an edit
that keeps each tensor's first 4 KiB is not seen.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import struct
from pathlib import Path

import torch

from ..config_keys import ConfigError
from ..models import lora
from . import hf_format
from .adapters import Adapter

log = logging.getLogger(__name__.split(".")[0])

SAMPLE_BYTES = 4096  # of each tensor, in the fingerprint


@functools.lru_cache(maxsize=4)
def base_fingerprint(directory: str) -> str:
    """The fingerprint of the Hugging Face model directory (see the module's docstring)."""
    path = Path(directory)
    digest = hashlib.sha256((path / "config.json").read_bytes())
    for file in hf_format.weight_files(path):
        with open(file, "rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            header = f.read(length)
            digest.update(f"{file.name}:{file.stat().st_size}:".encode() + header)
            for name, entry in sorted(json.loads(header).items()):
                if name == "__metadata__":
                    continue
                start, end = entry["data_offsets"]
                f.seek(8 + length + start)
                digest.update(f.read(min(SAMPLE_BYTES, end - start)))
    return digest.hexdigest()


def base_record(cfg) -> dict:
    """What a LoRA run's checkpoints say about their base: its directory and fingerprint."""
    directory = str(Path(cfg.hf.hf_model).expanduser().resolve())
    return {"hf_model": directory, "fingerprint": base_fingerprint(directory)}


def record_base(extra: dict, cfg) -> None:
    """A new LoRA run records its base in `extra` (written in every checkpoint); a resumed one
    must have the base its checkpoint names, or is refused in one line (force_resume=true
    continues, recording the new base)."""
    if not lora.enabled(cfg):
        return
    current, saved = base_record(cfg), extra.get("lora_base")
    if saved and saved["fingerprint"] != current["fingerprint"]:
        message = (
            f"the checkpoint's adapters were trained on the base model {saved['hf_model']} "
            f"(fingerprint {saved['fingerprint'][:12]}), hf_model={current['hf_model']} is "
            f"another (fingerprint {current['fingerprint'][:12]})"
        )
        if not cfg.force_resume:
            raise ConfigError(f"{message}: give the run its own base, or use a new run_dir")
        log.warning("force_resume=true: %s", message)
    extra["lora_base"] = current


def merged(extra: dict, state: dict) -> tuple[dict, dict]:
    """A checkpoint's record (`extra`, TrainState's) and model state -> the run's config and
    the full state of its model. For a LoRA run, the plain model its adapters make: hf_model's
    weights (read by transformers, in fp32 as the run trains them) plus (lora_alpha /
    lora_rank) B A in each adapted layer, its config then with the LoRA keys at their defaults
    (lora_rank 0); a base whose fingerprint is not the recorded one is refused. Other runs'
    as they are."""
    from ..config.settings import saved_config
    from ..models.hf import PREFIX, hf_config, transformers_module

    values = extra.get("config", {})
    own = values.get(str(values.get("model")))  # the model's own keys, LoRA's among them
    if not isinstance(own, dict) or not own.get("lora_rank"):
        return values, state
    cfg = saved_config(values)
    current, saved = base_record(cfg), extra.get("lora_base") or {}
    if saved.get("fingerprint") != current["fingerprint"]:
        raise ConfigError(
            f"hf_model={current['hf_model']} is not the base model the run's adapters were "
            f"trained on (fingerprint {current['fingerprint'][:12]}, the checkpoint's "
            f"{str(saved.get('fingerprint'))[:12]})"
        )
    base = transformers_module().AutoModelForCausalLM.from_pretrained(
        current["hf_model"], dtype=torch.float32, local_files_only=True, trust_remote_code=False
    )
    full = {PREFIX + name: t.detach() for name, t in base.state_dict().items()}
    scale, transposed = lora.scale(cfg), lora.transposed(hf_config(cfg))
    with torch.no_grad():
        for name in (n for n in state if ".lora_A." in n):
            layer = name.partition(".lora_A.")[0]
            a, b = state[name].float(), state[name.replace(".lora_A.", ".lora_B.")].float()
            delta = scale * (b @ a)
            full[f"{layer}.weight"] += delta.T if transposed else delta
    plain = {k: v for k, v in own.items() if k not in lora.LoraKeys.__dataclass_fields__}
    return values | {values["model"]: plain}, full


def describe_sizes(result: dict) -> str:
    """benchmark's words for `lora.state_sizes`' figures ("" for a run without adapters)."""
    if "lora_optimizer_state_gib" not in result:
        return ""
    return (
        "; LoRA: AdamW state {lora_optimizer_state_gib:.3g} GiB, checkpoints "
        "{lora_checkpoint_gib:.3g} GiB (full fine-tuning: {full_optimizer_state_gib:.3g} "
        "and {full_checkpoint_gib:.3g} GiB)".format(**result)
    )


ADAPTER = Adapter(
    name="lora",
    enabled=lora.enabled,
    init_adapters=lora.init_adapters,
    record_base=record_base,
    merged=merged,
    state_sizes=lora.state_sizes,
    describe_sizes=describe_sizes,
)
