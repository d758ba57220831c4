"""`model=timm`: any classification model of timm (PyTorch Image Models: about 1,300
architectures), by name (`timm_model=resnet50`, `convnext_tiny`, `vit_base_patch16_224`, ...),
for the classes of an images dataset, with everything `model=vision` has (models/vision.py).

A name may carry a pretrained tag, `resnet50.a1_in1k`: the tag whose weights you start from
(`init_from=` its `model.safetensors`, fetched on a login node). The tag's pretrained config
gives the run's preprocessing: image size (unless `image_size` is set), evaluation crop,
interpolation, mean and std (data/preprocessing.py); without a tag, timm's default tag's. The
model is timm's own module with new weights (`pretrained=False`: nothing is downloaded): its
state-dict names are timm's, so a hub file loads by name (a classifier for other classes than
the dataset's stays as built: `head`) and an exported file reloads with
`timm.create_model(name, num_classes=...)`.

Its blocks (FSDP's units, what activation checkpointing and `compile=true` wrap) are timm's own
layout where it has one: the items of its `blocks` containers (a ViT's `blocks`, a ConvNeXt's or
Swin's `stages[i].blocks`, an EfficientNet's `blocks[i][j]`); elsewhere (ResNets, RegNets,
Inception) models/vision.py's rule, the repeated module type with the most parameters.

timm is the optional extra `[timm]`, imported only when a run uses model=timm; it needs
torchvision, which comes from the container image or the uenv (docs/vision.md).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from ..config_keys import ConfigError, first_line, key, optional_import
from . import spec, vision

if TYPE_CHECKING:
    from ..data.info import DataInfo

CONTAINERS = (nn.Sequential, nn.ModuleList)


@dataclass
class TimmKeys:
    """The timm model's own config keys: `cfg.timm` (`[timm]` in a config file)."""

    timm_model: str = key("resnet50", "a timm classification model: resnet50, convnext_tiny, "
                          "vit_base_patch16_224, ...; name.tag (resnet50.a1_in1k): that "
                          "pretrained tag's preprocessing", resume=True)  # fmt: skip


def timm_module():
    """timm, or a one-line ConfigError saying how to install it."""
    return optional_import("timm", "timm", "model=timm")


def pretrained_config(name: str) -> dict:
    """The pretrained config of `name` (name.tag: that tag's; a bare name: timm's default tag's):
    input_size, mean, std, interpolation, crop_pct, crop_mode, fixed_input_size, ..."""
    found = timm_module().models.get_pretrained_cfg(name)
    return found.to_dict() if found is not None else {}


def check(cfg) -> None:
    """`timm_model` must name a timm model (and a tag it has); a typo gets the close ones; the
    image size must suit it."""
    timm = timm_module()
    name = cfg.timm.timm_model
    architecture, _, tag = name.partition(".")
    if not timm.is_model(architecture):
        close = difflib.get_close_matches(architecture, timm.list_models(), n=4, cutoff=0.6)
        hint = f"did you mean {', '.join(close)}?" if close else "e.g. resnet50, convnext_tiny"
        raise ConfigError(f"config key 'timm_model': timm has no model {architecture!r}; {hint}")
    if tag and name not in timm.list_pretrained(f"{architecture}.*"):
        tags = [t.partition(".")[2] for t in timm.list_pretrained(f"{architecture}.*")]
        raise ConfigError(
            f"config key 'timm_model': timm has no pretrained tag {tag!r} for {architecture}; "
            f"its tags: {', '.join(tags) or 'none'}"
        )
    size = cfg.image_size or int(preprocessing(cfg)["size"])
    try:
        with torch.device("meta"), torch.no_grad():
            create(name, 10, size).eval()(torch.empty(1, 3, size, size))
    except (AssertionError, RuntimeError, ValueError) as err:
        raise ConfigError(
            f"config key 'image_size': timm_model={name} cannot take {size}-pixel images "
            f"({first_line(err)}); choose another image_size"
        ) from None


