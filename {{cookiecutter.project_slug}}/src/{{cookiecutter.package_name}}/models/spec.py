"""What the training loop knows about a model: its `ModelSpec` (the idea of torchtitan's, not its
code). The loop, the data, the metrics, the benchmark, the CLI and `generate` ask the spec of
`cfg.model`; none of them knows a model by name.

A model's task says what kind of data it reads and how it is scored: `LANGUAGE_MODEL` (token
windows of `context_length + 1`, next-token cross entropy, bits per token, `generate`) or
`CLASSIFIER` (feature vectors and labels, cross entropy, accuracy).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

if TYPE_CHECKING:
    from ..data.info import DataInfo


def cross_entropy(output: torch.Tensor, target: torch.Tensor, reduction: str = "mean"):
    """Cross entropy in fp32 (also for bf16 logits): (B, C) logits with (B,) labels, or
    (B, T, V) logits with (B, T) next tokens."""
    return F.cross_entropy(output.flatten(0, -2).float(), target.flatten(), reduction=reduction)


@dataclass(frozen=True)
class Task:
    """How a kind of model is fed and scored."""

    name: str
    data: str  # the dataset kind it reads: "tokens" (windows) or "arrays" (x, y)
    unit: str  # what throughput counts: "tokens" or "samples"
    generates: bool  # `generate` can sample from it

    def loss(self, output: torch.Tensor, target: torch.Tensor, reduction: str = "mean"):
        return cross_entropy(output, target, reduction)

    def chance_loss(self, info: DataInfo) -> float:
        """The loss of uniform predictions: ln of the number of outputs (tokens or classes)."""
        return math.log(info.vocab_size if self.data == "tokens" else info.num_classes)

    def train_metrics(self, loss: float) -> dict:
        """Extra fields of a training record, from the mean loss."""
        if self.unit == "tokens":  # bits per token (= per byte for byte-level tokens)
            return {"loss_bits_per_token": loss / math.log(2)}
        return {}

    def eval_metrics(self, loss_sum: float, correct: float, count: float) -> dict:
        """An evaluation record's fields from the sums over all ranks."""
        loss = loss_sum / max(count, 1)
        if self.unit == "tokens":
            return {"eval_loss": loss, "eval_bits_per_token": loss / math.log(2)}
        return {"eval_loss": loss, "eval_acc": correct / max(count, 1)}

    def example_batch(self, info: DataInfo, context_length: int):
        """One sample shaped like a training batch (for counting FLOPs)."""
        if self.data == "tokens":
            x = torch.zeros(1, context_length, dtype=torch.long)
            return x, torch.zeros(1, context_length, dtype=torch.long)
        return torch.zeros(1, info.num_features), torch.zeros(1, dtype=torch.long)


LANGUAGE_MODEL = Task("language model", data="tokens", unit="tokens", generates=True)
CLASSIFIER = Task("classifier", data="arrays", unit="samples", generates=False)


@dataclass(frozen=True)
class HFName:
    """Where one of the model's tensors is among a Hugging Face model's: tensor `name`, stored
    transposed (GPT-2's Conv1D weights keep (in, out), nn.Linear (out, in)) or not; `padded`:
    the model's tensor may have more rows than the stored one, the rest are zeros (the GPT pads
    its vocabulary)."""

    name: str
    transposed: bool = False
    padded: bool = False


@dataclass(frozen=True)
class HFAdapter:
    """A model's Hugging Face form as maps of names and shapes (the idea of torchtitan's state
    dict adapters); checkpoint/ reads and writes the files (`init_from=DIR`, `export --format
    hf`).

    from_hf(cfg, info, config, hf_names, model_names): the directory's config.json (a dict) and
        the names of its tensors -> {model name: HFName}, raising ValueError naming the first
        setting that differs from the run's; None when the names do not map one to one (e.g.
        Mixtral's experts: one tensor each in the files, one fused tensor in the module), and
        transformers' own loader is asked for the tensors instead.
    to_hf(cfg, info, state): the model's whole state dict -> tensors under Hugging Face's names
        and layouts, as `AutoModelForCausalLM.from_pretrained` reads them.
    config(cfg, info): the config.json that goes with them.
    """

    from_hf: Callable[[Any, DataInfo, dict, Collection[str], Collection[str]], dict | None]
    to_hf: Callable[[Any, DataInfo, dict], dict]
    config: Callable[[Any, DataInfo], dict]


