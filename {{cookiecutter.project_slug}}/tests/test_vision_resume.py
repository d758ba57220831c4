"""model=vision end to end on 2 CPU ranks (gloo): an ImageFolder drawn here, packed by
make-dataset --images, a torchvision ResNet-18 trained with 2 loader processes per rank and random
augmentation (crop, flip), DDP and FSDP2. kill -9, then the same command resumes: the model
(BatchNorm's running statistics included), optimizer, schedule and RNG states at the end are
bit-identical to an uninterrupted run's. The run resumes from a checkpoint that no evaluation
just preceded and replays one before the next. The images are learnable (noise tinted with the
class's colour), so accuracy ends far above chance."""

from __future__ import annotations

import json
import signal

import numpy as np
import pytest
from conftest import Ranks, assert_same_training_state, checkpoint_steps

pytest.importorskip("torchvision", reason="needs the [vision] extra: pip install -e '.[vision]'")
from PIL import Image  # noqa: E402  (Pillow comes with torchvision)

from {{ cookiecutter.package_name }}.make_dataset import images as image_writer  # noqa: E402

CLASSES = {"red": (1, 0, 0), "green": (0, 1, 0), "blue": (0, 0, 1), "yellow": (1, 1, 0)}
FINAL = 24


def draw_image_folder(root, per_class: int = 16, size: int = 20):
    """Noise tinted with the class's colour (which survives any crop and flip; a square in
    the class's corner did not: a flip moves it, a small crop loses it), as JPEGs and PNGs."""
    rng = np.random.default_rng(0)
    for name, colour in CLASSES.items():
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            pixels = rng.integers(0, 96, (size, size, 3), dtype=np.uint8)
            pixels += np.array(colour, dtype=np.uint8) * 144
            fmt = ("JPEG", "PNG")[i % 2]
            Image.fromarray(pixels).save(root / name / f"{i:02d}.{fmt.lower()}", format=fmt)
    return root


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    root = tmp_path_factory.mktemp("vision")
    source = draw_image_folder(root / "folder")
    image_writer.write_image_dataset(source, root / "packed", val_fraction=0.25, workers=1)
    return root / "packed"


def vision_run(packed, run_dir, extra=()) -> list[str]:
    return [
        "device=cpu",
        "model=vision",
        "vision_model=resnet18",
        f"dataset={packed}",
        "image_size=16",
        "batch_size=4",
        "num_workers=2",  # loader processes decode and augment
        "lr=0.003",
        "warmup_steps=2",
        f"max_steps={FINAL}",
        "log_every=1",
        "eval_every=12",
        "eval_batches=4",
        "checkpoint_every=5",  # 5, 10, ...: not at an evaluation's step (12)
        "keep_checkpoints=3",
        "async_checkpoint=false",
        "preempt_check_every=1",
        "cpu_threads=1",
        "dist_timeout_s=60",
        f"run_dir={run_dir}",
        *extra,
    ]


def final_eval(run_dir) -> dict:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in records if r.get("kind") == "eval"][-1]


@pytest.mark.parametrize("parallelism", ["ddp", "fsdp"])
def test_kill_9_with_loader_processes_resumes_exactly(packed, tmp_path, parallelism):
    extra = [f"parallelism={parallelism}"]
    reference = tmp_path / "reference"
    done = Ranks(vision_run(packed, reference, extra), tmp_path / "logs0")
    assert done.wait() == [0, 0], done.log(0)[-3000:]
    result = final_eval(reference)
    assert result["eval_acc"] >= 0.5, result  # 4 classes: chance is 0.25

    run_dir = tmp_path / "run"
    ranks = Ranks(vision_run(packed, run_dir, extra), tmp_path / "logs1")
    ranks.wait_for_step(run_dir, 11)  # between checkpoints (10, 15), before an evaluation
    assert ranks.running(), "the run finished before it could be killed"
    ranks.send(signal.SIGKILL)
    ranks.wait()
    assert checkpoint_steps(run_dir) and max(checkpoint_steps(run_dir)) < FINAL

    again = Ranks(vision_run(packed, run_dir, extra), tmp_path / "logs2")
    assert again.wait() == [0, 0], again.log(0)[-3000:]
    assert "RESUMING" in again.log(0)
    assert_same_training_state(reference, run_dir, FINAL)
    # every rank's BatchNorm statistics, not only those the checkpoint took from one rank: each
    # rank evaluates its share of the held-out images with its own
    assert final_eval(run_dir) == result
