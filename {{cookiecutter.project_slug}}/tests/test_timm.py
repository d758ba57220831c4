"""`model=timm`: a timm classifier by name, built offline (`pretrained=False`, nothing
downloaded): its blocks (timm's `blocks` containers, else the repeated units), its head, its
preprocessing from the pretrained config, started from a hub-style `model.safetensors` made for
other classes, exported with its name and evaluation transform. On 2 CPU ranks, killed and
resumed, with DDP and FSDP2: tests/test_vision_resume.py.

The single-process runs use test_vision.py's stand-in images (16 pixels, 3 classes)."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import load_checkpoint, one_line

timm = pytest.importorskip("timm", reason="needs the [timm] extra: pip install -e '.[timm]'")
from test_vision import (  # noqa: E402
    CLASSES,
    SEED,
    SIZE,
    TINY_VISION,
    UNCHANGED,
    images,  # noqa: F401  (the stand-in images, a fixture)
)

from {{ cookiecutter.package_name }} import parallel  # noqa: E402
from {{ cookiecutter.package_name }}.checkpoint import export_model  # noqa: E402
from {{ cookiecutter.package_name }}.cli import main  # noqa: E402
from {{ cookiecutter.package_name }}.config.settings import load_config  # noqa: E402
from {{ cookiecutter.package_name }}.data import preprocessing  # noqa: E402
from {{ cookiecutter.package_name }}.data.info import DataInfo  # noqa: E402
from {{ cookiecutter.package_name }}.models import spec_of  # noqa: E402
from {{ cookiecutter.package_name }}.models import timm as timm_adapter  # noqa: E402

TINY = [a for a in TINY_VISION if not a.startswith(("model=", "vision_model="))] + ["model=timm"]
TINY_TIMM = [*TINY, "timm_model=resnet10t", f"image_size={SIZE}"]


def settings(name: str, *extra: str):
    return load_config(None, ["device=cpu", "model=timm", f"timm_model={name}", *extra]).config


def data_info(size: int = 32) -> DataInfo:
    return DataInfo("images", "x", num_classes=CLASSES, details={"image_size": size})


@pytest.mark.parametrize(
    "name, kind, count, head",
    [
        ("resnet10t", "BasicBlock", 4, {"fc.weight", "fc.bias"}),  # the repeated units
        ("convnext_atto", "ConvNeXtBlock", 12, {"head.fc.weight", "head.fc.bias"}),
        ("vit_tiny_patch16_224", "Block", 12, {"head.weight", "head.bias"}),
        ("efficientnet_b0", "InvertedResidual", 15, {"classifier.weight", "classifier.bias"}),
    ],
)
def test_the_blocks_are_timms_own_and_the_head_follows_the_classes(name, kind, count, head):
    cfg = settings(name)
    with parallel.parameters_on_meta():  # shapes only
        model = timm_adapter.build(cfg, data_info())
    blocks = timm_adapter.blocks(model)
    assert sum(type(b).__name__ == kind for b in blocks) == count, blocks
    own = {id(m) for m in model.modules()}
    inner = {id(m) for b in blocks for m in b.modules() if m is not b}
    assert all(id(b) in own and id(b) not in inner for b in blocks)
    assert timm_adapter.head(cfg, data_info()) == head
    assert spec_of(cfg).label(cfg) == f"timm:{name}"


@pytest.mark.parametrize(
    "name, expected",
    [("resnet5", "timm has no model 'resnet5'; did you mean resnet50"),
     ("resnet50.nope", "timm has no pretrained tag 'nope' for resnet50; its tags: a1_in1k")],
)  # fmt: skip
def test_a_misspelt_name_or_tag_is_one_line(name, expected, single_process, capsys):
    assert main(["train", "device=cpu", "model=timm", f"timm_model={name}"]) == 2
    assert expected in one_line(capsys)


def test_the_preprocessing_is_the_pretrained_configs_unless_the_size_is_set():
    vit = settings("vit_tiny_patch16_224")
    found = preprocessing.resolve(vit, spec_of(vit))
    assert found == preprocessing.Preprocessing(
        224, 248, "center", "bicubic", (0.5, 0.5, 0.5), (0.5, 0.5, 0.5)
    )  # crop_pct 0.9: floor(224 / 0.9)
    resnet = settings("resnet10t")  # pretrained at 176 pixels, crop_pct 0.875
    assert preprocessing.resolve(resnet, spec_of(resnet)).size == 176
    smaller = settings("resnet10t", "image_size=64")
    assert preprocessing.resolve(smaller, spec_of(smaller)).resize == 73  # floor(64 / 0.875)
    tagged = settings("resnet50.tv_in1k")  # the tag's own: bilinear, where resnet50's is bicubic
    assert preprocessing.resolve(tagged, spec_of(tagged)).interpolation == "bilinear"


def test_the_evaluation_transform_is_timms_own():
    from PIL import Image
    from timm.data import create_transform, resolve_model_data_config

    picture = Image.fromarray(torch.randint(0, 256, (90, 130, 3), dtype=torch.uint8).numpy())
    for name in ("vit_tiny_patch16_224", "resnet50.tv_in1k"):
        cfg = settings(name)
        ours = preprocessing.eval_transform(preprocessing.resolve(cfg, spec_of(cfg)))
        with torch.device("meta"):
            model = timm.create_model(name)
        theirs = create_transform(**resolve_model_data_config(model))
        # the same resize and crop; scaling to [0, 1] rounds alike but for the last bit
        torch.testing.assert_close(ours(picture), theirs(picture), rtol=0, atol=1e-6)


def hub_file(tmp_path, name: str = "resnet10t", classes: int = 1000):
    """Weights as a timm repository on the Hugging Face hub holds them: model.safetensors."""
    from safetensors.torch import save_file

    path = tmp_path / "model.safetensors"
    save_file(timm.create_model(name, num_classes=classes).state_dict(), path)
    return path


@pytest.mark.usefixtures("images")
def test_init_from_a_hub_file_of_other_classes_replaces_the_head(tmp_path, capsys):
    source, run_dir = hub_file(tmp_path), tmp_path / "run"
    argv = ["train", *TINY_TIMM, *UNCHANGED, f"run_dir={run_dir}", f"init_from={source}"]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "head is for 1000 classes, the dataset has 3: fc.bias, fc.weight left as built" in err
    state = load_checkpoint(run_dir, 1)["model"]["model"]
    from safetensors.torch import load_file

    stored = load_file(source)
    torch.manual_seed(SEED)  # the head as a run without init_from builds it
    built = timm.create_model("resnet10t", num_classes=CLASSES).state_dict()
    for name, _ in timm.create_model("resnet10t", num_classes=CLASSES).named_parameters():
        expected = built[name] if name.startswith("fc.") else stored[name]
        torch.testing.assert_close(state[name], expected, rtol=0, atol=1e-9, msg=name)


def test_an_export_reloads_into_timm_with_its_evaluation_transform(tmp_path, single_process):
    """On the images kind's own synthetic images (their transforms record the preprocessing)."""
    st = pytest.importorskip("safetensors.torch")
    run_dir, out = tmp_path / "run", tmp_path / "model.safetensors"
    argv = [*TINY_TIMM, "num_classes=3", "eval_samples=8", f"run_dir={run_dir}", "eval_every=0"]
    assert main(["train", *argv]) == 0
    export_model(run_dir, out)
    with st.safe_open(out, "pt") as f:
        meta = f.metadata()
    assert (meta["model"], meta["timm_model"]) == ("timm", "resnet10t")
    assert json.loads(meta["class_names"]) == ["class0", "class1", "class2"]
    assert (meta["image_size"], meta["resize_size"], meta["crop"]) == (str(SIZE), "18", "center")
    assert (meta["interpolation"], json.loads(meta["mean"])) == ("bicubic", [0.485, 0.456, 0.406])
    model = timm.create_model(meta["timm_model"], num_classes=int(meta["num_classes"]))
    model.load_state_dict(st.load_file(out))  # timm reloads it as it is
    # a .pt export: the same fields in the state dict's _metadata, which load_state_dict ignores
    pt = export_model(run_dir, tmp_path / "model.pt")
    state = torch.load(pt, weights_only=True)
    fields = {k: v for k, v in meta.items() if k not in ("format", "config")}
    assert state._metadata["export"] == fields
    model.load_state_dict(state)
