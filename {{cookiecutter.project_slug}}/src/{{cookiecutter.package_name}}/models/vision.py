"""`model=vision`: any torchvision classification model, by name (`vision_model=resnet50`,
`resnet18`, `vit_b_16`, `convnext_tiny`, ...), for the classes of an images dataset
(data/images.py: (3, image_size, image_size) float tensors normalised with ImageNet's mean and
std, int64 labels; image_size=0: 224).

The model is torchvision's own module, unwrapped: its state-dict names are torchvision's, so
`init_from=` a torchvision weights file (`.pth`, fetched on a login node) loads it by name, with
a new classifier head when the dataset's classes differ from the file's (`head`), and an
exported file reloads with `torchvision.models.get_model(name, num_classes=...)`.

Its repeated units (a ResNet's BasicBlock/Bottleneck modules, a ViT's encoder layers, a
ConvNeXt's CNBlocks) are the blocks that FSDP shards one by one, activation checkpointing wraps
and `compile=true` compiles. On a GPU, weights and images are channels_last (the layout cuDNN's
convolutions run fastest in); `precision=auto` computes in bf16.

torchvision is imported only when a run uses model=vision: it is the optional extra `[vision]`
(on Alps it comes with the container image or the uenv, built for its torch: docs/vision.md).
"""

from __future__ import annotations

import dataclasses
import difflib
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from ..config_keys import ConfigError, first_line, key, optional_import
from ..data.preprocessing import TORCHVISION_SIZE
from ..parallel import parameters_on_meta
from . import spec

if TYPE_CHECKING:
    from ..data.info import DataInfo


@dataclass
class VisionKeys:
    """The torchvision model's own config keys: `cfg.vision` (`[vision]` in a config file)."""

    vision_model: str = key("resnet50", "a torchvision classification model: resnet18, "
                            "resnet50, vit_b_16, convnext_tiny, ...", resume=True)  # fmt: skip


def torchvision_module():
    """torchvision, or a one-line ConfigError saying how to install it."""
    return optional_import("torchvision", "vision", "model=vision")


def classification_models() -> list[str]:
    """The names torchvision builds as image classifiers (not its detection or video models)."""
    torchvision = torchvision_module()
    return torchvision.models.list_models(module=torchvision.models)


def check(cfg) -> None:
    """`vision_model` must name a torchvision classification model; a typo gets the close ones."""
    name = cfg.vision.vision_model
    known = classification_models()
    if name not in known:
        close = difflib.get_close_matches(name, known, n=4, cutoff=0.6)
        hint = f"did you mean {', '.join(close)}?" if close else "e.g. resnet50, vit_b_16"
        raise ConfigError(
            f"config key 'vision_model': torchvision has no classification model {name!r}; {hint}"
        )
    probe_image_size(name, cfg.image_size or TORCHVISION_SIZE)


def probe_image_size(name: str, size: int) -> None:
    """A model that cannot take `size`-pixel images (a ViT's patches, Inception's smallest
    input) says so when the config is loaded, not in a traceback at its first step: one forward
    on the meta device (shapes only, no memory; about 0.1 s)."""
    from ..data.info import DataInfo

    info = DataInfo("images", "", num_classes=10, details={"image_size": size})
    try:
        with torch.device("meta"), torch.no_grad():
            torchvision_model(name, 10, info).eval()(torch.empty(1, 3, size, size))
    except (AssertionError, RuntimeError) as err:
        raise ConfigError(
            f"config key 'image_size': vision_model={name} cannot take {size}-pixel images "
            f"({first_line(err)}); choose another image_size"
        ) from None


def wants_channels_last(cfg) -> bool:
    """Weights in channels_last when the run computes on a GPU (device=auto finds one)."""
    return cfg.device != "cpu" and torch.cuda.is_available()


def family_options(name: str, info: DataInfo) -> dict:
    """What some families need beyond the number of classes: a ViT's position embeddings and a
    MaxViT's attention windows are made for one image size (the dataset's, `image_size`); the
    auxiliary classifiers of GoogLeNet and Inception v3 (extra outputs in training) are off."""
    size = int(info.details.get("image_size", 224))
    if name.startswith("vit_"):
        return {"image_size": size}
    if name.startswith("maxvit_"):
        return {"input_size": (size, size)}
    if name in ("googlenet", "inception_v3"):
        return {"aux_logits": False, "init_weights": True}
    return {}


