"""The optimizer and the learning-rate schedule, with the config keys that shape them."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .config_keys import key


# fmt: off
@dataclass
class OptimizerKeys:
    lr: float = key(6e-4, "AdamW peak learning rate (after linear warmup)", bounds=(0, 1e3),
                    closed="(]", resume=True)
    min_lr: float = key(6e-5, "end of the cosine decay, reached at max_steps; at most lr",
                        bounds=(0, 1e3), resume=True)
    warmup_steps: int = key(30, "linear warmup steps", bounds=(0, 10**12), resume=True)
    weight_decay: float = key(0.1, "on matrices only (not biases, norms)", bounds=(0, 1e3),
                              resume=True)
    beta2: float = key(0.95, "AdamW's second-moment decay (beta1 is 0.9)", bounds=(0, 1),
                       closed="[)", resume=True)
    grad_clip: float = key(1.0, "max gradient norm; 0 disables clipping", bounds=(0, 1e9),
                           resume=True)
# fmt: on


def lr_factor(cfg, step: int) -> float:
    """Linear warmup to lr, then cosine decay to min_lr at max_steps."""
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    progress = (step - cfg.warmup_steps) / max(1, cfg.max_steps - cfg.warmup_steps)
    cosine = 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))
    return (cfg.min_lr + (cfg.lr - cfg.min_lr) * cosine) / cfg.lr


def make_optimizer(model: torch.nn.Module, cfg, device: torch.device) -> torch.optim.AdamW:
    """AdamW; weight decay on matrices only; the fused kernel on CUDA."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    fused = device.type == "cuda" and not cfg.cpu_offload
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, cfg.beta2), fused=fused)


class Schedule:
    """The learning rate of each step set on the optimizer's groups, as nanoGPT's get_lr does
    (torch's LambdaLR does the same arithmetic, plus a wrapper around optimizer.step and a
    warning check per step: 0.5-1 % of a tiny model's CPU step). A checkpoint part: its state
    is the step count, under LambdaLR's name (`last_epoch`), so either's checkpoints load."""

    def __init__(self, optimizer: torch.optim.Optimizer, cfg):
        self.optimizer, self.cfg, self.last_epoch = optimizer, cfg, 0
        self._set_lr()

    def step(self) -> None:
        """After each optimizer step: the next step's learning rate."""
        self.last_epoch += 1
        self._set_lr()

    def get_last_lr(self) -> list[float]:
        return [group["lr"] for group in self.optimizer.param_groups]

    def state_dict(self) -> dict:
        return {"last_epoch": self.last_epoch}

    def load_state_dict(self, state: dict) -> None:
        self.last_epoch = int(state["last_epoch"])
        self._set_lr()

    def _set_lr(self) -> None:
        lr = self.cfg.lr * lr_factor(self.cfg, self.last_epoch)
        for group in self.optimizer.param_groups:
            group["lr"] = lr


def make_schedule(optimizer: torch.optim.Optimizer, cfg) -> Schedule:
    return Schedule(optimizer, cfg)
