"""`model=vision`: a torchvision classifier by name (tiny ResNet-18s on 16-pixel images, on CPU):
built and checked by name, its repeated blocks as FSDP's units, started from a torchvision
weights file made for other classes, exported with its name and classes. Its training run on a
packed images dataset (checkpoints, images/s) is test_image_formats.py's 16-bit run.

The images come from the `images` fixture: a stand-in dataset kind of random images whose
class sets their mean (learnable), registered as the images kind; the 2-rank DDP/FSDP and
kill -9 resume runs on real image shards are in the end-to-end tests."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import REPO, checkpoint_steps, load_checkpoint, one_line
from torch.utils.data import Dataset

from {{ cookiecutter.package_name }} import parallel
from {{ cookiecutter.package_name }}.checkpoint import export_model
from {{ cookiecutter.package_name }}.cli import main
from {{ cookiecutter.package_name }}.config.settings import load_config
from {{ cookiecutter.package_name }}.data import info as info_module
from {{ cookiecutter.package_name }}.data import kinds
from {{ cookiecutter.package_name }}.models import vision

torchvision = pytest.importorskip("torchvision")

SIZE, CLASSES = 16, 3
CLASS_NAMES = ("cat", "dog", "eel")
SEED = 7
TINY_VISION = [
    "device=cpu",
    "model=vision",
    "vision_model=resnet18",
    "dataset=synthetic",
    f"seed={SEED}",
    "batch_size=8",
    "lr=0.01",
    "warmup_steps=0",
    "max_steps=4",
    "log_every=1",
    "eval_every=4",
    "eval_batches=1",
    "checkpoint_every=4",
    "num_workers=0",
    "cpu_threads=1",
]
UNCHANGED = ["lr=1e-12", "min_lr=1e-12", "weight_decay=0", "max_steps=1", "eval_every=0"]


class RandomImages(Dataset):
    """(3, SIZE, SIZE) images whose mean depends on the label, and the labels."""

    def __init__(self, count: int, seed: int):
        generator = torch.Generator().manual_seed(seed)
        self.labels = torch.randint(0, CLASSES, (count,), generator=generator)
        noise = torch.randn(count, 3, SIZE, SIZE, generator=generator)
        self.images = noise + self.labels[:, None, None, None].float() - 1

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int):
        return self.images[index], self.labels[index]


def stand_in_splits(cfg, spec):
    info = info_module.DataInfo(
        kind="images",
        fingerprint="stand-in",
        num_classes=CLASSES,
        class_names=CLASS_NAMES,
        details={"image_size": SIZE},
    )
    return info_module.Splits(train=RandomImages(64, 0), val=RandomImages(2, 1), info=info)


@pytest.fixture
def images(monkeypatch, single_process):
    """dataset=synthetic of the images kind (here a stand-in registered under its name)."""
    kind = info_module.DatasetKind(
        name="images", format="images/1", open=None, synthetic=stand_in_splits
    )
    monkeypatch.setitem(kinds.KINDS, "images", kind)


def settings(name: str = "resnet18"):
    return load_config(None, ["device=cpu", "model=vision", f"vision_model={name}"]).config


def data_info(classes: int = CLASSES):
    return info_module.DataInfo(kind="images", fingerprint="x", num_classes=classes)


def test_a_torchvision_model_is_built_by_name_for_the_datasets_classes():
    model = vision.build(settings(), data_info())
    assert isinstance(model, torchvision.models.ResNet)
    assert model(torch.randn(2, 3, SIZE, SIZE)).shape == (2, CLASSES)
    assert vision.SPEC.label(settings()) == "vision:resnet18"
    assert vision.head(settings(), data_info()) == {"fc.weight", "fc.bias"}


def test_a_misspelt_model_name_is_one_line_with_the_close_ones(single_process, capsys):
    assert main(["train", "device=cpu", "model=vision", "vision_model=resnet5"]) != 0
    line = one_line(capsys)
    assert "vision_model" in line and "'resnet5'" in line and "resnet50" in line, line


@pytest.mark.parametrize(
    "name, kind, count",
    [
        ("resnet18", "BasicBlock", 8),
        ("resnet50", "Bottleneck", 16),
        ("vit_b_16", "EncoderBlock", 12),
    ],
)
def test_the_repeated_blocks_are_the_models_own(name, kind, count):
    with parallel.parameters_on_meta():  # shapes only: no forward
        model = vision.build(settings(name), data_info())
    blocks = vision.blocks(model)
    assert [type(b).__name__ for b in blocks] == [kind] * count
    own = {id(m) for m in model.modules()}
    assert all(id(block) in own for block in blocks)


def test_a_vit_is_built_for_the_datasets_image_size():
    info = info_module.DataInfo(
        kind="images", fingerprint="x", num_classes=CLASSES, details={"image_size": 32}
    )
    with parallel.parameters_on_meta():
        model = vision.build(settings("vit_b_16"), info)
    assert model.image_size == 32 and model.encoder.pos_embedding.shape[1] == 1 + (32 // 16) ** 2


def test_the_example_experiment_trains_a_resnet50():
    cfg = load_config(REPO / "configs" / "experiments" / "resnet50-images.toml").config
    assert (cfg.model, cfg.vision.vision_model) == ("vision", "resnet50")


def test_a_model_without_repeated_units_is_one_unit():
    with parallel.parameters_on_meta():
        model = vision.build(settings("alexnet"), data_info())
    assert vision.blocks(model) is None


@pytest.mark.parametrize("mesh_shape", [None, (1, 1)], ids=["fsdp", "hsdp"])
def test_fsdp_shards_each_block_as_a_unit(tmp_path, mesh_shape):
    import torch.distributed as dist
    from torch.distributed.fsdp import FSDPModule

    model = vision.build(settings(), data_info())
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        parallel.apply_fsdp(vision.SPEC, model, torch.device("cpu"), False, False, mesh_shape)
        blocks = vision.blocks(model)
        assert len(blocks) == 8 and all(isinstance(b, FSDPModule) for b in blocks)
        assert isinstance(model, FSDPModule) and not isinstance(model.fc, FSDPModule)
    finally:
        dist.destroy_process_group()


def test_a_resnet_trains_and_reports_images_per_second(tmp_path, images, capfd):
    run_dir = tmp_path / "run"
    assert main(["train", *TINY_VISION, f"run_dir={run_dir}"]) == 0
    # the 2 held-out images scored (not the 8 slots of an evaluation batch), 4 steps of 8 read
    assert "over 2 held-out images; 32 images trained on" in capfd.readouterr().err
    assert checkpoint_steps(run_dir) == [4]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["kind"] == "train"]
    (evaluation,) = [r for r in records if r["kind"] == "eval"]
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in train)
    assert "images_per_s" in train[-1] and 0 <= evaluation["eval_acc"] <= 1


def torchvision_file(tmp_path, name: str = "resnet18", classes: int = 10):
    """Weights as torchvision's files hold them: a state dict saved by torch.save."""
    path = tmp_path / f"{name}.pth"
    torch.save(torchvision.models.get_model(name, num_classes=classes).state_dict(), path)
    return path