def torchvision_model(name: str, classes: int, info: DataInfo) -> nn.Module:
    """torchvision's model `name` for `classes` classes, with torchvision's initialisation; a
    size it cannot be built for (a MaxViT's windows at image_size=96) in one line."""
    options = family_options(name, info)
    try:
        return torchvision_module().models.get_model(
            name, weights=None, num_classes=classes, **options
        )
    except ValueError as err:
        raise ConfigError(
            f"vision_model={name}: torchvision cannot build it for {classes} classes with "
            f"{options or 'its defaults'}: {first_line(err)}"
        ) from None


def build(cfg, info: DataInfo) -> nn.Module:
    """`vision_model` for the dataset's classes, with new weights from torch's RNG (seeded by
    the caller); channels_last on a GPU."""
    model = torchvision_model(cfg.vision.vision_model, info.num_classes, info)
    if wants_channels_last(cfg):
        model = model.to(memory_format=torch.channels_last)
    return model


def head(cfg, info: DataInfo) -> set[str]:
    """The names of the classifier head's tensors (fc.* of a ResNet, heads.head.* of a ViT)."""
    return following_classes(
        lambda classes: torchvision_model(cfg.vision.vision_model, classes, info), info.num_classes
    )


def following_classes(build_for: Callable[[int], nn.Module], classes: int) -> set[str]:
    """The tensors whose shape follows the number of classes, found by building the model
    (`build_for(classes)`) for two numbers of classes with its parameters on the meta device
    (shapes, no memory)."""
    shapes = []
    for count in (classes, classes + 1):
        with parameters_on_meta():
            built = build_for(count)
        shapes.append({name: t.shape for name, t in built.state_dict().items()})
    return {name for name, shape in shapes[0].items() if shapes[1][name] != shape}


def is_unit(module: nn.Module) -> bool:
    """Could be a block: it has submodules and a forward of its own. Not a leaf (a VGG's
    convolutions are single layers), an nn.Sequential (Conv2dNormActivation, a ViT's MLPBlock:
    parts of a block) or a bare nn.ModuleList/ModuleDict (no forward)."""
    has_children = next(module.children(), None) is not None
    bare = type(module) in (nn.ModuleList, nn.ModuleDict)
    return has_children and not bare and not isinstance(module, nn.Sequential)


def blocks(model: nn.Module) -> nn.ModuleList | None:
    """The model's repeated units: of the types of `is_unit` modules that occur more than once
    and never inside another such type's modules, the one with the most parameters in all (a
    ResNet's BasicBlock or Bottleneck, a ViT's EncoderBlock, a ConvNeXt's CNBlock, GoogLeNet's
    Inception); None where nothing repeats (a VGG: one unit). The list holds the model's own
    modules, in model order."""
    found: dict[type, list[tuple[str, nn.Module]]] = defaultdict(list)
    for name, module in model.named_modules():
        if name and is_unit(module):
            found[type(module)].append((name, module))
    repeated = {kind: found[kind] for kind in found if len(found[kind]) > 1}
    names = {name: kind for kind, modules in repeated.items() for name, _ in modules}

    def nested(kind: type) -> bool:  # some module of `kind` is inside another repeated type's
        return any(
            names.get(name[:i]) not in (None, kind)
            for name, _ in repeated[kind]
            for i in range(len(name))
            if name[i] == "."
        )

    def size(kind: type) -> int:
        return sum(p.numel() for _, module in repeated[kind] for p in module.parameters())

    outer = [kind for kind in repeated if not nested(kind)]
    if not outer:
        return None
    return nn.ModuleList(module for _, module in repeated[max(outer, key=size)])


def channels_last(images: torch.Tensor) -> torch.Tensor:
    """On a GPU, the batch in the layout the channels_last weights run fastest with."""
    return images.contiguous(memory_format=torch.channels_last) if images.is_cuda else images


IMAGE_CLASSIFIER = dataclasses.replace(
    spec.CLASSIFIER,
    name="image classifier",
    unit="images",
    loss=lambda model, batch: spec.cross_entropy(model(channels_last(batch[0])), batch[1], "sum"),
    scores=lambda model, batch: spec.classifier_scores(model(channels_last(batch[0])), batch[1]),
)


SPEC = spec.ModelSpec(
    name="vision",
    task=IMAGE_CLASSIFIER,
    reads=("images",),
    build=build,
    keys=VisionKeys,
    blocks=blocks,
    check=check,
    describe=lambda cfg: f"vision:{cfg.vision.vision_model}",
    head=head,
)
