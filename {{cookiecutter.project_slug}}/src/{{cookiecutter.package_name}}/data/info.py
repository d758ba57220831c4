"""What the model is told about its data (`DataInfo`): a leaf module, so the models import it
without importing the data pipeline."""

from __future__ import annotations

from dataclasses import dataclass

from ..config_keys import ConfigError


@dataclass(frozen=True)
class DataInfo:
    """What the model needs to know about the data, and the fingerprint a resume checks."""

    kind: str  # "arrays" or "tokens"
    fingerprint: str
    num_features: int = 0  # arrays
    num_classes: int = 0  # arrays
    vocab_size: int = 0  # tokens


def saved_data_info(values: dict, run_dir) -> DataInfo:
    """The dataset's info a run was built with (train.py records it in every checkpoint)."""
    if not isinstance(values.get("data_info"), dict):
        raise ConfigError(f"{run_dir}: its checkpoint records no data_info (not this package's)")
    return DataInfo(**values["data_info"])
