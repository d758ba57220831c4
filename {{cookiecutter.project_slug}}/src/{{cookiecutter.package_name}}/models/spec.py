"""What the training loop knows about a model: its `ModelSpec` (the idea of torchtitan's, not its
code). The loop, the data, the metrics, the benchmark, the CLI and `generate` ask the spec of
`cfg.model`; none of them knows a model by name.

A model's task says how a batch becomes a loss and what the model reports: `LANGUAGE_MODEL`
(next-token cross entropy, bits per token, `generate`), `CLASSIFIER` (cross entropy, accuracy,
top-5), or one of your own (docs/your-data.md: a regression). Its spec's `reads` names the dataset
kinds it trains on (data/kinds.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from ..data.info import IGNORE_INDEX

if TYPE_CHECKING:
    from pathlib import Path

    from ..data.info import DataInfo


def cross_entropy(output: torch.Tensor, target: torch.Tensor, reduction: str = "mean"):
    """Cross entropy in fp32 (also for bf16 logits): (B, C) logits with (B,) labels or with
    (B, C) class probabilities (mixup, cutmix, label smoothing: data/augmentation.py), or
    (B, T, V) logits with (B, T) next tokens; targets IGNORE_INDEX are left out."""
    if target.is_floating_point():
        return F.cross_entropy(output.float(), target, reduction=reduction)
    return F.cross_entropy(
        output.flatten(0, -2).float(),
        target.flatten(),
        reduction=reduction,
        ignore_index=IGNORE_INDEX,
    )


def scored(target: torch.Tensor) -> torch.Tensor:
    """How many targets the loss reads: all but those IGNORE_INDEX (padding, the tokens of a
    validation window that another window scores, a conversation's prompt). (B, C) class
    probabilities: B."""
    if target.is_floating_point():
        return torch.tensor(target.shape[0], device=target.device)
    return (target != IGNORE_INDEX).sum()


@dataclass(frozen=True)
class Task:
    """How a batch becomes a loss, and what the model reports: train, evaluate, the benchmark
    and the metrics call these and know no task by name. A batch is what the dataset kind gives:
    a language model's `{"inputs", "targets"}` (data/info.py, `token_batch`), a classifier's
    `(inputs, targets)`, or anything of yours (a dict of tensors of varying shapes).

    name: shown in the start line ("language model", "classifier").
    unit: what throughput counts, `<unit>_per_s` in the metrics ("tokens", "images", "samples").
    loss(model, batch): the batch's loss summed over what it scores, a scalar tensor.
    count(batch): what `loss` sums over (the targets it reads: tokens, samples), a scalar tensor
        on the batch's device. The step counts every micro-batch of every rank first (one
        all-reduce) and back-propagates each loss divided by that count: the mean over the
        global batch, however it is split into ranks and micro-steps (training/step.py).
    scores(model, batch): sums over one validation batch, scalar tensors: "loss" (the summed
        loss), "count" (what it is summed over) and any other sums `report` needs; None: the
        loss and the count.
    report(sums): the evaluation record's fields, from the sums over every batch and rank.
    train_metrics(loss): extra fields of a training record, from its mean loss.
    chance_loss(info): the loss of uniform predictions, or None (a first loss far above it says
        the initialisation is broken).
    generates: `generate` can sample from it.
    """

    name: str
    unit: str
    loss: Callable[[nn.Module, Any], torch.Tensor]
    count: Callable[[Any], torch.Tensor]
    report: Callable[[dict[str, float]], dict]
    scores: Callable[[nn.Module, Any], dict[str, torch.Tensor]] | None = None
    train_metrics: Callable[[float], dict] = lambda loss: {}
    chance_loss: Callable[[DataInfo], float | None] = lambda info: None
    generates: bool = False

    def score(self, model: nn.Module, batch) -> dict[str, torch.Tensor]:
        """The sums of one validation batch (`scores`)."""
        if self.scores is not None:
            return self.scores(model, batch)
        return {"loss": self.loss(model, batch), "count": self.count(batch)}


def next_token_logits(model: nn.Module, batch: dict) -> torch.Tensor:
    """A language model's (B, T, vocab) logits of a batch's inputs. Windows that pack several
    documents give their `positions` too, restarting at 0 with each document, and the model
    keeps its attention inside each (data/chat.py); a model that never reads packed windows
    (`reads` without them) need not take the argument."""
    if "positions" in batch:
        return model(batch["inputs"], positions=batch["positions"])
    return model(batch["inputs"])


def _bits(loss: float) -> float:  # per token (= per byte for byte-level tokens)
    return loss / math.log(2)


def _language_model_report(sums: dict[str, float]) -> dict:
    loss = sums["loss"] / max(sums["count"], 1)
    return {"eval_loss": loss, "eval_bits_per_token": _bits(loss)}


LANGUAGE_MODEL = Task(
    name="language model",
    unit="tokens",
    loss=lambda model, batch: cross_entropy(
        next_token_logits(model, batch), batch["targets"], "sum"
    ),
    count=lambda batch: scored(batch["targets"]),
    report=_language_model_report,
    train_metrics=lambda loss: {"loss_bits_per_token": _bits(loss)},
    chance_loss=lambda info: math.log(info.vocab_size),
    generates=True,
)


def classifier_scores(output: torch.Tensor, target: torch.Tensor) -> dict[str, torch.Tensor]:
    """Summed loss, count, top-1 and (with more than 5 classes) top-5 hits of (B, C) logits."""
    scores = {"loss": cross_entropy(output, target, "sum"), "count": scored(target)}
    scores["correct"] = (output.argmax(-1) == target).sum().float()
    if output.shape[-1] > 5:
        top5 = output.topk(5, dim=-1).indices
        scores["correct_top5"] = (top5 == target[:, None]).any(-1).sum().float()
    return scores


def _classifier_report(sums: dict[str, float]) -> dict:
    count = max(sums["count"], 1)
    report = {"eval_loss": sums["loss"] / count, "eval_acc": sums["correct"] / count}
    if "correct_top5" in sums:
        report["eval_top5"] = sums["correct_top5"] / count
    return report


CLASSIFIER = Task(
    name="classifier",
    unit="samples",
    loss=lambda model, batch: cross_entropy(model(batch[0]), batch[1], "sum"),
    count=lambda batch: scored(batch[1]),
    scores=lambda model, batch: classifier_scores(model(batch[0]), batch[1]),
    report=_classifier_report,
    chance_loss=lambda info: math.log(info.num_classes),
)


@dataclass(frozen=True)
class HFName:
    """Where one of the model's tensors is among a Hugging Face model's: tensor `name`, stored
    transposed (GPT-2's Conv1D weights keep (in, out), nn.Linear (out, in)) or not; `padded`:
    the model's tensor may have more rows than the stored one, the rest are zeros (the GPT pads
    its vocabulary); `cut`: the model's tensor may have fewer rows than the stored one, the
    first are read (a GPT trained on shorter windows than GPT-2's position table)."""

    name: str
    transposed: bool = False
    padded: bool = False
    cut: bool = False


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
    task: LANGUAGE_MODEL, CLASSIFIER or your own: how a batch becomes a loss, what it reports.
    build(cfg, info): a new model with initial weights; `info` is the dataset's DataInfo
        (vocab_size for a language model, num_features and num_classes for a classifier).
    reads: the dataset kinds it trains on (names in data/kinds.py); the first is the one
        `dataset=synthetic` makes.
    keys: the model's own config keys: a dataclass whose fields are `key(...)`s, as a general
        section's (config_keys.py); a run's config holds it under the model's name
        (`cfg.gpt.preset`). None: the model has no keys of its own. Set for another model, the
        config refuses them.
    context_length(cfg): tokens per training window (a language model; 0 for others).
    blocks(model): the repeated blocks, an nn.ModuleList that FSDP shards one by one,
        activation checkpointing wraps and `compile=true` compiles; None: the model is one unit.
    flops_per_sample(cfg, model, info): training FLOPs (forward + backward) per sample (per
        window for a language model), for MFU; None: counted by running one sample of the data.
    check(cfg): relations between the model's keys, raising ConfigError at load time.
    describe(cfg): the name the benchmark reports (e.g. "gpt:gpt2-124m").
    hf: how the model's names and shapes map to a Hugging Face model's (`init_from=DIR`,
        `export --format hf`); None: it has no Hugging Face form.
    initial_weights(cfg): where a new run's weights come from when init_from is not set (a
        directory init_from accepts), or None: the weights `build` made.
    architecture(cfg, info): the run's config with the model's sizes as built where it says
        "0: the preset's" or "the dataset's" (exported files record these); None: its keys say
        it all.
    reads_keys: the keys of its kinds' synthetic data (`DatasetKind.synthetic_keys`) that the
        model reads too, whatever the dataset (the GPT: vocab_size, its embedding's rows). A
        model that does not list one leaves it to synthetic data alone: on a dataset directory
        it is dropped from the run's config with a line (config/settings.py), not recorded as
        if it were used.
    head(cfg, info): the names of the classifier head's tensors (their shapes follow the
        dataset's number of classes): `init_from=` a weights file made for other classes leaves
        them as built and loads the rest; None: every tensor must match.
    keep_files(cfg, run_dir): at a run's start, on rank 0, before any checkpoint is read: a new
        run copies the files that define its model into the run directory, a run that has them
        refuses sources changed since (model=hf: hf_model's config.json); None: the config says
        it all.
    preprocessing(cfg): an image model's own input conventions, a dict: "size" (pixels),
        "crop_fraction" (of the resized side the evaluation crop keeps), "crop" ("center",
        "squash"), "interpolation", "mean", "std" (data/preprocessing.py); None: torchvision's
        (224, 224 / 256, bilinear, ImageNet's mean and std).
    """

    name: str
    task: Task
    build: Callable[[Any, DataInfo], nn.Module]
    reads: tuple[str, ...]
    keys: type | None = None
    context_length: Callable[[Any], int] = lambda cfg: 0
    blocks: Callable[[nn.Module], nn.ModuleList] | None = None
    flops_per_sample: Callable[[Any, nn.Module, DataInfo], float] | None = None
    check: Callable[[Any], None] | None = None
    describe: Callable[[Any], str] | None = None
    hf: HFAdapter | None = None
    initial_weights: Callable[[Any], str | None] | None = None
    architecture: Callable[[Any, DataInfo], Any] | None = None
    head: Callable[[Any, DataInfo], Collection[str]] | None = None
    reads_keys: tuple[str, ...] = ()
    keep_files: Callable[[Any, Path], None] | None = None
    preprocessing: Callable[[Any], dict] | None = None

    def training_flops_per_sample(self, cfg, model: nn.Module, info: DataInfo, example) -> float:
        """`example`: a batch of one sample of the run's data, run through a fresh copy of the
        model when the spec has no formula."""
        if self.flops_per_sample is not None:
            return self.flops_per_sample(cfg, model, info)
        return counted_flops(self, cfg, info, example)

    def label(self, cfg) -> str:
        return self.describe(cfg) if self.describe else self.name

    def units_per_sample(self, cfg) -> int:
        """What one sample counts in the task's unit: a window's tokens, else 1."""
        return self.context_length(cfg) or 1


def counted_flops(spec: ModelSpec, cfg, info: DataInfo, example) -> float:
    """Forward + backward FLOPs of one sample, counted by torch on a fresh copy of the model."""
    from torch.utils.flop_counter import FlopCounterMode

    probe = spec.build(cfg, info).eval()  # batch norm refuses one sample in training mode
    with FlopCounterMode(display=False) as counter:
        spec.task.loss(probe, example).backward()
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
