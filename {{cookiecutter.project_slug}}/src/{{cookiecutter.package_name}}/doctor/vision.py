"""The doctor's torchvision check (model=vision): as torch, torchvision must come from the image
or uenv, which build it against their own torch. One from PyPI in the venv is built for another
torch: its compiled ops (nms, the image decoders) fail to load, or its import fails outright.
`check_torchvision` is a plain function of what `torchvision_found` reads in this process;
`torchvision_here` is the doctor's check of this process."""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import sys
import warnings
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from .checks import FAIL, OK, Result, venv_has_system_site_packages


@dataclass(frozen=True)
class Torchvision:
    """What this process finds of torchvision."""

    version: str
    file: str  # its __init__.py, where Python found it
    torch_pin: str | None  # the torch version its distribution requires (torch==X), if any
    ops_load: bool  # its compiled ops (torchvision.extension._has_ops())
    error: str = ""  # why `import torchvision` failed, if it did


def release(version: str) -> str:
    """A version without its local part: 2.13.0+cu128 -> 2.13.0."""
    return version.split("+", 1)[0]


def check_torchvision(
    found: Torchvision | None, torch_version: str, prefix: str, base_prefix: str, system_site: bool
) -> Result:
    """Present, built for this torch, from the environment (not the venv), importable."""
    if found is None:
        return Result(
            OK,
            "torchvision",
            "not installed: only model=vision and model=timm need it (docs/vision.md)",
        )
    where = os.path.dirname(os.path.abspath(found.file))
    in_venv = os.path.abspath(prefix) != os.path.abspath(base_prefix)
    if in_venv and system_site and Path(where).is_relative_to(os.path.abspath(prefix)):
        return Result(
            FAIL,
            "torchvision",
            f"venv shadows the image's torchvision ({where}): pip uninstall torchvision in the "
            "venv, so that --system-site-packages provides the build made for its torch",
        )
    if found.torch_pin and release(found.torch_pin) != release(torch_version):
        return Result(
            FAIL,
            "torchvision",
            f"torchvision {found.version} is built for torch {found.torch_pin}, this torch is "
            f"{torch_version}: use the image's/uenv's torchvision (scripts/setup_venv.sh pins it)",
        )
    if found.error:
        return Result(
            FAIL, "torchvision", f"torchvision {found.version} does not import: {found.error}"
        )
    if not found.ops_load:  # the package needs its models and transforms only, pure Python
        return Result(
            OK,
            "torchvision",
            f"torchvision {found.version} ({where}); its compiled ops do not load (built for "
            "another torch?): model=vision trains, your own nms or torchvision.io would not",
        )
    return Result(OK, "torchvision", f"torchvision {found.version} from {where}")


def torchvision_found() -> Torchvision | None:
    """torchvision as this process sees it, or None where it is not installed."""
    spec = importlib.util.find_spec("torchvision")
    if spec is None or spec.origin is None:
        return None
    try:
        version = metadata.version("torchvision")
        requires = metadata.requires("torchvision") or []
    except metadata.PackageNotFoundError:  # no metadata (a source build): no pin to compare
        version, requires = "(no metadata)", []
    pins = (re.match(r"torch\s*==\s*([^\s;,]+)", r) for r in requires)
    torch_pin = next((pin.group(1) for pin in pins if pin), None)
    try:
        with warnings.catch_warnings():  # its own warning about the ops: reported below
            warnings.simplefilter("ignore")
            torchvision = importlib.import_module("torchvision")
        ops_load, error = bool(torchvision.extension._has_ops()), ""
    except Exception as err:  # a build for another torch may fail in any way at import
        text = str(err).strip()
        ops_load, error = False, text.splitlines()[0] if text else type(err).__name__
    return Torchvision(version, spec.origin, torch_pin, ops_load, error)


def torchvision_here() -> Result:
    """The check on this process's torchvision, torch and venv."""
    import torch

    return check_torchvision(
        torchvision_found(),
        torch.__version__,
        sys.prefix,
        sys.base_prefix,
        venv_has_system_site_packages(sys.prefix),
    )