def test_init_from_a_torchvision_file_of_other_classes_replaces_the_head(tmp_path, images, capsys):
    source = torchvision_file(tmp_path)
    run_dir = tmp_path / "run"
    argv = ["train", *TINY_VISION, *UNCHANGED, f"run_dir={run_dir}", f"init_from={source}"]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "head is for 10 classes, the dataset has 3: fc.bias, fc.weight left as built" in err
    state = load_checkpoint(run_dir, 1)["model"]["model"]
    stored = torch.load(source, weights_only=True)
    torch.manual_seed(SEED)  # the head as a run without init_from builds it
    built = torchvision.models.get_model("resnet18", num_classes=CLASSES).state_dict()
    model = torchvision.models.get_model("resnet18", num_classes=CLASSES)
    for name, _ in model.named_parameters():
        expected = built[name] if name.startswith("fc.") else stored[name]
        torch.testing.assert_close(state[name], expected, rtol=0, atol=1e-9, msg=name)


def test_a_file_that_is_not_a_state_dict_is_one_line(tmp_path, images, capsys):
    source, run_dir = tmp_path / "checkpoint.pt", tmp_path / "run"
    torch.save({"model": {"fc.weight": torch.zeros(1)}, "step": 3}, source)
    assert main(["train", *TINY_VISION, f"run_dir={run_dir}", f"init_from={source}"]) != 0
    line = one_line(capsys)
    assert f"init_from={source}: a file, but its entry 'model' is a dict, not a tensor" in line
    assert not run_dir.exists()  # refused before the run directory is made


def test_init_from_another_architecture_is_one_line(tmp_path, images, capsys):
    source = torchvision_file(tmp_path, "resnet34", CLASSES)
    run_dir = tmp_path / "run"
    argv = ["train", *TINY_VISION, *UNCHANGED, f"run_dir={run_dir}", f"init_from={source}"]
    assert main(argv) != 0
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"init_from={source}: tensor layer1.2.bn1.bias is not in the model" in line, line
    assert not checkpoint_steps(run_dir)


def test_an_export_records_the_model_name_and_the_classes(tmp_path, images):
    st = pytest.importorskip("safetensors.torch")
    run_dir, out = tmp_path / "run", tmp_path / "model.safetensors"
    assert main(["train", *TINY_VISION, f"run_dir={run_dir}", "eval_every=0"]) == 0
    export_model(run_dir, out)
    with st.safe_open(out, "pt") as f:
        meta = f.metadata()
    assert meta["vision_model"] == "resnet18" and meta["model"] == "vision"
    assert json.loads(meta["class_names"]) == list(CLASS_NAMES)
    model = torchvision.models.get_model(meta["vision_model"], num_classes=int(meta["num_classes"]))
    model.load_state_dict(st.load_file(out))  # torchvision reloads it as it is


@pytest.mark.parametrize(
    ("name", "size", "why"),
    [("vit_b_16", 40, "indivisible by patch size"), ("inception_v3", 32, "Kernel size")],
)
def test_an_image_size_the_model_cannot_take_is_one_line(name, size, why, single_process, capsys):
    argv = ["train", *TINY_VISION, f"vision_model={name}", f"image_size={size}", "run_dir=r"]
    assert main(argv) == 2
    line = one_line(capsys)
    assert f"vision_model={name} cannot take {size}-pixel images" in line and why in line
