"""The example model. To train your own, change `build_model` (and `loss_fn` if needed):
nothing else in the package depends on the architecture."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


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


def build_model(cfg, num_features: int, num_classes: int) -> nn.Module:
    return MLP(num_features, cfg.hidden_dim, num_classes, cfg.dropout)


def loss_fn(output: torch.Tensor, target: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    return F.cross_entropy(output.float(), target, reduction=reduction)
