"""Images datasets: make-dataset --images packs an ImageFolder into shards (its checks, one line
each), and the images kind reads them back (pread, PIL, torchvision transforms, seeded per
sample). The images are drawn here with numpy and PIL: 16 to 32 pixels."""

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

pytest.importorskip("torchvision", reason="needs the [vision] extra: pip install -e '.[vision]'")
from PIL import Image  # noqa: E402  (Pillow comes with torchvision)
from test_error_boundary import argparse_error  # noqa: E402

from {{ cookiecutter.package_name }}.cli import main  # noqa: E402
from {{ cookiecutter.package_name }}.config_keys import ConfigError  # noqa: E402
from {{ cookiecutter.package_name }}.data import batches, images, kinds, preprocessing  # noqa: E402
from {{ cookiecutter.package_name }}.data.augmentation import AugmentationKeys  # noqa: E402
from {{ cookiecutter.package_name }}.data.directory import DatasetError  # noqa: E402
from {{ cookiecutter.package_name }}.make_dataset import image_check  # noqa: E402
from {{ cookiecutter.package_name }}.make_dataset import images as image_writer  # noqa: E402

CLASSES = ("cat", "dog", "emu")
FORMATS = ("PNG", "JPEG", "WEBP")


def draw(path: Path, seed: int, mode: str = "RGB", fmt: str = "PNG") -> Path:
    """A small noise image of `mode`, saved as `fmt`."""
    rng = np.random.default_rng(seed)
    size = (16 + seed % 17, 16 + seed % 11)
    image = Image.fromarray(rng.integers(0, 256, (*size, 3), dtype=np.uint8)).convert(mode)
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path, format=fmt)
    return path


def image_folder(root: Path, per_class: int = 6, first_seed: int = 0) -> Path:
    for label, name in enumerate(CLASSES):
        for i in range(per_class):
            fmt = FORMATS[i % 3]
            draw(root / name / f"img{i:02d}.{fmt.lower()}", first_seed + 100 * label + i, fmt=fmt)
    return root


def cfg(**values):
    """What the images kind reads of a run's config: its keys (the augmentation's defaults)."""
    defaults = vars(AugmentationKeys()) | dict(image_size=16, seed=7, batch_size=4)
    return SimpleNamespace(**{**defaults, "grad_accum_steps": 1, **values})


def open_splits(directory: Path, **values):
    return kinds.KINDS["images"].open(directory, cfg(**values), None)


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    """An ImageFolder of 3 x 6 images and its dataset in shards of at most 2 KiB."""
    root = tmp_path_factory.mktemp("images")
    source = image_folder(root / "folder")
    index = image_writer.write_image_dataset(source, root / "ds", shard_mb=2 / 1024, workers=1)
    return source, root / "ds", index


def test_packing_writes_shards_records_and_an_index(packed):
    source, out, index = packed
    assert json.loads((out / "index.json").read_text()) == index
    assert index["format"] == "images/1" and index["classes"] == list(CLASSES)
    assert index["counts"] == {"train": 15, "val": 3}  # one of each class's 6 (5%, at least one)
    assert index["validation"] == "0.05 of each class held out (at least one image)"
    # The shards: the next image starts a new one where it would pass 2 KiB.
    files = image_writer.image_folder(source)[1]
    train, val = image_writer.hold_out(files, list(CLASSES), 0.05)
    for split, items in (("train", train), ("val", val)):
        expected, size = [], None
        for path, _ in items:
            length = path.stat().st_size
            if size is None or (size and size + length > 2048):
                expected.append(0)
                size = 0
            size += length
            expected[-1] += length
        assert [s["bytes"] for s in index[split]["shards"]] == expected
        assert [s["name"] for s in index[split]["shards"]] == [
            f"{split}-{i:05d}.bin" for i in range(len(expected))
        ]
    names = {s["name"] for split in ("train", "val") for s in index[split]["shards"]}
    assert {p.name for p in out.iterdir()} == names | {
        "index.json", "train-index.npy", "val-index.npy",
    }  # fmt: skip
    assert len(index["train"]["shards"]) > 3


def test_reading_back_gives_the_source_bytes_and_labels(packed):
    source, out, index = packed
    files = dict(image_writer.image_folder(source)[1])
    read = {}
    for split in ("train", "val"):
        records = np.load(out / f"{split}-index.npy")
        shards = [(out / s["name"]).read_bytes() for s in index[split]["shards"]]
        for offset, length, label, shard in records.tolist():
            read[shards[shard][offset : offset + length]] = label
    assert len(read) == len(files) == 18
    for path, label in files.items():
        assert read[path.read_bytes()] == label == CLASSES.index(path.parent.name)


