"""What an ImageFolder holds besides 8-bit RGB photos: 16-bit and float pixels kept to their
range (a dataset whose classes differ only below 8 bits trains), EXIF orientation applied, files
that are not images skipped and counted, EPS never handed to Ghostscript, class names checked as
data, the decoding check's workers gone with a killed make-dataset, its progress lines."""

import io
import json
import os
import signal
import struct
import subprocess
import sys
import time
import zlib
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from conftest import PACKAGE, checkpoint_steps, clean_env, one_line

pytest.importorskip("torchvision", reason="needs the [vision] extra: pip install -e '.[vision]'")
from PIL import EpsImagePlugin, Image  # noqa: E402  (Pillow comes with torchvision)

from {{ cookiecutter.package_name }}.cli import main  # noqa: E402
from {{ cookiecutter.package_name }}.data import images, kinds  # noqa: E402
from {{ cookiecutter.package_name }}.data.augmentation import AugmentationKeys  # noqa: E402
from {{ cookiecutter.package_name }}.data.directory import DatasetError, content_fingerprint  # noqa: E402
from {{ cookiecutter.package_name }}.make_dataset import image_check  # noqa: E402
from {{ cookiecutter.package_name }}.make_dataset import images as image_writer  # noqa: E402

# 16-bit values that share their upper 8 bits (150): read as 8 bits, every image is the same
BASE, SPREAD, STEP = 150 * 256, 100, 128


def grey16(path: Path, label: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    values = BASE + STEP * label + rng.integers(0, SPREAD, (16, 16))
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(values.astype(np.uint16)).save(path)


def open_splits(directory: Path):
    setting = SimpleNamespace(image_size=16, **vars(AugmentationKeys()))
    return kinds.KINDS["images"].open(directory, setting, None)


@pytest.fixture(scope="module")
def sixteen_bit(tmp_path_factory):
    """A 16-bit grey ImageFolder of 2 classes x 20 images, packed; a float TIFF among them."""
    root = tmp_path_factory.mktemp("sixteen")
    for label, name in enumerate(("dim", "bright")):
        for i in range(20):
            grey16(root / "folder" / name / f"{i:02d}.png", label, 100 * label + i)
    out = root / "ds"
    image_writer.write_image_dataset(root / "folder", out, val_fraction=0.2, workers=1)
    return out


def test_16_bit_classes_that_differ_below_8_bits_train_above_chance(
    sixteen_bit, tmp_path, single_process
):
    """Also the vision model's training run of the images kind: checkpoints and images/s."""
    index = json.loads((sixteen_bit / "index.json").read_text())
    assert index["pixel_range"] == [BASE, BASE + STEP + SPREAD - 1] and index["scaled"] == 40
    assert index["converted"] == 0
    data = open_splits(sixteen_bit)
    assert data.val[0][0].dtype == torch.float32
    run_dir = tmp_path / "run"
    argv = [
        "train", "device=cpu", "model=vision", "vision_model=resnet18", f"dataset={sixteen_bit}",
        "image_size=16", "batch_size=8", "lr=0.001", "warmup_steps=0", "max_steps=24",
        "log_every=1", "eval_every=24", "checkpoint_every=24", "num_workers=0", "cpu_threads=1",
        f"run_dir={run_dir}",
    ]  # fmt: skip
    assert main(argv) == 0
    assert checkpoint_steps(run_dir) == [24]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["kind"] == "train"]
    (evaluation,) = [r for r in records if r["kind"] == "eval"]
    assert all(np.isfinite(r["loss"]) for r in train) and "images_per_s" in train[-1]
    # 8 validation images, chance 0.5. 24 steps, not 12: after 12 the batch norms' running
    # statistics are far from settled, and the evaluation sat at chance on one CPU's kernels
    assert evaluation["eval_acc"] >= 0.75


