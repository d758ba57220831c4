"""The GPT in Hugging Face's GPT-2 format (`GPT2LMHeadModel`): OpenAI's GPT-2 weights, or any
GPT-2 checkpoint, into the package's GPT (`init_from=DIR`), and the package's GPT out as a
directory transformers, lm-eval and vLLM load (`export --format hf`).

The two differ in names only, and in one layout: GPT-2's linear layers are `Conv1D`s whose
weight is stored (in, out), the transpose of `nn.Linear`'s (out, in) - as nanoGPT's
`from_pretrained` does. GPT-2 has biases and the tanh GELU (`gelu_new`): the package's GPT
takes them with `bias=true gelu=tanh`; a GPT without biases is written with zero biases.
Only names, shapes and config.json's settings are here; checkpoint/ reads and writes the files.
Nothing here imports transformers: config.json is plain JSON.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from .spec import HFName

CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
GELU = {"gelu_new": "tanh", "gelu_pytorch_tanh": "tanh", "gelu": "exact"}  # HF name -> ours
# GPT2Config settings that change the function, and the one value the GPT implements (the default)
FUNCTION_SETTINGS = {
    "scale_attn_weights": True,  # attention scores divided by sqrt(head size)
    "scale_attn_by_inverse_layer_idx": False,  # and by the layer's number
    "reorder_and_upcast_attn": False,  # the scores computed in float32 under autocast
    "add_cross_attention": False,  # an encoder-decoder's cross-attention layers
}
BUFFERS = (".attn.bias", ".attn.masked_bias")  # causal masks some GPT-2 files carry: not weights


class Mismatch(ValueError):
    """The Hugging Face model is not the configured GPT; the message names the first setting."""


def check_config(hf: dict, gpt, vocab_size: int) -> None:
    """`hf` (config.json) against the run's GPTConfig `gpt` and its real vocabulary."""
    if hf.get("model_type") != "gpt2":
        raise Mismatch(
            f"model_type is {hf.get('model_type')!r}, not 'gpt2' (model=gpt reads GPT-2)"
        )
    activation = hf.get("activation_function", "gelu_new")
    wanted = {
        "n_layer": ("n_layer", gpt.n_layer),
        "n_head": ("n_head", gpt.n_head),
        "n_embd": ("n_embd", gpt.n_embd),
        "vocab_size": ("vocab_size (the dataset's or the config's)", vocab_size),
    }
    for key, (ours, value) in wanted.items():
        if hf.get(key) != value:
            raise Mismatch(f"its {key} is {hf.get(key)!r}, the run's {ours} is {value!r}")
    if not isinstance(hf.get("n_positions"), int) or hf["n_positions"] < gpt.block_size:
        raise Mismatch(
            f"its n_positions is {hf.get('n_positions')!r}, shorter than the run's block_size "
            f"{gpt.block_size}"
        )
    if GELU.get(activation) != gpt.gelu:
        need = GELU.get(activation)
        raise Mismatch(
            f"its activation_function is {activation!r}"
            + (f": set gelu={need}" if need else ": not a GELU the GPT has")
        )
    if not gpt.bias:
        raise Mismatch("GPT-2 has biases: set bias=true")
    if hf.get("n_inner") not in (None, 4 * gpt.n_embd):
        raise Mismatch(f"its n_inner is {hf['n_inner']}, the GPT's MLP is 4 x n_embd")
    if abs(hf.get("layer_norm_epsilon", 1e-5) - 1e-5) > 1e-12:
        raise Mismatch(f"its layer_norm_epsilon is {hf['layer_norm_epsilon']}, the GPT's 1e-5")
    for setting, value in FUNCTION_SETTINGS.items():
        if hf.get(setting, value) != value:
            raise Mismatch(
                f"its {setting} is {hf[setting]!r}: the GPT implements only {value!r} (GPT-2's)"
            )
    if hf.get("tie_word_embeddings", True) is False:
        raise Mismatch("its output layer is not tied to the token embedding (the GPT's is)")


def from_hf(hf: dict, names: Iterable[str], gpt, vocab_size: int) -> dict[str, HFName]:
    """Where each tensor of the GPT is among a GPT-2's: `hf` is its config.json, `names` its
    tensors' names (with or without `transformer.`). Conv1D weights are stored transposed; the
    embedding's rows past GPT-2's vocabulary are zeros (the GPT's padded vocabulary); a GPT of
    a shorter block_size than n_positions reads the first rows of the position table (as
    nanoGPT's crop_block_size); the output layer is the embedding (tied), so it is not read."""
    check_config(hf, gpt, vocab_size)
    found = {}
    for name in names:
        short = name.removeprefix("transformer.")
        if short.endswith(BUFFERS) or short == "lm_head.weight":  # masks; the tied output layer
            continue
        ours = short.replace("h.", "blocks.", 1) if short.startswith("h.") else short
        found[ours] = HFName(
            name,
            transposed=short.endswith(CONV1D),
            padded=ours == "wte.weight",
            cut=ours == "wpe.weight",
        )
    return found


def to_hf(state: dict[str, torch.Tensor], gpt, vocab_size: int) -> dict[str, torch.Tensor]:
    """The GPT's state dict -> the tensors of a GPT2LMHeadModel: the embedding cut to the real
    vocabulary, Conv1D weights transposed, zero biases for a GPT without them."""
    tensors = {}
    for name, tensor in state.items():
        if name == "lm_head.weight":  # tied to wte: GPT-2 stores it once
            continue
        hf = "h." + name.removeprefix("blocks.") if name.startswith("blocks.") else name
        value = tensor[:vocab_size] if name == "wte.weight" else tensor
        tensors["transformer." + hf] = (value.t() if hf.endswith(CONV1D) else value).contiguous()
    if not gpt.bias:
        for name, tensor in list(tensors.items()):
            if name.endswith(".weight") and "wte" not in name and "wpe" not in name:
                out = tensor.shape[-1] if name.endswith(CONV1D) else tensor.shape[0]
                tensors[name.removesuffix(".weight") + ".bias"] = tensor.new_zeros(out)
    return tensors


def hf_config(gpt, vocab_size: int) -> dict:
    """The config.json of the GPT as a GPT2LMHeadModel."""
    return {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": vocab_size,
        "n_positions": gpt.block_size,
        "n_embd": gpt.n_embd,
        "n_layer": gpt.n_layer,
        "n_head": gpt.n_head,
        "n_inner": None,
        "activation_function": "gelu_new" if gpt.gelu == "tanh" else "gelu",
        "layer_norm_epsilon": 1e-5,
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
        "tie_word_embeddings": True,
    }
