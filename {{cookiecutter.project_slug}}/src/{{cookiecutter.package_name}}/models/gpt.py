"""A GPT: a decoder-only transformer language model in one file, in the style of nanoGPT.

token + learned position embeddings -> `n_layer` pre-norm blocks (causal self-attention, GELU
MLP) -> final LayerNorm -> output layer tied to the token embedding. Initialised as GPT-2.

Each `Block` is a self-contained module (`forward(x) -> x`): data-parallel wrappers shard and
activation-checkpoint the model block by block.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from ..config_keys import ConfigError, key
from . import gpt_hf, spec

if TYPE_CHECKING:
    from ..data.info import DataInfo

# GPT-2 sizes (Radford et al. 2019, table 2; the "350m" and "1.3b" names follow GPT-3, table 2.1).
# "tiny" trains on a CPU in seconds.
PRESETS: dict[str, dict] = {
    "tiny": {"n_layer": 2, "n_head": 2, "n_embd": 64, "block_size": 64},
    "gpt2-124m": {"n_layer": 12, "n_head": 12, "n_embd": 768, "block_size": 1024},
    "gpt2-350m": {"n_layer": 24, "n_head": 16, "n_embd": 1024, "block_size": 1024},
    "gpt2-1.3b": {"n_layer": 24, "n_head": 32, "n_embd": 2048, "block_size": 1024},
}

GELU = ("exact", "tanh")  # the MLP's GELU: exact (erf), or tanh (GPT-2's approximation)
VOCAB_MULTIPLE = 64  # embedding rows padded to a multiple of 64: faster matmuls on tensor cores


@dataclass
class GPTConfig:
    n_layer: int
    n_head: int
    n_embd: int
    block_size: int  # the longest sequence the model reads (number of position embeddings)
    vocab_size: int  # rows of the embedding: the tokenizer's vocabulary padded, see padded_vocab
    dropout: float = 0.0
    bias: bool = False  # biases in the linear layers and LayerNorms (GPT-2 had them)
    gelu: str = "exact"  # the MLP's GELU: "exact" (erf) or "tanh" (GPT-2's approximation)
    # the tokenizer's vocabulary, before padding (0: vocab_size): the model's logits are its ids
    # only, so no padding row ever enters a softmax (a loss, a metric, a sample)
    real_vocab_size: int = 0

    def __post_init__(self):
        self.real_vocab_size = self.real_vocab_size or self.vocab_size
        for name in ("n_layer", "n_head", "n_embd", "block_size", "vocab_size", "real_vocab_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"GPT {name} must be a positive integer, got {value!r}")
        if self.real_vocab_size > self.vocab_size:
            raise ValueError(
                f"GPT real_vocab_size ({self.real_vocab_size}) must be at most vocab_size "
                f"({self.vocab_size}, the embedding's rows)"
            )
        if self.n_embd % self.n_head:
            raise ValueError(
                f"GPT n_embd ({self.n_embd}) must be a multiple of n_head ({self.n_head})"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"GPT dropout must be in [0, 1), got {self.dropout!r}")
        if self.gelu not in GELU:
            raise ValueError(f"GPT gelu must be one of {', '.join(GELU)}, got {self.gelu!r}")


def padded_vocab(vocab_size: int) -> int:
    """`vocab_size` rounded up to a multiple of 64 (50257 -> 50304, 256 -> 256)."""
    return -(-vocab_size // VOCAB_MULTIPLE) * VOCAB_MULTIPLE


def gpt_config(preset: str, vocab_size: int, **overrides) -> GPTConfig:
    """The preset's sizes with `overrides` (n_layer=..., block_size=...; 0 or None keeps the
    preset's value) and the vocabulary padded to a multiple of 64."""
    if preset not in PRESETS:
        raise ValueError(f"unknown GPT preset {preset!r}; choose one of {', '.join(PRESETS)}")
    allowed = [f.name for f in fields(GPTConfig) if "vocab_size" not in f.name]
    values = dict(PRESETS[preset])
    for name, value in overrides.items():
        if name not in allowed:
            raise ValueError(f"unknown GPT setting {name!r}; accepted: {', '.join(allowed)}")
        if value not in (0, None):
            values[name] = value
    return GPTConfig(**values, vocab_size=padded_vocab(vocab_size), real_vocab_size=vocab_size)


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.n_head, self.dropout = cfg.n_head, cfg.dropout
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=cfg.bias)  # q, k, v at once
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.resid_dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        # (B, T, C) -> (B, heads, T, head size)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        # Flash attention on Hopper GPUs; is_causal: position t attends to positions <= t only.
        # `mask` (packed documents, see document_mask) is causal within each document.
        y = F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=mask,
            dropout_p=self.dropout if self.training else 0.0,
            is_causal=mask is None,
        )
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd, bias=cfg.bias)
        self.gelu = nn.GELU(approximate="tanh" if cfg.gelu == "tanh" else "none")
        self.c_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    """One transformer layer, pre-norm: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), mask)
        return x + self.mlp(self.ln_2(x))


def document_mask(positions: torch.Tensor) -> torch.Tensor:
    """(B, 1, T, T) boolean attention mask of packed documents whose `positions` (B, T) restart
    at 0 with each: token t attends to the tokens s <= t of its own document."""
    document = (positions == 0).cumsum(dim=1)
    same = document[:, :, None] == document[:, None, :]
    T = positions.shape[1]
    causal = torch.ones(T, T, dtype=torch.bool, device=positions.device).tril()
    return (same & causal)[:, None]


class GPT(nn.Module):
    """(batch, time) token ids -> (batch, time, real_vocab_size) next-token logits."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.config = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)  # token embedding
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)  # position embedding
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList([Block(cfg) for _ in range(cfg.n_layer)])
        self.ln_f = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # tied: one matrix embeds and un-embeds tokens
        self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        """GPT-2 initialisation: weights normal(0, 0.02), the projections that write into the
        residual stream scaled by 1/sqrt(2 * n_layer) (two per block), biases 0, LayerNorms 1."""
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
            if isinstance(module, nn.LayerNorm):
                module.reset_parameters()
        for name, param in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(param, mean=0.0, std=0.02 / math.sqrt(2 * self.config.n_layer))

    def forward(self, idx: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """`positions` (B, T): of packed documents, restarting at 0 with each (data/chat.py);
        None: one sequence, 0 to T - 1, with the plain causal mask."""
        T = idx.shape[1]
        if T > self.config.block_size:
            raise ValueError(
                f"sequence of {T} tokens is longer than the model's block_size "
                f"{self.config.block_size}"
            )
        mask = None
        if positions is None:
            positions = torch.arange(T, device=idx.device)
        else:
            mask = document_mask(positions)
        x = self.drop(self.wte(idx) + self.wpe(positions))
        for block in self.blocks:
            x = block(x, mask)
        # the matmul over every row (a multiple of 64 is faster), the padding rows' logits cut
        return self.lm_head(self.ln_f(x))[..., : self.config.real_vocab_size]


def num_params(model: nn.Module, exclude_position_embeddings: bool = True) -> int:
    """Number of parameters (the tied embedding counted once), by default without the position
    embeddings, as in the FLOPs count. Works on wrapped models (DDP, FSDP2, torch.compile)."""
    total = 0
    for name, param in model.named_parameters():  # a shared (tied) parameter is listed once
        if exclude_position_embeddings and name.endswith("wpe.weight"):
            continue
        total += param.numel()
    return total


def flops_per_token(cfg: GPTConfig, n_params: int) -> float:
    """Training FLOPs per token (forward + backward): 6 N + 12 L d T.

    From Chowdhery et al. 2022, "PaLM", appendix B (the count used for MFU): 6 N for the matmuls
    with the N weights (N without the position embeddings, as `num_params` gives it), plus
    12 L d T for the attention scores and their weighted sum (L layers, d = n_embd = heads x head
    size, T = sequence length trained, here `block_size`). The causal mask is not discounted.
    """
    return 6.0 * n_params + 12.0 * cfg.n_layer * cfg.n_embd * cfg.block_size


# ----------------------------------------------------------------- what the training loop uses
# fmt: off
@dataclass
class GPTKeys:
    """The GPT's own config keys: `cfg.gpt` of a run's config (`[gpt]` in a config file,
    `gpt.preset=...` or `preset=...` on the command line). Every field but `preset` is a
    GPTConfig setting of the same name (0: the preset's)."""

    preset: str = key("gpt2-124m", "sizes for the keys below left at 0; tiny trains on a CPU in "
                      "seconds", choices=tuple(PRESETS), resume=True)
    n_layer: int = key(0, "transformer blocks (0: the preset's)", bounds=(0, 1024), resume=True)
    n_head: int = key(0, "attention heads (0: the preset's)", bounds=(0, 1024), resume=True)
    n_embd: int = key(0, "width, a multiple of n_head (0: the preset's)", bounds=(0, 65536),
                      resume=True)
    block_size: int = key(0, "context length in tokens (0: the preset's)", bounds=(0, 2**20),
                          resume=True)
    bias: bool = key(False, "biases in the linear layers and LayerNorms (GPT-2: true)",
                     resume=True)
    gelu: str = key("exact", "the MLP's GELU: exact, or tanh (GPT-2's approximation)",
                    choices=GELU, resume=True)
# fmt: on


def config_of(cfg, info: DataInfo | None = None) -> GPTConfig:
    """The GPT of a run: its preset with the config's sizes over it and the dataset's vocabulary
    (derived here only). Without `info` the vocabulary is a stand-in: the config check and the
    context length read only the sizes, which do not depend on it."""
    own: GPTKeys = cfg.gpt
    vocab_size = VOCAB_MULTIPLE
    if info is not None:
        if cfg.vocab_size and cfg.vocab_size < info.vocab_size:
            raise ConfigError(
                f"config key 'vocab_size' is {cfg.vocab_size} but the dataset's tokens go up to "
                f"{info.vocab_size}; use 0 (the dataset's) or a larger value"
            )
        vocab_size = cfg.vocab_size or info.vocab_size
    settings = asdict(own)
    return gpt_config(settings.pop("preset"), vocab_size, **settings, dropout=cfg.dropout)


def check(cfg) -> None:
    """The GPTConfig's own checks on the config's sizes, at load time, with the preset's."""
    try:
        config_of(cfg)
    except ValueError as err:
        preset = cfg.gpt.preset
        given = ", ".join(f"{name} {value}" for name, value in PRESETS[preset].items())
        raise ConfigError(f"config keys of model gpt: {err} (preset {preset!r}: {given})") from None


def as_built(cfg, info: DataInfo):
    """The run's config with the sizes the model was built with in place of "0: the preset's",
    and the dataset's vocabulary in place of vocab_size=0."""
    built = config_of(cfg, info)
    sizes = {name: getattr(built, name) for name in PRESETS[cfg.gpt.preset]}
    return replace(cfg, vocab_size=cfg.vocab_size or info.vocab_size, gpt=replace(cfg.gpt, **sizes))


def training_flops(cfg, model: nn.Module, info: DataInfo) -> float:
    """Per window of block_size tokens: the standard 6N + 12LdT per token."""
    config = config_of(cfg, info)
    return flops_per_token(config, num_params(model)) * config.block_size


def describe(cfg) -> str:
    """gpt:<preset>, or the weights it starts from (`init_from`), whose sizes it has."""
    if cfg.init_from:
        return f"gpt:{Path(cfg.init_from).name} (init_from, preset {cfg.gpt.preset})"
    return f"gpt:{cfg.gpt.preset}"


SPEC = spec.ModelSpec(
    name="gpt",
    task=spec.LANGUAGE_MODEL,
    reads=("tokens", "chat"),
    build=lambda cfg, info: GPT(config_of(cfg, info)),
    keys=GPTKeys,
    context_length=lambda cfg: config_of(cfg).block_size,
    blocks=lambda model: model.blocks,
    flops_per_sample=training_flops,
    check=check,
    describe=describe,
    architecture=as_built,
    reads_keys=("vocab_size",),
    hf=spec.HFAdapter(  # GPT-2's format (gpt_hf.py); the real vocabulary, not the padded one
        from_hf=lambda cfg, info, hf, names, _: gpt_hf.from_hf(
            hf, names, config_of(cfg, info), cfg.vocab_size or info.vocab_size
        ),
        to_hf=lambda cfg, info, state: gpt_hf.to_hf(
            state, config_of(cfg, info), cfg.vocab_size or info.vocab_size
        ),
        config=lambda cfg, info: gpt_hf.hf_config(
            config_of(cfg, info), cfg.vocab_size or info.vocab_size
        ),
    ),
)
