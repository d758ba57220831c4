"""How an image becomes the model's input: its size, the evaluation resize and crop, the
interpolation, the mean and std. One `Preprocessing` per run, resolved once from the config and
the model (`resolve`), recorded in the dataset's info (so every checkpoint and every export
carries it: `export_fields`) and turned into the evaluation transform here (the training one,
with its augmentation: augmentation.py).

Where each value comes from: `image_size`, `interpolation` and `eval_crop_fraction` when set
(augmentation.py declares the last two); the rest from the model's spec when it has its own
(`ModelSpec.preprocessing`: a timm model's pretrained config, e.g. bicubic, crop 0.9, mean and
std 0.5 for a ViT), else torchvision's ImageNet convention (bilinear, resize to size * 256 / 224,
ImageNet's mean and std).

The evaluation transform is timm's `transforms_imagenet_eval` and torchvision's reference
`ClassificationPresetEval`: the shorter side resized to `resize` (crop "center"; both sides for
"squash"), the centre `size` x `size` crop, scaled to [0, 1], normalised. Its fields in an
exported file rebuild it exactly (docs/vision.md).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, replace

import torch

from ..config_keys import ConfigError, optional_import

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
TORCHVISION_SIZE = 224  # torchvision's classifiers' input size (image_size=0)
TORCHVISION_CROP = 224 / 256  # evaluation resizes to size * 256 / 224, then crops the centre
INTERPOLATIONS = ("nearest", "bilinear", "bicubic")
CROPS = ("center", "squash")


@dataclass(frozen=True)
class Preprocessing:
    """size: the side of the square the model sees. resize: evaluation resizes to this (the
    shorter side for crop "center", both sides for "squash") before the centre crop."""

    size: int
    resize: int
    crop: str
    interpolation: str
    mean: tuple[float, float, float]
    std: tuple[float, float, float]

    def record(self) -> dict:
        """As the dataset's info records it (JSON)."""
        return asdict(self) | {"mean": list(self.mean), "std": list(self.std)}


def resize_for(size: int, crop_fraction: float, rounding=math.floor) -> int:
    """The evaluation resize of a centre crop that keeps `crop_fraction` of the side: timm's
    floor(size / crop_pct); torchvision's reference rounds (round(size * 256 / 224))."""
    return int(rounding(size / crop_fraction))


def resolve(cfg, spec) -> Preprocessing:
    """The run's preprocessing: `image_size`, `interpolation` and `eval_crop_fraction` where
    set, else the model's own (spec.preprocessing) where it has them, else torchvision's
    convention."""
    model_own = getattr(spec, "preprocessing", None)  # None: no spec, or a stand-in's
    own = model_own(cfg) if model_own else None
    if own is None:
        size = cfg.image_size or TORCHVISION_SIZE
        pre = Preprocessing(
            size, resize_for(size, TORCHVISION_CROP, round), "center", "bilinear",
            IMAGENET_MEAN, IMAGENET_STD,
        )  # fmt: skip
        return chosen(pre, cfg)
    size = cfg.image_size or int(own["size"])
    crop = own.get("crop", "center")
    if crop not in CROPS:  # timm's "border" (6 of its ~1800 pretrained configs): a centre crop
        crop = "center"
    interpolation = own.get("interpolation", "bilinear")
    if interpolation not in INTERPOLATIONS:
        raise ConfigError(f"model={cfg.model}: unknown interpolation {interpolation!r}")
    pre = Preprocessing(
        size, resize_for(size, float(own["crop_fraction"])), crop, interpolation,
        tuple(own["mean"]), tuple(own["std"]),
    )  # fmt: skip
    return chosen(pre, cfg)


def chosen(pre: Preprocessing, cfg) -> Preprocessing:
    """`pre` with the interpolation and evaluation crop the config sets (data/augmentation.py's
    keys; "auto" and 0 keep the model's)."""
    if cfg.interpolation != "auto":
        pre = replace(pre, interpolation=cfg.interpolation)
    if cfg.eval_crop_fraction:
        pre = replace(pre, resize=resize_for(pre.size, cfg.eval_crop_fraction))
    return pre


def recorded(details: dict) -> Preprocessing:
    """The preprocessing a dataset's info records (DataInfo.details["preprocessing"])."""
    values = details["preprocessing"]
    return Preprocessing(**values | {"mean": tuple(values["mean"]), "std": tuple(values["std"])})


def transforms_v2():
    optional_import("torchvision", "vision", "images datasets")
    from torchvision.transforms import v2

    return v2


def eval_transform(pre: Preprocessing):
    """PIL image -> normalised float32 tensor: resized, then the centre crop."""
    v2 = transforms_v2()
    return v2.Compose([*resized_centre(v2, pre), *to_normalised_tensor(v2, pre)])


def resized_centre(v2, pre: Preprocessing) -> list:
    """Evaluation's resize (the shorter side, or both for "squash") and centre crop; also
    training's with train_crop=center."""
    resize = pre.resize if pre.crop == "center" else (pre.resize, pre.resize)
    mode = v2.InterpolationMode(pre.interpolation)
    return [v2.Resize(resize, interpolation=mode, antialias=True), v2.CenterCrop(pre.size)]


def to_normalised_tensor(v2, pre: Preprocessing) -> list:
    return [
        v2.PILToTensor(),
        v2.ToDtype(torch.float32, scale=True),
        v2.Normalize(list(pre.mean), list(pre.std)),
    ]


def export_fields(details: dict) -> dict[str, str]:
    """The evaluation transform as an exported file's metadata strings: image_size, resize_size,
    crop, interpolation, mean and std (JSON lists); none for data without it."""
    if not isinstance(details.get("preprocessing"), dict):
        return {}
    pre = recorded(details)
    return {
        "image_size": str(pre.size),
        "resize_size": str(pre.resize),
        "crop": pre.crop,
        "interpolation": pre.interpolation,
        "mean": json.dumps(list(pre.mean)),
        "std": json.dumps(list(pre.std)),
    }
