"""Image models end to end on 2 CPU ranks (gloo): an ImageFolder drawn here, packed by
make-dataset --images (its validation images from their own folder, `--val`), trained with 2
loader processes per rank and random augmentation: torchvision's ResNet-18 with DDP (batch norm)
and docs/vision.md's recipe for long runs on photos (TrivialAugment, random erasing, mixup or
cutmix per batch, label smoothing), for `epochs=4` with evaluations and checkpoints in epochs;
timm's test ConvNeXt (`stages[i].blocks[j]` as units) with FSDP2 and the default crop and flip.
kill -9, then the same command resumes: the model (BatchNorm's running statistics included),
optimizer, schedule and RNG states at the end are bit-identical to an uninterrupted run's. The
run resumes from a checkpoint (in the middle of an epoch) that no evaluation just preceded, and
replays one before the next. The images are learnable (noise tinted with the class's colour), so
the ResNet-18's accuracy ends far above chance. docs/vision.md's local command trains on the same
images, as written.

Then docs/vision.md's snippet, as written, rebuilds the evaluation transform and the model from
the exported file alone and scores the validation folder: `evaluate`'s accuracy and loss."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shlex
import signal
from pathlib import Path

import numpy as np
import pytest
from conftest import PACKAGE, REPO, Ranks, assert_same_training_state, checkpoint_steps

pytest.importorskip("torchvision", reason="needs the [vision] extra: pip install -e '.[vision]'")
from PIL import Image  # noqa: E402  (Pillow comes with torchvision)

from {{ cookiecutter.package_name }}.checkpoint import export_model  # noqa: E402
from {{ cookiecutter.package_name }}.cli import main  # noqa: E402
from {{ cookiecutter.package_name }}.make_dataset import images as image_writer  # noqa: E402

CLASSES = {"red": (1, 0, 0), "green": (0, 1, 0), "blue": (0, 0, 1), "yellow": (1, 1, 0)}
VISION_MD = Path(__file__).resolve().parents[1] / "docs" / "vision.md"
NEEDS_TIMM = pytest.mark.skipif(
    not __import__("importlib").util.find_spec("timm"), reason="needs the [timm] extra"
)
# (parallelism, the model, its length and intervals, the final step, the step it is killed at)
EPOCHS = ["epochs=4", "eval_every=2epochs", "checkpoint_every=1.5epochs"]  # 6 steps an epoch:
# evaluations at 12 and 24, checkpoints at 9 (mid-epoch, no evaluation), 18 and the last
STEPS = ["max_steps=12", "eval_every=6", "checkpoint_every=5"]  # not at an evaluation's step
# docs/vision.md's recipe for long runs on photos: a policy, erasing, mixup or cutmix per batch
RECIPE = ["auto_augment=trivialaugment", "random_erase=0.1", "label_smoothing=0.1", "mixup=0.2",
          "cutmix=1.0"]  # fmt: skip
CASES = [
    pytest.param("ddp", ["model=vision", "vision_model=resnet18", "image_size=16", *RECIPE],
                 EPOCHS, 24, 11, id="ddp-torchvision"),
    # HSDP: FSDP2 on a 2-D mesh, here one group sharding over the 2 ranks of the node
    pytest.param("hsdp", ["model=timm", "timm_model=test_convnext", "image_size=32"],
                 STEPS, 12, 7, id="hsdp-timm", marks=NEEDS_TIMM),  # halves it 5 times
]  # fmt: skip


def draw_image_folder(root, per_class: int, seed: int, size: int = 20):
    """Noise tinted with the class's colour (which survives any crop and flip; a square in
    the class's corner did not: a flip moves it, a small crop loses it), as JPEGs and PNGs."""
    rng = np.random.default_rng(seed)
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
    """(the packed dataset, its validation ImageFolder)."""
    root = tmp_path_factory.mktemp("vision")
    source = draw_image_folder(root / "folder", per_class=12, seed=0)
    val = draw_image_folder(root / "val", per_class=4, seed=1)
    image_writer.write_image_dataset(source, root / "packed", val=val, workers=1)
    return root / "packed", val


def image_run(packed, run_dir, model: list[str], schedule: list[str], parallelism: str):
    return [
        "device=cpu",
        *model,
        f"dataset={packed}",
        "batch_size=4",
        "num_workers=2",  # loader processes decode and augment
        "lr=0.003",
        "warmup_steps=2",
        *schedule,
        "log_every=1",
        "eval_batches=4",
        "keep_checkpoints=3",
        "async_checkpoint=false",
        "preempt_check_every=1",
        "cpu_threads=1",
        "dist_timeout_s=60",
        f"parallelism={parallelism}",
        f"run_dir={run_dir}",
    ]


