"""`export run_dir=R --format hf --out DIR`: the newest checkpoint's model as a directory that
transformers' `AutoModelForCausalLM.from_pretrained(DIR)` loads, and so lm-eval-harness and vLLM:
config.json, safetensors (sharded above 5 GB), and the dataset's tokenizer.json when it has one
(`AutoTokenizer.from_pretrained(DIR)`). The model's spec maps the names and shapes
(`ModelSpec.hf`); hf_format writes the files."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from ..config.settings import saved_config
from ..config_keys import ConfigError
from ..data.info import saved_data_info
from ..data.tokenizer import check_run_tokenizer
from ..models import spec_of
from . import hf_format
from .export import check_outside_checkpoints, load_model_state

TOKENIZER = "tokenizer.json"


def export_hf(run_dir: Path, out: Path, max_shard_bytes: int = hf_format.MAX_SHARD_BYTES) -> Path:
    check_outside_checkpoints(run_dir, out)
    values, state = load_model_state(run_dir)
    cfg = saved_config(values)
    spec = spec_of(cfg)
    if spec.hf is None:
        raise ConfigError(f"export --format hf: model={cfg.model} has no Hugging Face format")
    info = saved_data_info(values, run_dir)
    config, tensors = spec.hf.config(cfg, info), spec.hf.to_hf(cfg, info, state)
    extra = {}
    tokenizer = Path(cfg.dataset) / TOKENIZER
    with tempfile.TemporaryDirectory() as scratch:
        if cfg.dataset != "synthetic" and tokenizer.is_file():
            check_run_tokenizer(cfg.dataset, info.fingerprint)
            extra[TOKENIZER] = tokenizer
            settings = Path(scratch) / "tokenizer_config.json"
            settings.write_text(
                json.dumps(
                    {
                        "tokenizer_class": "PreTrainedTokenizerFast",
                        "model_max_length": spec.context_length(cfg),
                    },
                    indent=2,
                )
                + "\n"
            )
            extra["tokenizer_config.json"] = settings
        return hf_format.write_model_dir(out, config, tensors, extra, max_shard_bytes)