@dataclass(frozen=True)
class ModelSpec:
    """Everything the package needs to train, resume, benchmark and sample a model.

    name: the value of the `model` config key.
    task: LANGUAGE_MODEL or CLASSIFIER.
    build(cfg, info): a new model with initial weights; `info` is the dataset's DataInfo
        (vocab_size for a language model, num_features and num_classes for a classifier).
    keys: the model's own config keys: a dataclass whose fields are `key(...)`s, as a general
        section's (config_keys.py); a run's config holds it under the model's name
        (`cfg.gpt.preset`). None: the model has no keys of its own. Set for another model, the
        config refuses them.
    context_length(cfg): tokens per training window (a language model; 0 for a classifier).
    blocks(model): the repeated blocks, an nn.ModuleList that FSDP shards one by one,
        activation checkpointing wraps and `compile=true` compiles; None: the model is one unit.
    flops_per_sample(cfg, model, info): training FLOPs (forward + backward) per sample (per
        window for a language model), for MFU; None: counted by running one sample.
    check(cfg): relations between the model's keys, raising ConfigError at load time.
    describe(cfg): the name the benchmark reports (e.g. "gpt:gpt2-124m").
    hf: how the model's names and shapes map to a Hugging Face model's (`init_from=DIR`,
        `export --format hf`); None: it has no Hugging Face form.
    initial_weights(cfg): where a new run's weights come from when init_from is not set (a
        directory init_from accepts), or None: the weights `build` made.
    architecture(cfg, info): the run's config with the model's sizes as built where it says
        "0: the preset's" or "the dataset's" (exported files record these); None: its keys say
        it all.
    """

    name: str
    task: Task
    build: Callable[[Any, DataInfo], nn.Module]
    keys: type | None = None
    context_length: Callable[[Any], int] = lambda cfg: 0
    blocks: Callable[[nn.Module], nn.ModuleList] | None = None
    flops_per_sample: Callable[[Any, nn.Module, DataInfo], float] | None = None
    check: Callable[[Any], None] | None = None
    describe: Callable[[Any], str] | None = None
    hf: HFAdapter | None = None
    initial_weights: Callable[[Any], str | None] | None = None
    architecture: Callable[[Any, DataInfo], Any] | None = None

    def training_flops_per_sample(self, cfg, model: nn.Module, info: DataInfo) -> float:
        if self.flops_per_sample is not None:
            return self.flops_per_sample(cfg, model, info)
        return counted_flops(self, cfg, info)

    def label(self, cfg) -> str:
        return self.describe(cfg) if self.describe else self.name


def counted_flops(spec: ModelSpec, cfg, info: DataInfo) -> float:
    """Forward + backward FLOPs of one sample, counted by torch on a fresh copy of the model."""
    from torch.utils.flop_counter import FlopCounterMode

    probe = spec.build(cfg, info)
    x, y = spec.task.example_batch(info, spec.context_length(cfg))
    with FlopCounterMode(display=False) as counter:
        spec.task.loss(probe(x), y).backward()
    return float(counter.get_total_flops())


@torch.no_grad()
def sample(
    model: nn.Module,
    idx: torch.Tensor,
    max_new_tokens: int,
    context_length: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    generator: torch.Generator | None = None,
    vocab_size: int | None = None,
) -> torch.Tensor:
    """Append `max_new_tokens` sampled tokens to `idx` (batch, time); returns (batch, time + new).

    Any language model whose forward maps (batch, time) token ids to (batch, time, vocab)
    logits. The context is cropped to `context_length`. temperature 0 picks the most likely
    token (greedy); top_k keeps only the k most likely tokens. `vocab_size` (the tokenizer's,
    before padding) keeps the padding rows of an embedding from ever being sampled.
    """
    was_training = model.training
    model.eval()
    try:
        for _ in range(max_new_tokens):
            logits = model(idx[:, -context_length:])[:, -1, :].float()
            if vocab_size is not None:
                logits = logits[:, :vocab_size]
            if temperature == 0:
                next_token = logits.argmax(dim=-1, keepdim=True)
            else:
                logits = logits / temperature
                if top_k is not None:
                    kth = torch.topk(logits, min(top_k, logits.shape[-1])).values[:, [-1]]
                    logits = logits.masked_fill(logits < kth, float("-inf"))
                probs = F.softmax(logits, dim=-1)
                next_token = torch.multinomial(probs, num_samples=1, generator=generator)
            idx = torch.cat([idx, next_token], dim=1)
    finally:
        model.train(was_training)
    return idx