def records(run_dir, kind: str) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r.get("kind") == kind]


def final_eval(run_dir) -> dict:
    return records(run_dir, "eval")[-1]


def check_epochs(reference, log: str) -> None:
    """The run of EPOCHS: its length stated, the epoch in every record, its intervals."""
    stated = "48 training samples, 8 per step (batch_size 4 x grad_accum_steps 1 x 2 rank(s)): 6 "
    assert stated + "steps per epoch; epochs=4: 24 steps in all, 4 epochs" in log
    train = records(reference, "train")
    assert [(r["step"], r["epoch"]) for r in train] == [(s, s / 6) for s in range(1, 25)]
    assert re.search(r"step 9/24 epoch 1.50 loss .* eta ", log)
    assert [(r["step"], r["epoch"]) for r in records(reference, "eval")] == [(12, 2), (24, 4)]
    assert [r["step"] for r in records(reference, "checkpoint")] == [9, 18, 24]


@pytest.mark.parametrize("parallelism, model, schedule, final, kill_at", CASES)
def test_kill_9_with_loader_processes_resumes_exactly(
    packed, tmp_path, parallelism, model, schedule, final, kill_at, single_process, capsys,
    monkeypatch,
):  # fmt: skip
    dataset, val = packed
    reference = tmp_path / "reference"
    done = Ranks(image_run(dataset, reference, model, schedule, parallelism), tmp_path / "logs0")
    assert done.wait() == [0, 0], done.log(0)[-3000:]
    result = final_eval(reference)
    if schedule == EPOCHS:
        check_epochs(reference, done.log(0))
    if "model=vision" in model:
        assert result["eval_acc"] >= 0.5, result  # 4 classes: chance is 0.25

    run_dir = tmp_path / "run"
    argv = image_run(dataset, run_dir, model, schedule, parallelism)
    ranks = Ranks(argv, tmp_path / "logs1")
    ranks.wait_for_step(run_dir, kill_at)  # between checkpoints, before an evaluation
    assert ranks.running(), "the run finished before it could be killed"
    ranks.send(signal.SIGKILL)
    ranks.wait()
    assert checkpoint_steps(run_dir) and max(checkpoint_steps(run_dir)) < final

    again = Ranks(argv, tmp_path / "logs2")
    assert again.wait() == [0, 0], again.log(0)[-3000:]
    assert "RESUMING" in again.log(0)
    assert_same_training_state(reference, run_dir, final)
    # every rank's BatchNorm statistics, not only those the checkpoint took from one rank: each
    # rank evaluates its share of the held-out images with its own
    assert final_eval(run_dir) == result

    capsys.readouterr()
    assert main(["evaluate", f"run_dir={run_dir}", "num_workers=0"]) == 0
    evaluated = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    scored = run_the_docs_snippet(run_dir, val, tmp_path / "snippet", monkeypatch)
    assert scored["accuracy"] == pytest.approx(evaluated["eval_acc"], abs=1e-9), evaluated
    assert scored["loss"] == pytest.approx(evaluated["eval_loss"], abs=1e-4), evaluated


def docs_snippet() -> str:
    """docs/vision.md's Python block that scores a validation folder with an exported file."""
    blocks = re.findall(r"```python\n(.*?)```", VISION_MD.read_text(), re.S)
    found = [b for b in blocks if "ImageFolder(" in b]
    assert len(found) == 1, "docs/vision.md: no single snippet scoring an ImageFolder"
    return found[0]


def run_the_docs_snippet(run_dir, val, work, monkeypatch) -> dict:
    """The snippet as written, in a folder holding the names it uses: the export and the
    validation images. -> {"accuracy", "loss"} from its printed line."""
    code = docs_snippet()
    exported = re.search(r'load_file\("([^"]+)"\)', code).group(1)
    folder = re.search(r'ImageFolder\("([^"]+)"', code).group(1)
    work.mkdir()
    export_model(run_dir, work / exported)
    os.symlink(val, work / folder)
    monkeypatch.chdir(work)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code, str(VISION_MD), "exec"), {"__name__": "snippet"})
    line = printed.getvalue().strip().splitlines()[-1]
    found = re.fullmatch(r"accuracy ([0-9.e-]+), loss ([0-9.]+)", line)
    assert found, line
    return {"accuracy": float(found.group(1)), "loss": float(found.group(2))}


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
    ours = {"dataset": str(packed[0]), "run_dir": str(tmp_path / "run"), "image_size": "16"}
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
