"""What a checkpoint holds: objects with `state_dict()`/`load_state_dict()` ("parts"). The model
and optimizer (plain, DDP or FSDP2), the step and JSON extras, every rank's random generators."""

from __future__ import annotations

import io
import json
import logging
import random
import zlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)

log = logging.getLogger(__name__.split(".")[0])


class ModelAndOptimizer:
    """Model and optimizer through DCP's state-dict helpers: works for a plain module, DDP and
    FSDP2 (`fully_shard`, whose tensors stay sharded); keys carry no `module.`/`_orig_mod.`.
    Frozen parameters (a LoRA run's base, read from its own files at every start) are not
    saved, nor expected when loading."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None):
        self.model, self.optimizer = model, optimizer
        frozen = any(not p.requires_grad for p in model.parameters())
        self.options = StateDictOptions(ignore_frozen_params=frozen, strict=not frozen)

    def state_dict(self) -> dict:
        if self.optimizer is None:
            return {"model": get_model_state_dict(self.model, options=self.options)}
        model, optim = get_state_dict(self.model, self.optimizer, options=self.options)
        return {"model": model, "optim": optim}

    def load_state_dict(self, state: dict) -> None:
        if self.optimizer is None:
            set_model_state_dict(self.model, state["model"], options=self.options)
        else:
            set_state_dict(
                self.model,
                self.optimizer,
                model_state_dict=state["model"],
                optim_state_dict=state["optim"],
                options=self.options,
            )


@dataclass
class TrainState:
    """The step, the data position (`samples_seen`: samples of the global stream consumed, see
    data/batches.py), and JSON values in `extra` (dataset fingerprint, config, world size,
    commit, torch version). The same on every rank: one copy is written."""

    step: int = 0
    samples_seen: int = 0
    extra: dict = field(default_factory=dict)

    def state_dict(self) -> dict:
        try:
            extra = json.dumps(self.extra, sort_keys=True)
        except (TypeError, ValueError) as err:
            raise TypeError(
                f"TrainState.extra must hold JSON values (str, number, bool, None, list, dict): "
                f"{err}"
            ) from None
        return {"step": int(self.step), "samples_seen": int(self.samples_seen), "extra": extra}

    def load_state_dict(self, state: dict) -> None:
        self.step, self.samples_seen = int(state["step"]), int(state["samples_seen"])
        self.extra = json.loads(state["extra"])


class RNGState:
    """Every rank's random generators: torch (CPU, and CUDA if present), Python's `random` and
    `np_rng`. Saving gathers all ranks' states (collective). Loading restores this rank's; a
    rank the checkpoint has no state for (more ranks now) is reseeded deterministically from
    (`seed`, rank, the checkpoint) and says so in `note` and in a warning."""

    def __init__(self, np_rng: np.random.Generator | None = None, seed: int = 0):
        self.np_rng, self.seed = np_rng, seed
        self.note: str | None = None

    def capture(self) -> dict:
        state = {"torch": torch.get_rng_state(), "python": random.getstate()}
        if self.np_rng is not None:
            state["numpy"] = self.np_rng.bit_generator.state
        if torch.cuda.is_available():
            state["cuda"] = torch.cuda.get_rng_state()
        return state

    def restore(self, state: dict) -> None:
        torch.set_rng_state(state["torch"])
        random.setstate(state["python"])
        if self.np_rng is not None and "numpy" in state:
            self.np_rng.bit_generator.state = state["numpy"]
        if "cuda" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state(state["cuda"])

    def state_dict(self) -> dict:
        states = all_gather(self.capture(), None)
        buffer = io.BytesIO()
        torch.save(states, buffer)
        # One opaque value: DCP would split a list into per-rank keys, and a checkpoint with
        # 2 of them would then not load into a run with 3 ranks.
        return {"per_rank": buffer.getvalue()}

    def load_state_dict(self, state: dict) -> None:
        states = torch.load(io.BytesIO(state["per_rank"]), weights_only=True)
        rank = dist.get_rank() if dist.is_initialized() else 0
        self.note = None
        if rank < len(states):
            self.restore(states[rank])
            return
        mix = zlib.crc32(states[0]["torch"].numpy().tobytes())  # differs between checkpoints
        seq = np.random.SeedSequence([self.seed, rank, mix])
        seed = int(seq.generate_state(1, np.uint64)[0] >> np.uint64(1))
        torch.manual_seed(seed)  # also seeds every CUDA device
        random.seed(seed)
        if self.np_rng is not None:
            self.np_rng.bit_generator.state = type(self.np_rng.bit_generator)(seq).state
        self.note = (
            f"the checkpoint holds random states for {len(states)} rank(s); rank {rank} has "
            "none and is reseeded (dropout/augmentation differ from an uninterrupted run)"
        )
        log.warning("random states: %s", self.note)


def all_gather(obj: Any, group) -> list:
    if not dist.is_initialized():
        return [obj]
    out: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, obj, group=group)
    return out


def check_replicas(model: torch.nn.Module) -> None:
    """DDP: all ranks must hold the same weights (DCP writes each replicated tensor from one of
    them). They diverge only through a bug, e.g. rank-dependent code around `no_sync`; fail
    loudly instead of saving. Collective. Not for FSDP, whose ranks hold different shards."""
    checksum = float(sum(p.detach().double().sum() for p in model.parameters()))
    sums = all_gather(checksum, None)
    if len(set(sums)) > 1:
        raise RuntimeError(f"model replicas differ between ranks (parameter sums {sums})")
