"""Which model a run trains, and its loss. To train your own, add it to `build_model` (and
`flops_per_sample` for MFU): nothing else in the package depends on the architecture. The GPT
lives in gpt.py; the MLP below is the minimal example (classification of feature vectors).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from . import gpt
from .config import ConfigError
from .data import DataInfo


class MLP(nn.Module):
    """A small classifier: (batch, features) -> (batch, classes) logits."""

    def __init__(self, features: int, hidden: int, classes: int, dropout: float):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(features, hidden),
            nn.GELU(),
            nn.Dropout(dropout),
            nn.Linear(hidden, hidden),
            nn.GELU(),
            nn.Dropout(dropout),
            nn.Linear(hidden, classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def gpt_config(cfg, info: DataInfo) -> gpt.GPTConfig:
    if cfg.vocab_size and cfg.vocab_size < info.vocab_size:
        raise ConfigError(
            f"config key 'vocab_size' is {cfg.vocab_size} but the dataset's tokens go up to "
            f"{info.vocab_size}; use 0 (the dataset's) or a larger value"
        )
    return gpt.gpt_config(
        cfg.preset,
        cfg.vocab_size or info.vocab_size,
        n_layer=cfg.n_layer,
        n_head=cfg.n_head,
        n_embd=cfg.n_embd,
        block_size=cfg.block_size,
        dropout=cfg.dropout,
    )


def block_size(cfg) -> int:
    """Context length of the GPT (0 for the MLP), known before the data is opened."""
    if cfg.model != "gpt":
        return 0
    return cfg.block_size or gpt.PRESETS[cfg.preset]["block_size"]


def build_model(cfg, info: DataInfo) -> nn.Module:
    if cfg.model == "gpt":
        return gpt.GPT(gpt_config(cfg, info))
    return MLP(info.num_features, cfg.hidden_dim, info.num_classes, cfg.dropout)


def loss_fn(output: torch.Tensor, target: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Cross entropy in fp32 for both models: (B, C) logits with (B,) labels, or (B, T, V)
    logits with (B, T) next tokens."""
    return F.cross_entropy(output.flatten(0, -2).float(), target.flatten(), reduction=reduction)


def flops_per_sample(cfg, model: nn.Module, info: DataInfo) -> float:
    """Training FLOPs (forward + backward) per sample: per sequence for the GPT (the standard
    6N + 12LdT per token), counted by running the MLP once."""
    if cfg.model == "gpt":
        config = gpt_config(cfg, info)
        return gpt.flops_per_token(config, gpt.num_params(model)) * config.block_size
    from torch.utils.flop_counter import FlopCounterMode

    x = torch.zeros(1, info.num_features)
    probe = MLP(info.num_features, cfg.hidden_dim, info.num_classes, 0.0)
    with FlopCounterMode(display=False) as counter:
        loss_fn(probe(x), torch.zeros(1, dtype=torch.long)).backward()
    return float(counter.get_total_flops())
