"""`export run_dir=R --format hf --out DIR`: the newest checkpoint's model as a directory that
transformers' `AutoModelForCausalLM.from_pretrained(DIR)` loads, and so lm-eval-harness and vLLM:
config.json, safetensors (sharded above 5 GB), and the tokenizer of the run's dataset
(`AutoTokenizer.from_pretrained(DIR)`): its tokenizer.json and the files make-dataset kept beside
it (tokenizer_config.json with the special tokens and the chat template, special_tokens_map.json,
generation_config.json). config.json's bos/eos/pad ids are the tokenizer's (null for byte
tokens) and its dtype is the tensors'. The model's spec maps the names and shapes
(`ModelSpec.hf`); hf_format writes the files."""

from __future__ import annotations

import dataclasses
import json
import tempfile
from pathlib import Path

import torch

from ..config.settings import saved_config
from ..config_keys import ConfigError
from ..data.info import saved_data_info
from ..data.recorded_tokenizer import dataset_index, run_tokenizer_files
from ..data.tokenizer import TOKENIZER_FILE, load_tokenizer, special_tokens
from ..models import spec_of
from . import hf_format
from .export import ExportFormat, check_outside_checkpoints, load_model_state

SETTINGS = "tokenizer_config.json"


def export_hf(run_dir: Path, out: Path, max_shard_bytes: int = hf_format.MAX_SHARD_BYTES) -> Path:
    check_outside_checkpoints(run_dir, out)
    values, state = load_model_state(run_dir)
    # run_dir as it is now: the run's own copy of its model's config.json is read from there
    cfg = dataclasses.replace(saved_config(values), run_dir=str(run_dir))
    spec = spec_of(cfg)
    if spec.hf is None:
        raise ConfigError(f"export --format hf: model={cfg.model} has no Hugging Face format")
    info = saved_data_info(values, run_dir)
    files = run_tokenizer_files(cfg.dataset, info.fingerprint)
    tokens = (
        special_tokens(files, dataset_index(Path(cfg.dataset)).get("document_end")) if files else {}
    )
    tensors = spec.hf.to_hf(cfg, info, state)
    config = spec.hf.config(cfg, info) | token_ids(files, tokens) | {"dtype": dtype_of(tensors)}
    config.pop("torch_dtype", None)  # transformers' older name of "dtype"
    with tempfile.TemporaryDirectory() as scratch:
        extra = dict(files)
        if files:
            settings = Path(scratch) / SETTINGS
            settings.write_text(
                json.dumps(tokenizer_settings(files, tokens, spec.context_length(cfg)), indent=2)
                + "\n"
            )
            extra[SETTINGS] = settings
        return hf_format.write_model_dir(out, config, tensors, extra, max_shard_bytes)


def tokenizer_settings(files: dict[str, Path], tokens: dict[str, str], context: int) -> dict:
    """The dataset's tokenizer_config.json (or one naming the special tokens), reading at most
    the `context` tokens the model was trained on."""
    if SETTINGS in files:
        settings = json.loads(files[SETTINGS].read_text())
    else:
        settings = {"tokenizer_class": "PreTrainedTokenizerFast", **tokens}
    return settings | {"model_max_length": context}


def token_ids(files: dict[str, Path], tokens: dict[str, str]) -> dict[str, int | None]:
    """config.json's bos/eos/pad ids: the tokenizer's, None where it has none."""
    tokenizer = load_tokenizer(files[TOKENIZER_FILE])[0] if files else None
    ids = {}
    for name in ("bos", "eos", "pad"):
        token = tokens.get(f"{name}_token")
        ids[f"{name}_token_id"] = tokenizer.token_to_id(token) if token is not None else None
    return ids


def dtype_of(tensors: dict[str, torch.Tensor]) -> str:
    """The floating-point type of the tensors as config.json names it ("float32")."""
    kinds = {t.dtype for t in tensors.values() if t.is_floating_point()}
    if len(kinds) != 1:
        raise ConfigError(f"export --format hf: the model's tensors mix {sorted(map(str, kinds))}")
    return str(kinds.pop()).removeprefix("torch.")


EXPORT_FORMAT = ExportFormat("hf", "a directory transformers loads", export_hf, "transformers")
