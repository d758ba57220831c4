"""Augmentation you choose (data/augmentation.py), on the images kind's synthetic images (16
pixels): each row of docs/vision.md's "what to start from" table, and each crop and policy, gives
the same micro-batches with 0 and 2 loader processes (what an exact resume rests on) and changes
the images; mixup, cutmix and label smoothing give class probabilities the loss reads as
F.cross_entropy's own label smoothing does; the evaluation's crop and interpolation reach the
export's fields; and the page's own transform, copied from it, trains. The kill -9 resume of a
run with the long-run photo recipe is test_vision_resume.py's DDP case."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import REPO, TIMEOUT_S, clean_env, one_line

pytest.importorskip("torchvision", reason="needs the [vision] extra: pip install -e '.[vision]'")

from {{ cookiecutter.package_name }}.cli import main, raised_in_a_worker  # noqa: E402
from {{ cookiecutter.package_name }}.config.settings import load_config  # noqa: E402
from {{ cookiecutter.package_name }}.data import augmentation, batches, kinds  # noqa: E402
from {{ cookiecutter.package_name }}.data.directory import DatasetError  # noqa: E402
from {{ cookiecutter.package_name }}.data.preprocessing import export_fields  # noqa: E402
from {{ cookiecutter.package_name }}.models import spec, spec_of  # noqa: E402

VISION_MD = REPO / "docs" / "vision.md"
SMALL = [
    "device=cpu",
    "model=vision",
    "vision_model=resnet18",
    "dataset=synthetic",
    "image_size=16",
    "synthetic_samples=24",
    "eval_samples=8",
    "num_classes=4",
    "batch_size=4",
    "seed=3",
]


def docs_presets() -> dict[str, list[str]]:
    """docs/vision.md's table of what to start from: its rows' key=value words."""
    text = VISION_MD.read_text().split("What to start from", 1)[1].split("\n\n", 2)[1]
    rows = re.findall(r"^\| (.+?) \| (?:`(.+)`|the defaults) \|$", text, re.M)
    assert len(rows) >= 5, text
    return {name: words.split() for name, words in rows}


PRESETS = {**docs_presets(), "center crop": ["train_crop=center"], "no crop": ["train_crop=none"]}
PRESETS |= {policy: [f"auto_augment={policy}"] for policy in augmentation.POLICIES[1:]}


def opened(*extra: str):
    cfg = load_config(None, [*SMALL, *extra]).config
    return cfg, kinds.open_splits(cfg, spec_of(cfg))


def stream(data, cfg, workers: int) -> list:
    step_batches = batches.StepBatches(data, cfg, 0, 1, 0, 0)
    return list(batches.micro_batches(step_batches, 8, workers, pin=False))  # 32: over an epoch


def test_the_defaults_are_the_classic_recipe():
    _, data = opened()
    steps = data.train.transform.transforms
    names = ["RandomResizedCrop", "RandomHorizontalFlip", "PILToTensor", "ToDtype", "Normalize"]
    assert [type(step).__name__ for step in steps] == names
    assert steps[0].scale == (0.08, 1.0) and steps[1].p == 0.5
    assert data.notes == (
        "training augmentation: random resized crop (keeps 0.08 to 1 of the area), "
        "horizontal flip 0.5"
    )
    assert data.train.mix is None  # plain labels: nothing mixes the batches
    words = ["train_crop=none", "crop_scale=0.5", "random_erase=0.2", "auto_augment=randaugment"]
    _, whole = opened(*words)
    assert whole.notes == (  # in the order they act
        "training augmentation: the whole image resized (crop_scale not read), horizontal flip "
        "0.5, randaugment, random erasing 0.2"
    )


@pytest.mark.parametrize("words", PRESETS.values(), ids=PRESETS.keys())
def test_each_preset_reads_the_same_batches_with_any_loader_processes(words):
    cfg, data = opened(*words)
    alone, pooled = stream(data, cfg, 0), stream(data, cfg, 2)
    for (x0, y0), (x2, y2) in zip(alone, pooled, strict=True):
        assert torch.equal(x0, x2) and torch.equal(y0, y2)
    assert all(x.shape == (4, 3, 16, 16) and x.dtype == torch.float32 for x, _ in alone)
    if words:  # the preset changes what the model sees
        plain_cfg, plain = opened()
        assert not torch.equal(alone[0][0], stream(plain, plain_cfg, 0)[0][0])
    mixes = any(w.startswith(("mixup", "cutmix", "label_smoothing")) for w in words)
    targets = alone[0][1]
    assert targets.dtype == (torch.float32 if mixes else torch.int64)
    if mixes:  # class probabilities
        assert targets.shape == (4, 4) and torch.allclose(targets.sum(1), torch.ones(4))


def test_label_smoothing_is_cross_entropys_own():
    cfg, data = opened("label_smoothing=0.1")
    images, targets = data.train.mix((torch.zeros(3, 3, 16, 16), torch.tensor([0, 3, 1])))
    assert torch.allclose(targets[1], torch.tensor([0.025, 0.025, 0.025, 0.925]))
    logits = torch.randn(3, 4)
    ours = spec.cross_entropy(logits, targets, "sum")
    theirs = F.cross_entropy(logits, torch.tensor([0, 3, 1]), reduction="sum", label_smoothing=0.1)
    assert torch.allclose(ours, theirs) and spec.scored(targets).item() == 3


def test_mixup_and_cutmix_pair_each_image_with_the_next():
    cfg, data = opened("mixup=0.4", "cutmix=1.0")
    labels = torch.tensor([0, 1, 2, 3])
    chosen = set()
    for step in range(12):
        with batches.seeded(cfg.seed, "mix", step, 0, 0):
            images = torch.rand(4, 3, 16, 16)
            mixed, targets = data.train.mix((images, labels))
        share = targets[torch.arange(4), labels]  # each image's own label keeps `share`
        assert torch.allclose(targets[torch.arange(4), labels.roll(1)], 1 - share)
        blended = torch.allclose(mixed, share[:, None, None, None] * images + (1 - share)[
            :, None, None, None] * images.roll(1, 0), atol=1e-6)  # fmt: skip
        chosen.add("mixup" if blended else "cutmix")
    assert chosen == {"mixup", "cutmix"}  # one of the two per batch


def test_the_evaluation_crop_and_interpolation_reach_the_export():
    _, data = opened("eval_crop_fraction=1.0", "interpolation=bicubic")
    fields = export_fields(data.info.details)
    assert (fields["image_size"], fields["resize_size"], fields["interpolation"]) == (
        "16", "16", "bicubic",
    )  # fmt: skip
    image, _ = data.val[0]
    assert image.shape == (3, 16, 16)


@pytest.mark.parametrize(
    "word, message",
    [("eval_crop_fraction=0.1", "'eval_crop_fraction' must be 0 (the model's) or 0.25 to 1"),
     ("auto_augment=augmix", "'auto_augment' must be one of none, trivialaugment, randaugment"),
     ("crop_scale=0", "'crop_scale' must be in (0, 1]"),
     ("label_smoothing=1", "'label_smoothing' must be in [0, 1)"),
     ("mixup=1e-30", "'mixup' must be 0 (off) or at least 0.01: 1e-30 (torch's Beta sampler"),
     ("cutmix=0.001", "'cutmix' must be 0 (off) or at least 0.01: 0.001")],
)  # fmt: skip
def test_a_wrong_value_is_one_line(word, message, single_process, capsys):
    assert main(["train", *SMALL, word]) == 2
    assert message in one_line(capsys)


def own_transform_code() -> str:
    """docs/vision.md's "Your own transform" block, as written."""
    section = VISION_MD.read_text().split("### Your own transform", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_pages_own_transform_trains(monkeypatch, single_process, tmp_path, capfd):
    """The page's function in data/augmentation.py's place: every sample is its output (a
    quarter turn of the crop, mirrored or not), the same with 2 loader processes, and a run
    trains on it and says so."""
    namespace = vars(augmentation).copy()
    exec(compile(own_transform_code(), str(VISION_MD), "exec"), namespace)
    for name in ("QuarterTurns", "own_train_transform"):  # as if pasted into the module
        monkeypatch.setattr(augmentation, name, namespace[name], raising=False)
    cfg, data = opened()
    assert data.notes == "training augmentation: your own transform (data/augmentation.py)"
    _, flips_set = opened("hflip=0", "mixup=0.2")  # the keys it replaces, named; mixup applies
    assert flips_set.notes == (
        "training augmentation: your own transform (data/augmentation.py; hflip not read), "
        "mixup alpha 0.2"
    )
    alone, pooled = stream(data, cfg, 0), stream(data, cfg, 2)
    assert all(torch.equal(a[0], b[0]) for a, b in zip(alone, pooled, strict=True))
    # a sample is the page's crop of the image, turned and mirrored by its own draws
    index = int(batches.StepBatches(data, cfg, 0, 1, 0, 0).samples(0, 0)[0][0])
    with batches.seeded(cfg.seed, 0, index):
        expected = data.train[index][0]
    assert torch.equal(alone[0][0][0], expected)
    turns = namespace["QuarterTurns"]()
    seen = {tuple(turns(torch.arange(4.0).view(1, 2, 2)).flatten().tolist()) for _ in range(64)}
    assert len(seen) == 8  # the eight orientations of a square

    run_dir = tmp_path / "run"
    argv = [*SMALL, "num_workers=2", "max_steps=3", "log_every=1", "eval_every=3"]
    argv += ["eval_batches=1", "checkpoint_every=0", "async_checkpoint=false"]
    assert main(["train", *argv, f"run_dir={run_dir}"]) == 0
    assert "training augmentation: your own transform" in capfd.readouterr().err
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    assert [r["step"] for r in map(json.loads, lines) if r["kind"] == "train"] == [1, 2, 3]


def test_the_plain_loop_mixes_its_batches_as_the_run_does():
    from {{ cookiecutter.package_name }}.data.plain_loader import plain_collate

    _, data = opened("cutmix=1.0")
    collate = plain_collate(data)
    samples = [data.train[i] for i in range(4)]
    images, targets = collate(samples)
    assert images.shape == (4, 3, 16, 16) and targets.shape == (4, 4)
    assert np.allclose(targets.sum(1).numpy(), 1)


class Shrunk(torch.nn.Module):  # a user's transform of the wrong size (a class: it pickles)
    def forward(self, image):
        return torch.zeros(3, 8, 8)


class Raises(torch.nn.Module):  # a user's transform with a bug
    def forward(self, image):
        raise ValueError("my transform's bug")


@pytest.mark.parametrize(
    "returned, expected",
    [(lambda pre: Shrunk(), "own_train_transform gave a torch.float32 tensor (3, 8, 8), not a "
      "float32 tensor (3, 16, 16) (image_size)"),
     (lambda pre: augmentation.transforms_v2().Resize((16, 16)), "gave a Image, not a float32"),
     (lambda pre: lambda image: image, "own_train_transform's transform cannot be pickled"),
     (lambda pre: Raises(), "own_train_transform's transform raised ValueError at "
      "test_augmentation.py:"),
     (lambda pre: pre.missing, "own_train_transform(pre) raised AttributeError at "
      "test_augmentation.py:")],
    ids=["wrong size", "no tensor", "a lambda", "raises on a sample", "raises when made"],
)  # fmt: skip
def test_an_own_transform_that_returns_the_wrong_thing_is_one_line(
    returned, expected, monkeypatch, cli, tmp_path
):
    """...and leaves no run directory behind."""
    monkeypatch.setattr(augmentation, "own_train_transform", returned)
    done = cli("train", *SMALL, "max_steps=1", f"run_dir={tmp_path / 'run'}")
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert expected in done.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "run").exists()


