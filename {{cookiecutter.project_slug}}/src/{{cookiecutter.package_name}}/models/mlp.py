"""The minimal example: a small classifier of feature vectors, (batch, features) -> (batch,
classes) logits. A model of the package is a module like this one: the network, its own config
keys, and a `SPEC` that tells the training loop how to build and score it (see spec.py and
docs/your-model.md)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..config_keys import key
from . import spec


@dataclass
class MLPKeys:
    """The classifier's own config keys: `cfg.mlp` (`[mlp]` in a config file)."""

    hidden_dim: int = key(256, "hidden width", bounds=(1, 2**20), resume=True)


class MLP(nn.Module):
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


SPEC = spec.ModelSpec(
    name="mlp",
    task=spec.CLASSIFIER,
    reads=("arrays",),
    build=lambda cfg, info: MLP(
        info.num_features, cfg.mlp.hidden_dim, info.num_classes, cfg.dropout
    ),
    keys=MLPKeys,
)
