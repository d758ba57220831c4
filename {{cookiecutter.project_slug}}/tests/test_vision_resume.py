"""model=vision end to end on 2 CPU ranks (gloo): an ImageFolder drawn here, packed by
make-dataset --images, a torchvision ResNet-18 trained with 2 loader processes per rank and random
augmentation (crop, flip), DDP and FSDP2, for `epochs=4` with evaluations and checkpoints in
epochs. kill -9, then the same command resumes: the model (BatchNorm's running statistics
included), optimizer, schedule and RNG states at the end are bit-identical to an uninterrupted
run's. The run resumes from a checkpoint in the middle of an epoch that no evaluation just
preceded, and replays one before the next. The images are learnable (noise tinted with the
class's colour), so accuracy ends far above chance. docs/vision.md's local command trains on
the same images, as written."""

from __future__ import annotations

import json
import re
import shlex
import signal

import numpy as np
import pytest
from conftest import PACKAGE, REPO, Ranks, assert_same_training_state, checkpoint_steps

pytest.importorskip("torchvision", reason="needs the [vision] extra: pip install -e '.[vision]'")
from PIL import Image  # noqa: E402  (Pillow comes with torchvision)

from {{ cookiecutter.package_name }}.cli import main  # noqa: E402
from {{ cookiecutter.package_name }}.make_dataset import images as image_writer  # noqa: E402

CLASSES = {"red": (1, 0, 0), "green": (0, 1, 0), "blue": (0, 0, 1), "yellow": (1, 1, 0)}
FINAL = 24  # epochs=4 of 48 training images at 8 a step (2 ranks x batch_size 4): 6 an epoch


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
        "epochs=4",
        "log_every=1",
        "eval_every=2epochs",  # steps 12, 24
        "eval_batches=4",
        "checkpoint_every=1.5epochs",  # steps 9 (mid-epoch, no evaluation), 18, and the last
        "keep_checkpoints=3",
        "async_checkpoint=false",
        "preempt_check_every=1",
        "cpu_threads=1",
        "dist_timeout_s=60",
        f"run_dir={run_dir}",
        *extra,
    ]


def records(run_dir, kind: str) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r.get("kind") == kind]


def final_eval(run_dir) -> dict:
    return records(run_dir, "eval")[-1]


@pytest.mark.parametrize("parallelism", ["ddp", "fsdp"])
def test_kill_9_with_loader_processes_resumes_exactly(packed, tmp_path, parallelism):
    extra = [f"parallelism={parallelism}"]
    reference = tmp_path / "reference"
    done = Ranks(vision_run(packed, reference, extra), tmp_path / "logs0")
    assert done.wait() == [0, 0], done.log(0)[-3000:]
    stated = "48 training samples, 8 per step (batch_size 4 x grad_accum_steps 1 x 2 rank(s)): 6 "
    assert stated + "steps per epoch; epochs=4: 24 steps in all, 4 epochs" in done.log(0)
    train = records(reference, "train")
    assert [(r["step"], r["epoch"]) for r in train] == [(s, s / 6) for s in range(1, FINAL + 1)]
    assert re.search(r"step 9/24 epoch 1.50 loss .* eta ", done.log(0))
    assert [(r["step"], r["epoch"]) for r in records(reference, "eval")] == [(12, 2), (24, 4)]
    assert [r["step"] for r in records(reference, "checkpoint")] == [9, 18, 24]
    result = final_eval(reference)
    assert result["eval_acc"] >= 0.5, result  # 4 classes: chance is 0.25

    run_dir = tmp_path / "run"
    ranks = Ranks(vision_run(packed, run_dir, extra), tmp_path / "logs1")
    ranks.wait_for_step(run_dir, 11)  # between checkpoints (9, 18), before an evaluation
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


def docs_local_command() -> list[str]:
    """The arguments of docs/vision.md's local command, as written there."""
    text = (REPO / "docs" / "vision.md").read_text()
    block = text.split("trains in minutes", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    words = shlex.split(block.replace("\\\n", " "))
    assert words[:3] == ["python", "-m", PACKAGE], block
    return words[3:]


def test_the_vision_pages_local_command_trains_epochs_not_the_configs_steps(
    packed, tmp_path, monkeypatch, single_process, capfd, caplog
):
    """configs/experiments/resnet50-images.toml's 10,000 steps and 500 warmup steps would take
    hours on a CPU: the page's command gives epochs, and the run is their steps (here on 48
    images at 32 a step) with an evaluation after each epoch. As written, but for 2 epochs of
    16-pixel images (the page's 5 of 64 pixels: a minute on this shared 2-core machine)."""
    args = docs_local_command()
    assert any(a.startswith("epochs=") for a in args) and "device=cpu" in args
    ours = {"dataset": str(packed), "run_dir": str(tmp_path / "run"), "image_size": "16"}
    ours["epochs"] = "2"  # of 48 images at 32 a step: 3 steps
    args = [f"{k}={ours[k]}" if (k := a.partition("=")[0]) in ours else a for a in args]
    monkeypatch.chdir(REPO)  # the page's --config path is relative to the repository
    caplog.set_level("INFO")
    assert main(args) == 0
    err = capfd.readouterr().err
    epochs = int(next(a for a in args if a.startswith("epochs=")).partition("=")[2])
    steps = -(-epochs * 48 // 32)
    assert f"epochs={epochs}: {steps} steps in all" in err
    assert "max_steps=10000 (from configs/experiments/resnet50-images.toml) is replaced" in (
        caplog.text
    )
    evals = records(tmp_path / "run", "eval")  # on the step that completes each epoch
    assert [int(r["epoch"]) for r in evals] == list(range(1, epochs + 1))
    assert records(tmp_path / "run", "train")[-1]["step"] == steps