def test_the_same_folder_gives_the_same_bytes(packed, tmp_path):
    source, out, index = packed
    again = image_writer.write_image_dataset(source, tmp_path / "ds", shard_mb=2 / 1024)
    assert again["fingerprint"] == index["fingerprint"]
    for path in out.iterdir():
        assert (tmp_path / "ds" / path.name).read_bytes() == path.read_bytes(), path.name
    # the same data to the same --out: kept; other data there: refused
    kept = image_writer.write_image_dataset(source, out, shard_mb=2 / 1024)
    assert kept["fingerprint"] == index["fingerprint"]
    with pytest.raises(DatasetError, match="already holds a different images dataset"):
        image_writer.write_image_dataset(source, out, val_fraction=0.5, shard_mb=2 / 1024)


def test_a_validation_folder_and_its_classes(packed, tmp_path):
    source, _, _ = packed
    val = image_folder(tmp_path / "val", per_class=2, first_seed=50)
    index = image_writer.write_image_dataset(source, tmp_path / "ds", val=val)
    assert index["counts"] == {"train": 18, "val": 6}
    assert index["validation"] == f"from {val}"
    assert len(index["train"]["shards"]) == 1  # 128 MB shards: everything in one


def test_the_process_pool_check_names_the_same_file(tmp_path, monkeypatch):
    monkeypatch.setattr(image_check, "POOL_MIN_IMAGES", 1)
    source = image_folder(tmp_path / "folder", per_class=3)
    (source / "dog" / "img01.jpeg").write_bytes(b"not an image")
    with pytest.raises(DatasetError, match=r"dog/img01.jpeg: not an image that decodes"):
        image_writer.write_image_dataset(source, tmp_path / "ds", workers=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["folder"]


def test_an_interrupted_write_leaves_nothing(packed, tmp_path, monkeypatch):
    source, _, _ = packed
    close_shard, calls = image_writer.close_shard, []

    def stopped_on_the_third_shard(handle):
        calls.append(handle)
        if len(calls) == 3:
            raise KeyboardInterrupt  # Ctrl-C, or SIGTERM (cli.Stopped), after two shards
        close_shard(handle)

    monkeypatch.setattr(image_writer, "close_shard", stopped_on_the_third_shard)
    with pytest.raises(KeyboardInterrupt):
        image_writer.write_image_dataset(source, tmp_path / "ds", shard_mb=2 / 1024)
    assert list(tmp_path.iterdir()) == []


def bad_folder(root: Path, problem: str) -> tuple[list[str], str]:
    """An ImageFolder with one problem: (extra make-dataset arguments, the expected line)."""
    source = image_folder(root / "folder", per_class=3)
    if problem == "truncated":
        data = (source / "cat" / "img00.png").read_bytes()
        (source / "cat" / "img00.png").write_bytes(data[: len(data) // 2])
        return [], "cat/img00.png: not an image that decodes"
    if problem == "not an image":
        (source / "emu" / "notes.jpg").write_text("a text file")
        return [], "emu/notes.jpg: not an image that decodes (cannot identify image file"
    if problem == "empty class":
        (source / "gnu").mkdir()
        return [], "folder/gnu: empty class folder (no images)"
    if problem == "one class":
        for name in CLASSES[1:]:
            for path in (source / name).iterdir():
                path.unlink()
            (source / name).rmdir()
        return [], "folder: only one class folder, 'cat'; a classifier needs at least two"
    if problem == "missing":
        return ["--images", str(root / "nowhere")], "nowhere: no such directory"
    if problem == "a file":
        (root / "file.png").write_bytes(b"")
        return ["--images", str(root / "file.png")], "file.png: not a directory"
    if problem == "val classes":
        val = image_folder(root / "val", per_class=1)
        (val / "emu").rename(val / "eel")
        return ["--val", str(val)], "its classes differ from"
    assert problem == "both val options"
    return ["--val", str(source), "--val-fraction", "0.1"], "--val DIR or --val-fraction F"


@pytest.mark.parametrize(
    "problem",
    [
        "truncated", "not an image", "empty class", "one class", "missing", "a file",
        "val classes", "both val options",
    ],
)  # fmt: skip
def test_each_bad_input_is_one_line_and_leaves_nothing(tmp_path, capsys, problem):
    extra, message = bad_folder(tmp_path, problem)
    out = tmp_path / "ds"
    argv = ["make-dataset", "--images", str(tmp_path / "folder"), "--out", str(out), *extra]
    before = sorted(p.name for p in tmp_path.iterdir())
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err, err
    assert "dataset error:" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no out, no temp directory


def test_modes_are_stored_unchanged_and_read_as_rgb(tmp_path, capsys):
    source = image_folder(tmp_path / "folder", per_class=2)
    modes = [("L", "JPEG"), ("RGBA", "PNG"), ("CMYK", "JPEG"), ("P", "PNG")]
    for i, (mode, fmt) in enumerate(modes):
        draw(source / CLASSES[i % 3] / f"mode{i}.{fmt.lower()}", 70 + i, mode, fmt)
    (source / "cat" / ".DS_Store").write_bytes(b"\0\1")
    draw(source / "dog" / ".hidden" / "x.png", 90)
    (source / ".cache").mkdir()  # a hidden folder: not a class
    out = tmp_path / "ds"
    assert main(["make-dataset", "--images", str(source), "--out", str(out), "--workers", "1"]) == 0
    line = capsys.readouterr().out.strip()
    assert line == (
        f"wrote 7 training and 3 validation images of 3 classes in 2 shards to {out} "
        "(validation: 0.05 of each class held out (at least one image); "
        "4 converted to RGB when read; 2 files skipped, hidden or not images by their "
        f"extension, e.g. folder/cat/.DS_Store); train with model=vision dataset={out}"
    )
    data = open_splits(out)
    records = np.load(out / "train-index.npy")
    for split in (data.train, data.val):
        for i in range(len(split)):
            image, label = split[i]
            assert image.shape == (3, 16, 16) and image.dtype == torch.float32
            assert label.dtype == torch.int64
    assert len(records) == 7


def test_the_dataset_info_and_the_transforms(packed):
    _, out, index = packed
    data = open_splits(out, image_size=24)
    assert data.decodes and data.info.kind == "images"
    assert (data.info.num_classes, data.info.class_names) == (3, CLASSES)
    assert data.info.details["image_size"] == 24
    # the torchvision convention: resize to 24 * 256 / 224, bilinear, ImageNet's mean and std
    assert data.info.details["preprocessing"] == {
        "size": 24,
        "resize": 27,
        "crop": "center",
        "interpolation": "bilinear",
        "mean": list(preprocessing.IMAGENET_MEAN),
        "std": list(preprocessing.IMAGENET_STD),
    }
    assert data.info.fingerprint == index["fingerprint"]
    image, _ = data.val[0]
    assert image.shape == (3, 24, 24)
    # normalised with the ImageNet mean and std: uniform noise in [0, 1] has mean 0.5
    mean = torch.tensor(preprocessing.IMAGENET_MEAN).view(3, 1, 1)
    std = torch.tensor(preprocessing.IMAGENET_STD).view(3, 1, 1)
    pixels = image * std + mean
    assert 0.0 <= float(pixels.min()) and float(pixels.max()) <= 1.0
    assert torch.equal(data.val[0][0], image)  # evaluation: no randomness


def test_augmentation_is_a_function_of_seed_epoch_and_index(packed):
    _, out, _ = packed
    data = open_splits(out)
    indices = np.array([0, 5, 9])

    def read(epoch, seed=7):
        epochs = np.full(len(indices), epoch)
        return batches.read_samples(data.train, indices, epochs, seed, data.collate)

    first = read(0)
    assert torch.equal(first[0], read(0)[0]) and torch.equal(first[1], read(0)[1])
    assert not torch.equal(first[0], read(1)[0])  # another epoch: another crop
    assert not torch.equal(first[0], read(0, seed=8)[0])
    assert torch.equal(first[1], read(1)[1])


def test_batches_are_the_same_for_0_and_2_loader_workers(packed):
    _, out, _ = packed
    data = open_splits(out)
    setting = cfg()

    def stream(workers):
        step_batches = batches.StepBatches(data, setting, 0, 1, 0, 0)
        return list(batches.micro_batches(step_batches, 6, workers, pin=False))

    alone, workers = stream(0), stream(2)
    assert len(alone) == len(workers) == 6  # 24 samples: more than one epoch of 15
    for (x0, y0), (x2, y2) in zip(alone, workers, strict=True):
        assert torch.equal(x0, x2) and torch.equal(y0, y2)


def test_a_shard_changed_after_make_dataset_is_refused_at_open(packed, tmp_path):
    _, out, index = packed
    copy = tmp_path / "ds"
    copy.mkdir()
    for path in out.iterdir():
        (copy / path.name).write_bytes(path.read_bytes())
    shard = copy / index["train"]["shards"][1]["name"]
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF  # the same size, another byte
    shard.write_bytes(bytes(data))
    with pytest.raises(DatasetError, match=f"{shard}: changed since make-dataset wrote it"):
        open_splits(copy)
    shard.write_bytes(bytes(data[:-10]))
    with pytest.raises(DatasetError, match=f"{shard}: {len(data) - 10} bytes, but index.json"):
        open_splits(copy)
    shard.unlink()
    with pytest.raises(DatasetError, match=f"{shard}: missing"):
        open_splits(copy)


def test_a_shard_cut_short_or_changed_under_a_run_is_one_line(packed, tmp_path):
    _, out, index = packed
    copy = tmp_path / "ds"
    copy.mkdir()
    for path in out.iterdir():
        (copy / path.name).write_bytes(path.read_bytes())
    data = open_splits(copy)
    offset, length, _, number = np.load(copy / "train-index.npy")[0].tolist()
    shard = copy / index["train"]["shards"][number]["name"]
    original = shard.read_bytes()
    shard.write_bytes(original[offset : offset + 10] + bytes(len(original) - 10))
    with pytest.raises(DatasetError, match=f"{shard}: image 0 .*no longer decodes"):
        data.train[0]
    shard.write_bytes(original[: offset + length // 2])
    with pytest.raises(DatasetError, match=f"{shard}: ends before byte {offset + length}"):
        data.train[0]


def test_synthetic_images_are_learnable_and_deterministic():
    spec = SimpleNamespace(reads=("images",))
    setting = cfg(
        dataset="synthetic", model="vision", synthetic_samples=40, eval_samples=8, num_classes=4
    )
    data = kinds.open_splits(setting, spec)
    assert (len(data.train), len(data.val), data.info.num_classes) == (40, 8, 4)
    assert data.info.details["image_size"] == 16
    again = kinds.open_splits(setting, spec)
    first_epoch = np.zeros(8, np.int64)
    first = batches.read_samples(data.train, np.arange(8), first_epoch, 7, data.collate)
    second = batches.read_samples(again.train, np.arange(8), first_epoch, 7, again.collate)
    assert torch.equal(first[0], second[0]) and first[0].shape == (8, 3, 16, 16)
    assert first[1].tolist() == [0, 1, 2, 3, 0, 1, 2, 3]
    # the class is a bright square (brighter than any noise) of its own colour and place
    raw = images.SyntheticImages(8, 0, 4, 16, 7, transform=np.asarray)
    for i in range(8):
        pixels, label = raw[i]
        row, column = divmod(int(label), 2)  # a 2 x 2 grid of 8-pixel cells, squares of 6
        square = pixels[row * 8 : row * 8 + 6, column * 8 : column * 8 + 6]
        assert (square == raw.palette[label]).all() and square.min() >= 128
        assert (pixels < 96).sum() == 16 * 16 * 3 - square.size
    assert len({tuple(colour) for colour in raw.palette.tolist()}) == 4


def test_without_torchvision_an_images_dataset_is_one_line(packed, monkeypatch):
    _, out, _ = packed
    monkeypatch.setitem(sys.modules, "torchvision", None)  # import torchvision fails
    with pytest.raises(ConfigError, match=r"images datasets needs .*torchvision.*\[vision\]"):
        open_splits(out)


def test_shard_mb_takes_ascii_digits_only(capsys):
    """U+FF12 FULLWIDTH DIGIT TWO: Python's float() reads 2 (test_error_boundary.py's check)."""
    with pytest.raises(SystemExit) as exit_:
        main(["make-dataset", "--out", "d", "--shard-mb", "\uff12.5"])
    assert exit_.value.code == 2
    line = argparse_error(capsys)
    assert "error: argument --shard-mb: " in line and repr("\uff12.5") in line, line


def test_image_size_is_the_images_kinds_own_key():
    """A dataset kind's own keys are flat (cfg.image_size), not general keys (test_config.py)."""
    from {{ cookiecutter.package_name }}.config import settings
    from {{ cookiecutter.package_name }}.config.settings import GENERAL_KEYS, Config

    assert "image_size" in settings.KIND_KEYS and Config().image_size == 0
    assert "image_size" not in {k.name for k in GENERAL_KEYS}
