"""How a training image is augmented: by the keys below, whose defaults are torchvision's classic
ImageNet recipe (a random resized crop keeping 8 to 100 % of the area, a horizontal flip), or by
a transform of your own: `own_train_transform`, the first function here. docs/vision.md says
which keys suit photos, digits and text, and medical or satellite images.

Per sample, in the loader processes (torchvision's reference train.py, ClassificationPresetTrain):
the crop, the flips, one of torchvision's policies (`auto_augment`), the conversion to a tensor
and the normalisation (preprocessing.py), random erasing. Per batch: mixup or cutmix (one of the
two at random when both are on, as the reference does), then label smoothing; these turn the
batch's labels into (batch, classes) probabilities, which the loss reads as they are. Evaluation
reads plain labels and scores the plain cross entropy, whatever the training recipe.

Every random choice comes from torch's global generator, which batches.py seeds from (seed,
epoch, index) for a sample and from (seed, step, micro-step, rank) for a batch's mixing: a
resumed run augments exactly as the uninterrupted run did, with any number of loader processes.
"""

from __future__ import annotations

import os
import pickle
import traceback
from dataclasses import dataclass
from functools import partial

import torch

from ..config_keys import ConfigError, first_line, key
from .directory import DatasetError
from .preprocessing import (
    INTERPOLATIONS,
    Preprocessing,
    resized_centre,
    to_normalised_tensor,
    transforms_v2,
)


def own_train_transform(pre: Preprocessing):
    """Your own training transform, or None: the keys below decide. It takes an upright RGB PIL
    image (or, for images of more than 8 bits, a (3, H, W) float32 tensor in [0, 1]) and
    returns a normalised float32 tensor (3, pre.size, pre.size); draw any randomness from
    torch's generator (torch.rand, or a torchvision transform's own), so it stays a function
    of (seed, epoch, index). `to_normalised_tensor(v2, pre)` gives the last steps.
    docs/vision.md, "Your own transform", has an example. Mixup, cutmix and label smoothing
    still apply: they act on whole batches."""
    return None


POLICIES = ("none", "trivialaugment", "randaugment", "autoaugment")
# the keys your own transform replaces (mixup, cutmix and label smoothing act on its batches)
PER_SAMPLE = ("train_crop", "crop_scale", "hflip", "vflip", "auto_augment", "random_erase")
CROPS = ("random", "center", "none")


def _crop_fraction(value: float) -> None:
    """0 (the model's) or a crop that keeps at least a quarter of the side."""
    if 0 < value < 0.25:
        message = "must be 0 (the model's) or 0.25 to 1"
        raise ConfigError(f"config key 'eval_crop_fraction' {message}: {value}")


MIN_ALPHA = 0.01


def _alpha(name: str, value: float) -> None:
    """0 (off) or an alpha torch samples from: below about 0.005 its Beta sampler gives a share
    near 1/2 (every batch mixed half and half) where one near 0 or 1 is due (nearly none)."""
    if 0 < value < MIN_ALPHA:
        raise ConfigError(
            f"config key {name!r} must be 0 (off) or at least {MIN_ALPHA:g}: {value:g} (torch's "
            "Beta sampler mixes every batch about half and half below that)"
        )


