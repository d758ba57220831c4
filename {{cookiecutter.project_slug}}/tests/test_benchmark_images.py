"""`benchmark model=vision` on a packed images dataset: the package's step against torchvision's
reference loop written plainly (a DataLoader with a DistributedSampler over the same images),
both measured in one run; the JSON line and its sentence. The images are drawn here, 16 pixels."""

import json

import numpy as np
import pytest
import torch

pytest.importorskip("torchvision", reason="needs the [vision] extra: pip install -e '.[vision]'")
from PIL import Image  # noqa: E402  (Pillow comes with torchvision)

from {{ cookiecutter.package_name }}.cli import main  # noqa: E402
from {{ cookiecutter.package_name }}.config.settings import load_config  # noqa: E402
from {{ cookiecutter.package_name }}.data import images as images_kind  # noqa: E402
from {{ cookiecutter.package_name }}.data.kinds import open_splits  # noqa: E402
from {{ cookiecutter.package_name }}.data.preprocessing import recorded  # noqa: E402
from {{ cookiecutter.package_name }}.models import spec_of  # noqa: E402


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    """Two classes of 12 small JPEGs each, packed by make-dataset --images."""
    root = tmp_path_factory.mktemp("bench-images")
    rng = np.random.default_rng(0)
    for name in ("ant", "bee"):
        (root / "folder" / name).mkdir(parents=True)
        for i in range(12):
            pixels = rng.integers(0, 256, (20, 24, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / "folder" / name / f"{i}.jpg")
    out = root / "packed"
    argv = ["make-dataset", "--images", str(root / "folder"), "--out", str(out), "--workers", "1"]
    assert main(argv) == 0
    return out


def vision_args(packed) -> list[str]:
    return [
        "device=cpu",
        "model=vision",
        "vision_model=resnet18",
        f"dataset={packed}",
        "image_size=16",
        "batch_size=4",
        "num_workers=0",
        "cpu_threads=1",
    ]


def test_benchmark_compares_with_the_plain_dataloader_loop(packed, single_process, capsys):
    argv = ["benchmark", *vision_args(packed), "bench_warmup=1", "bench_steps=5"]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    (line,) = out.strip().splitlines()
    result = json.loads(line)
    assert result["model"] == "vision:resnet18" and result["steps"] == 5
    assert result["baseline"].startswith("plain: DataLoader(num_workers=0, DistributedSampler")
    assert "shard opened and read at its offset" in result["baseline"]  # not the package's reader
    for key in ("train_images_per_s", "plain_images_per_s", "ratio"):
        assert result[key] > 0
    # no loader processes on a CPU: CPU time per step, one round
    assert result["clock"] == "process CPU time" and sorted(result["blocks"]) == ["plain", "train"]
    (train,), (plain,) = result["blocks"]["train"], result["blocks"]["plain"]
    assert result["ratio"] == pytest.approx(train / plain)
    assert "bare_step_median_s" not in result  # decoded samples: not the one-batch loop
    for key in ("data_wait_fraction", "plain_data_wait_fraction"):
        assert 0 < result[key] < 1  # with no loader process, every sample is read in the step
    assert result["num_workers"] == 0
    assert f"ratio {result['ratio']:.3f}: the package's training step is " in err
    assert "than the plain torchvision-style loop (a DataLoader with a DistributedSampler" in err
    assert f"the package {result['data_wait_fraction']:.1%} of its step time" in err


def test_the_plain_loop_reads_the_packages_images_with_the_same_labels(packed):
    """The plain Dataset decodes record i into the image and label the images kind gives for
    it (torch's generator, which draws the random crop and flip, seeded alike for both)."""
    cfg = load_config(None, vision_args(packed)).config
    package = open_splits(cfg, spec_of(cfg))
    package_split = package.train
    plain = images_kind.PackedImagesPlainly(packed, recorded(package.info.details), cfg)
    assert len(plain) == len(package_split)
    for index in (0, len(plain) - 1):
        torch.manual_seed(index)
        image, label = plain[index]
        torch.manual_seed(index)
        expected_image, expected_label = package_split[index]
        assert torch.equal(image, expected_image) and label == expected_label