def preprocessing(cfg) -> dict:
    """The model's input conventions (spec.ModelSpec.preprocessing), from its pretrained
    config: what timm.data.resolve_model_data_config gives, as data/preprocessing.py reads it."""
    found = pretrained_config(cfg.timm.timm_model)
    _, height, width = found.get("input_size", (3, 224, 224))
    return {
        "size": height if height == width else min(height, width),  # a square crop
        "crop_fraction": found.get("crop_pct") or 0.875,  # timm's DEFAULT_CROP_PCT
        "crop": found.get("crop_mode") or "center",
        "interpolation": found.get("interpolation") or "bilinear",
        "mean": tuple(found.get("mean", (0.485, 0.456, 0.406))),
        "std": tuple(found.get("std", (0.229, 0.224, 0.225))),
    }


def create(name: str, classes: int, size: int) -> nn.Module:
    """timm's model `name` for `classes` classes with timm's initialisation, nothing
    downloaded. A model made for one input size (a ViT's position embeddings, a Swin's windows:
    `fixed_input_size` in its config) is made for `size`."""
    options = {"img_size": size} if pretrained_config(name).get("fixed_input_size") else {}
    try:
        return timm_module().create_model(name, pretrained=False, num_classes=classes, **options)
    except (TypeError, ValueError, RuntimeError, AssertionError) as err:
        raise ConfigError(
            f"timm_model={name}: timm cannot build it for {classes} classes with "
            f"{options or 'its defaults'}: {first_line(err)}"
        ) from None


def image_size(cfg, info: DataInfo) -> int:
    """The run's image size: the dataset's (data/preprocessing.py resolved it)."""
    return int(info.details.get("image_size") or cfg.image_size or preprocessing(cfg)["size"])


def build(cfg, info: DataInfo) -> nn.Module:
    """`timm_model` for the dataset's classes, with new weights from torch's RNG (seeded by the
    caller); channels_last on a GPU."""
    model = create(cfg.timm.timm_model, info.num_classes, image_size(cfg, info))
    if vision.wants_channels_last(cfg):
        model = model.to(memory_format=torch.channels_last)
    return model


def head(cfg, info: DataInfo) -> set[str]:
    """The classifier head's tensors (`fc.*` of a ResNet, `head.fc.*` of a ConvNeXt, `head.*` of
    a ViT): those whose shape follows the number of classes."""
    size = image_size(cfg, info)
    return vision.following_classes(
        lambda classes: create(cfg.timm.timm_model, classes, size), info.num_classes
    )


def items(container: nn.Module) -> list[nn.Module]:
    """The blocks a timm `blocks` container holds: its items, and the items of the plain
    containers in it whose own items are blocks (an EfficientNet's stage of blocks)."""
    found = []
    for child in container.children():
        nested = type(child) in CONTAINERS and all(
            vision.is_unit(c) or type(c) in CONTAINERS for c in child.children()
        )
        found.extend(items(child) if nested else [child])
    return found


def blocks(model: nn.Module) -> nn.ModuleList | None:
    """The model's repeated blocks, in model order: the items of timm's `blocks` containers
    (those that hold parameters: a pooling layer between blocks is not a unit), else
    models/vision.py's repeated units, less any inside another (DLA's trees hold trees)."""
    found: list[nn.Module] = []
    taken: list[str] = []
    for name, module in model.named_modules():
        outside = not any(name.startswith(prefix + ".") for prefix in taken)
        if outside and name.rpartition(".")[2] == "blocks" and type(module) in CONTAINERS:
            taken.append(name)
            found += [b for b in items(module) if next(b.parameters(), None) is not None]
    if found:
        return nn.ModuleList(found)
    units = vision.blocks(model)
    if units is None:
        return None
    inner = {id(m) for unit in units for m in unit.modules() if m is not unit}
    return nn.ModuleList(unit for unit in units if id(unit) not in inner)


SPEC = spec.ModelSpec(
    name="timm",
    task=vision.IMAGE_CLASSIFIER,
    reads=("images",),
    build=build,
    keys=TimmKeys,
    blocks=blocks,
    check=check,
    describe=lambda cfg: f"timm:{cfg.timm.timm_model}",
    head=head,
    preprocessing=preprocessing,
)