# fmt: off
@dataclass
class AugmentationKeys:
    """The images kind's augmentation keys (part of its `keys`)."""

    train_crop: str = key("random", 'training crop: "random" (random resized, keeping crop_scale '
                          'to 1 of the area), "center" (as evaluation: resize, centre crop), '
                          '"none" (the whole image resized to the square)', choices=CROPS,
                          resume=True)
    crop_scale: float = key(0.08, "train_crop=random: the smallest share of the image's area a "
                            "crop keeps", bounds=(0, 1), closed="(]", resume=True)
    hflip: float = key(0.5, "probability of a horizontal flip (0 for digits and text)",
                       bounds=(0, 1), resume=True)
    vflip: float = key(0.0, "probability of a vertical flip (satellite and microscope images)",
                       bounds=(0, 1), resume=True)
    auto_augment: str = key("none", "a torchvision policy: trivialaugment (TrivialAugmentWide), "
                            "randaugment, autoaugment (its ImageNet policy)", choices=POLICIES,
                            resume=True)
    random_erase: float = key(0.0, "probability of erasing a random rectangle (torchvision's "
                              "recipes: 0.1)", bounds=(0, 1), resume=True)
    label_smoothing: float = key(0.0, "share of each label spread over all classes (recipes: "
                                 "0.1)", bounds=(0, 1), closed="[)", resume=True)
    mixup: float = key(0.0, "mixup's alpha, 0: off, else at least 0.01 (recipes: 0.2)",
                       bounds=(0, 100), resume=True, check=partial(_alpha, "mixup"))
    cutmix: float = key(0.0, "cutmix's alpha, 0: off, else at least 0.01 (recipes: 1.0)",
                        bounds=(0, 100), resume=True, check=partial(_alpha, "cutmix"))
    interpolation: str = key("auto", "resize interpolation (auto: the model's; bilinear for "
                             "torchvision's)", choices=("auto", *INTERPOLATIONS), resume=True)
    eval_crop_fraction: float = key(0.0, "evaluation: the centre crop's share of the resized "
                                    "side (0: the model's; 224/256 for torchvision's)",
                                    bounds=(0, 1), check=_crop_fraction)
# fmt: on


def train_transform(pre: Preprocessing, cfg):
    """One training sample's transform: your own (its output checked), or the keys' (see the
    module's docstring)."""
    own = users_transform(pre)
    if own is not None:
        return OwnTransform(own, pre.size)
    v2 = transforms_v2()
    mode = v2.InterpolationMode(pre.interpolation)
    steps = [crop(v2, pre, cfg.train_crop, cfg.crop_scale, mode)]
    if cfg.hflip:
        steps.append(v2.RandomHorizontalFlip(cfg.hflip))
    if cfg.vflip:
        steps.append(v2.RandomVerticalFlip(cfg.vflip))
    if cfg.auto_augment != "none":
        steps.append(policy(v2, cfg.auto_augment, mode))
    steps += to_normalised_tensor(v2, pre)
    if cfg.random_erase:
        steps.append(v2.RandomErasing(cfg.random_erase, value=0))  # 0: the mean, once normalised
    return v2.Compose(steps)


def users_transform(pre: Preprocessing):
    """own_train_transform(pre); an error of it is one line naming it and where it was raised
    (a refusal: the run directory it would have started is not left behind)."""
    try:
        return own_train_transform(pre)
    except Exception as err:
        raise ConfigError(f"data/augmentation.py: own_train_transform(pre) {raised(err)}") from None


def raised(err: Exception) -> str:
    """'raised ValueError at augmentation.py:57: <its first line>'."""
    frame = traceback.extract_tb(err.__traceback__)[-1]
    where = f"{os.path.basename(frame.filename)}:{frame.lineno}"
    return f"raised {type(err).__name__} at {where}: {first_line(err)}"


class OwnTransform:
    """Your transform, and what it returns checked: a float32 tensor (3, size, size), or one
    line naming own_train_transform (not a shape error deep in the model, nor a model trained
    on crops of another size). It must pickle: loader processes started by spawn or forkserver
    (macOS; Linux from Python 3.14) receive it so."""

    def __init__(self, transform, size: int):
        try:
            pickle.dumps(transform)
        except (pickle.PicklingError, AttributeError, TypeError) as err:
            raise ConfigError(
                f"data/augmentation.py: own_train_transform's transform cannot be pickled "
                f"({first_line(err)}): return torchvision transforms, a v2.Compose of them or an "
                "instance of a class of yours (a torch.nn.Module), not a lambda or a function "
                "defined inside it"
            ) from None
        self.transform, self.size = transform, size

    def __call__(self, image):
        try:
            out = self.transform(image)
        except Exception as err:  # in a loader process too: one line, the run ends
            message = f"data/augmentation.py: own_train_transform's transform {raised(err)}"
            raise DatasetError(message) from None
        if not isinstance(out, torch.Tensor):
            raise DatasetError(self.wrong(f"a {type(out).__name__}"))
        if out.dtype != torch.float32 or tuple(out.shape) != (3, self.size, self.size):
            raise DatasetError(self.wrong(f"a {out.dtype} tensor {tuple(out.shape)}"))
        return out

    def wrong(self, what: str) -> str:
        return (
            f"data/augmentation.py: own_train_transform gave {what}, not a float32 tensor "
            f"(3, {self.size}, {self.size}) (image_size): crop to pre.size and end with "
            "to_normalised_tensor(v2, pre)"
        )


