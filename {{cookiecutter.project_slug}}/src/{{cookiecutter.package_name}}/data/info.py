"""What the model is told about its data (`DataInfo`): a leaf module, so the models import it
without importing the data pipeline."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DataInfo:
    """What the model needs to know about the data, and the fingerprint a resume checks."""

    kind: str  # "arrays" or "tokens"
    fingerprint: str
    num_features: int = 0  # arrays
    num_classes: int = 0  # arrays
    vocab_size: int = 0  # tokens