def test_high_bit_images_are_scaled_by_the_datasets_range():
    values = np.array([[0, 2**20], [2**19, 2**20]], dtype=np.int32)  # a 32-bit integer TIFF
    buffer = io.BytesIO()
    Image.fromarray(values).save(buffer, format="TIFF")
    tensor = images.decode(buffer.getvalue(), "x.tif", [0, 2**20])
    assert tensor.shape == (3, 2, 2) and tensor.dtype == torch.float32
    assert tensor[0].tolist() == [[0.0, 1.0], [0.5, 1.0]] and torch.equal(tensor[0], tensor[2])


def png_16_bit_rgb(path: Path) -> None:
    """A 48-bit RGB PNG (PIL cannot write one): signature, IHDR, IDAT, IEND."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
        )

    rows = b"".join(b"\0" + bytes(range(48)) for _ in range(8))  # 8 x 8 pixels of 6 bytes
    header = struct.pack(">IIBBBBB", 8, 8, 16, 2, 0, 0, 0)
    data = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows))
    path.write_bytes(data + chunk(b"IEND", b""))


@pytest.mark.parametrize("problem", ["16-bit colour", "NaN"])
def test_pixels_pil_would_read_wrongly_are_refused_in_one_line(tmp_path, capsys, problem):
    for label in range(2):
        grey16(tmp_path / "folder" / f"c{label}" / "a.png", label, label)
    if problem == "16-bit colour":
        png_16_bit_rgb(tmp_path / "folder" / "c1" / "b.png")
        message = "c1/b.png: 16-bit RGB: PIL would read 8 bits of each colour channel"
    else:
        Image.fromarray(np.full((4, 4), np.nan, np.float32)).save(tmp_path / "folder/c1/b.tif")
        message = "c1/b.tif: F pixels that are not finite"
    out = tmp_path / "ds"
    assert main(["make-dataset", "--images", str(tmp_path / "folder"), "--out", str(out)]) == 2
    assert message in one_line(capsys)
    assert not out.exists()


def test_the_exif_orientation_is_applied():
    pixels = np.zeros((16, 32, 3), np.uint8)
    pixels[:, :16] = 255  # stored: 32 wide, 16 high, the left half white
    exif = Image.Exif()
    exif[images.EXIF_ORIENTATION] = 6  # shown turned 90 degrees clockwise
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="JPEG", exif=exif, quality=95)
    image = np.asarray(images.decode(buffer.getvalue(), "photo.jpg"))
    assert image.shape == (32, 16, 3)  # upright: 16 wide, 32 high, the top half white
    assert image[:14].min() > 200 and image[18:].max() < 50


def test_files_that_are_not_images_are_skipped_and_counted(tmp_path, capsys):
    for label in range(2):
        grey16(tmp_path / "folder" / f"c{label}" / "a.PNG", label, label)
        grey16(tmp_path / "folder" / f"c{label}" / "b.tiff", label, label + 5)
    (tmp_path / "folder" / "c0" / "README.txt").write_text("how these were taken")
    (tmp_path / "folder" / "c1" / "Thumbs.db").write_bytes(b"\0")
    (tmp_path / "folder" / "c1" / ".DS_Store").write_bytes(b"\0")
    out = tmp_path / "ds"
    assert main(["make-dataset", "--images", str(tmp_path / "folder"), "--out", str(out)]) == 0
    line = capsys.readouterr().out
    assert (
        "3 files skipped, hidden or not images by their extension, e.g. folder/c0/README.txt"
        in line
    )
    index = json.loads((out / "index.json").read_text())
    assert index["counts"] == {"train": 2, "val": 2} and index["skipped"] == 3


EPS = b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 16 16\n0 0 moveto 16 16 lineto stroke\n"


def test_an_eps_file_never_reaches_ghostscript(tmp_path, monkeypatch, capsys):
    marker = tmp_path / "ghostscript-ran"
    fake = tmp_path / "bin" / "gs"
    fake.parent.mkdir()
    fake.write_text(f"#!/bin/sh\ntouch {marker}\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(EpsImagePlugin, "gs_binary", None)  # look for gs again
    for label in range(2):
        grey16(tmp_path / "folder" / f"c{label}" / "a.png", label, label)
    (tmp_path / "folder" / "c0" / "drawing.eps").write_bytes(EPS)  # skipped: not an image
    out = tmp_path / "ds"
    argv = ["make-dataset", "--images", str(tmp_path / "folder"), "--out", str(out)]
    assert main(argv) == 0 and "1 file skipped" in capsys.readouterr().out
    (tmp_path / "folder" / "c1" / "drawing.png").write_bytes(EPS)  # an image by its name
    assert main([*argv[:-1], str(tmp_path / "ds2")]) == 2
    assert "c1/drawing.png: not an image that decodes (cannot identify" in one_line(capsys)
    with pytest.raises(DatasetError, match="no longer decodes"):
        images.decode(EPS, "shard")  # the reader too
    assert not marker.exists()


def test_an_edited_class_list_is_refused(sixteen_bit, tmp_path):
    for path in sixteen_bit.iterdir():
        (tmp_path / path.name).write_bytes(path.read_bytes())
    index = json.loads((tmp_path / "index.json").read_text())
    assert index["classes"] == ["bright", "dim"]
    (tmp_path / "index.json").write_text(json.dumps(index | {"classes": ["dim", "bright"]}))
    with pytest.raises(DatasetError, match="index.json: its class names .* edited after"):
        open_splits(tmp_path)
    del index["data_sha256"]  # an index of an earlier make-dataset: its names cannot be checked
    (tmp_path / "index.json").write_text(json.dumps(index))
    with pytest.raises(DatasetError, match="written by an earlier make-dataset"):
        open_splits(tmp_path)
    # the names are in the fingerprint: new names are another dataset, which a resume refuses
    swapped = content_fingerprint(*images.fingerprint_parts(["dim", "bright"], ["a", "b"]))
    assert swapped != content_fingerprint(*images.fingerprint_parts(["bright", "dim"], ["a", "b"]))


def children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_kill_9_of_make_dataset_leaves_no_worker(tmp_path):
    buffer = io.BytesIO()  # one image of 1024 x 1024 pixels (a few ms to decode), many copies
    Image.new("L", (1024, 1024)).save(buffer, format="PNG")
    for label in range(2):
        folder = tmp_path / "folder" / f"c{label}"
        folder.mkdir(parents=True)
        for i in range(image_check.POOL_MIN_IMAGES // 2 + 8):
            (folder / f"{i:03d}.png").write_bytes(buffer.getvalue())
    argv = ["make-dataset", "--images", str(tmp_path / "folder"), "--out", str(tmp_path / "ds")]
    writer = subprocess.Popen(
        [sys.executable, "-m", PACKAGE, *argv, "--workers", "2"], env=clean_env(),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline, workers = time.monotonic() + 60, []
    while len(workers) < 2 and writer.poll() is None and time.monotonic() < deadline:
        workers = children(writer.pid)
        time.sleep(0.01)
    assert len(workers) >= 2, "the decoding check started no pool"
    os.kill(writer.pid, signal.SIGKILL)
    writer.wait()
    deadline = time.monotonic() + 10
    while any(map(alive, workers)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [pid for pid in workers if alive(pid)], "workers outlived make-dataset"


class Stream(io.StringIO):
    def __init__(self, terminal: bool):
        super().__init__()
        self.terminal = terminal

    def isatty(self) -> bool:
        return self.terminal


@pytest.mark.parametrize("terminal", [False, True])
def test_progress_is_a_line_in_a_log_and_one_updating_line_on_a_terminal(terminal):
    stream = Stream(terminal)
    progress = image_check.Progress("decoded", 4, every_s=0.0, stream=stream)
    progress.every_s = 0.0
    for _ in range(4):
        progress.update()
    progress.close()
    text = stream.getvalue()
    lines = text.split("\r\033[K") if terminal else text.splitlines()
    lines = [line.strip() for line in lines if line.strip()]
    assert lines[0].startswith("make-dataset: decoded 1 of 4 images (25%), ")
    assert "images/s, ETA 0:00:00" in lines[0]
    assert lines[3].startswith("make-dataset: decoded 4 of 4 images (100%)")
    assert text.endswith("\n") and text.count("\n") == (1 if terminal else 4)