def crop(v2, pre: Preprocessing, kind: str, scale: float, mode):
    if kind == "random":
        area = (scale, 1.0)
        return v2.RandomResizedCrop(pre.size, scale=area, interpolation=mode, antialias=True)
    if kind == "center":
        return v2.Compose(resized_centre(v2, pre))
    return v2.Resize((pre.size, pre.size), interpolation=mode, antialias=True)


def policy(v2, name: str, mode):
    """torchvision's policies as its reference train.py builds them (`--auto-augment ta_wide`,
    `ra`, `imagenet`). They were made for 8-bit photos: on images of more than 8 bits, posterize
    and equalize work at 8 bits."""
    if name == "trivialaugment":
        return v2.TrivialAugmentWide(interpolation=mode)
    if name == "randaugment":
        return v2.RandAugment(interpolation=mode)
    return v2.AutoAugment(v2.AutoAugmentPolicy.IMAGENET, interpolation=mode)


class BatchMix:
    """A collated (images, labels) batch -> (images, (batch, classes) probabilities): mixup or
    cutmix (torchvision's: a batch mixed with itself rolled by one), then label smoothing. A
    class, not a closure: loader processes may be started by pickling."""

    def __init__(self, cfg, num_classes: int):
        v2 = transforms_v2()
        mixes = [v2.MixUp(alpha=cfg.mixup, num_classes=num_classes)] if cfg.mixup else []
        if cfg.cutmix:
            mixes.append(v2.CutMix(alpha=cfg.cutmix, num_classes=num_classes))
        self.mix = v2.RandomChoice(mixes) if len(mixes) > 1 else (mixes or [None])[0]
        self.smoothing, self.num_classes = cfg.label_smoothing, num_classes

    def __call__(self, batch):
        images, labels = batch
        if self.mix is not None:
            images, targets = self.mix(images, labels)
        else:
            targets = torch.nn.functional.one_hot(labels, self.num_classes).float()
        if self.smoothing:  # as F.cross_entropy(label_smoothing=...) does
            targets = targets * (1 - self.smoothing) + self.smoothing / self.num_classes
        return images, targets


def batch_mix(cfg, num_classes: int) -> BatchMix | None:
    """The run's per-batch mixing, or None (mixup, cutmix and label smoothing all off)."""
    if not (cfg.mixup or cfg.cutmix or cfg.label_smoothing):
        return None
    return BatchMix(cfg, num_classes)


def described(pre: Preprocessing, cfg) -> str:
    """The training augmentation in words, for the run's start (with your own transform: the
    per-sample keys set that it does not read)."""
    if users_transform(pre) is not None:
        defaults = AugmentationKeys()
        unread = [name for name in PER_SAMPLE if getattr(cfg, name) != getattr(defaults, name)]
        note = f"; {', '.join(unread)} not read" if unread else ""
        words = [f"your own transform (data/augmentation.py{note})"]
    else:
        words = [
            {
                "random": f"random resized crop (keeps {cfg.crop_scale:g} to 1 of the area)",
                "center": "resize and centre crop",
                "none": "the whole image resized",
            }[cfg.train_crop]
        ]
        if cfg.train_crop != "random" and cfg.crop_scale != AugmentationKeys.crop_scale:
            words[0] += " (crop_scale not read)"
        flips = {"horizontal flip": cfg.hflip, "vertical flip": cfg.vflip}
        words += [f"{name} {share:g}" for name, share in flips.items() if share]
        words += [cfg.auto_augment] if cfg.auto_augment != "none" else []
        words += [f"random erasing {cfg.random_erase:g}"] if cfg.random_erase else []
    mixes = {"mixup alpha": cfg.mixup, "cutmix alpha": cfg.cutmix}
    mixes["label smoothing"] = cfg.label_smoothing
    words += [f"{name} {value:g}" for name, value in mixes.items() if value]
    return "training augmentation: " + ", ".join(words)