class Broken(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 2

    def __getitem__(self, index: int):
        raise DatasetError(f"shard.bin: image {index} no longer decodes")


def test_an_error_in_a_loader_process_is_its_own_line():
    """torch raises a loader process's error again in the training process, with the process's
    traceback as its message: the command's line is the original message alone."""
    with pytest.raises(DatasetError) as caught:
        next(iter(torch.utils.data.DataLoader(Broken(), num_workers=1)))
    assert "Original Traceback" in str(caught.value)
    assert raised_in_a_worker(caught.value) == "shard.bin: image 0 no longer decodes"


# A run whose transform fails in a loader process (as a shard cut short or a record that no
# longer decodes does): each process notes its pid and the time, then raises.
FAILS_IN_A_LOADER = """
import os, sys, time, torch
from {{ cookiecutter.package_name }}.cli import main
from {{ cookiecutter.package_name }}.data import augmentation

class FailsInALoader(torch.nn.Module):
    def forward(self, image):
        if torch.utils.data.get_worker_info() is None:  # the start's check passes
            return torch.zeros(3, 16, 16)
        with open(os.path.join(sys.argv[1], str(os.getpid())), "w") as note:
            note.write(str(time.time()))
        raise OSError("shard-00001.bin: image 7 no longer decodes")

augmentation.own_train_transform = lambda pre: FailsInALoader()
sys.exit(main(sys.argv[2:]))
"""


def running(pid: int) -> bool:
    """Whether process `pid` exists and is not a zombie (Linux)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_an_error_in_a_loader_process_ends_the_run_and_its_loader_processes(tmp_path):
    """The loader processes ignore SIGTERM (so that a signal to every process of a task reaches
    the training process alone): the run ends them itself, and exits within seconds of the
    error with its one line, instead of waiting for them until the job's time limit."""
    notes = tmp_path / "pids"
    notes.mkdir()
    argv = [*SMALL, "num_workers=2", "max_steps=20", "checkpoint_every=0"]
    command = [sys.executable, "-c", FAILS_IN_A_LOADER, notes, "train", *argv]
    run = subprocess.Popen(
        [*command, f"run_dir={tmp_path / 'run'}"], env=clean_env(), stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        err = run.communicate(timeout=TIMEOUT_S)[1]
    except subprocess.TimeoutExpired:
        run.kill()
        pytest.fail("the run did not end after the error in its loader process")
    ended = time.time()
    assert run.returncode == 2, err[-3000:]
    last = err.strip().splitlines()[-1]
    assert "Traceback" not in err and "transform raised OSError at <string>:" in last, err
    assert last.endswith("shard-00001.bin: image 7 no longer decodes")
    pids = {int(note.name): float(note.read_text()) for note in notes.iterdir()}
    assert pids and ended - min(pids.values()) < 20  # seconds, not the time limit
    assert not [pid for pid in pids if running(pid)]
