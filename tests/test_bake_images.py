"""The `images` bake (workload=images): torchvision and timm classifiers, image datasets and
augmentation, and `program`'s parts; no language-model module and none of transformers, peft,
datasets or tokenizers. It is complete (tests/workload_bakes.py: every test file collects, its
layout test passes; its image tests run in the default bake's suite, which holds the same files),
and docs/vision.md's commands, packing an
ImageFolder and training a ResNet locally on the CPU, run as written."""

from __future__ import annotations

import json
import re
import shlex
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import package_env, run
from PIL import Image
from workload_bakes import check_complete, part_tests

LANGUAGE_LIBRARIES = ("transformers", "peft", "datasets", "tokenizers")


@pytest.fixture(scope="module")
def repo(bake) -> Path:
    return bake("images")


@pytest.fixture(scope="module")
def package(repo) -> str:
    return repo.name.replace("-", "_")


def test_the_bake_is_complete_without_language_code(repo, package, post_gen_hook, tmp_path):
    tests = part_tests(repo, post_gen_hook, "images")
    assert "tests/test_vision.py" in tests and not (repo / "tests" / "test_gpt.py").exists()
    commands = check_complete(
        repo,
        tmp_path=tmp_path,
        absent=LANGUAGE_LIBRARIES,
        unsaid=("gpt", "GPT", "preset", "token", "LoRA", "hf_model", "--stdlib", "--hf", "chat"),
    )
    assert commands == [
        *("train", "benchmark", "doctor", "make-dataset", "evaluate", "export", "plot"),
        *("compare", "keys", "plan"),
    ]
    keys = run([sys.executable, "-m", package, "keys"], cwd=repo, env=package_env(repo)).stdout
    assert '| `"vision"` | mlp, vision, timm |' in keys
    language = ("preset", "lora_rank", "hf_model", "vocab", "token", "window", "Hugging Face")
    assert not [word for word in language if word in keys], keys
    assert not (repo / "docs" / "finetune.md").exists()


def vision_commands(repo: Path, package: str) -> list[list[str]]:
    """docs/vision.md's `python -m <pkg> make-dataset --images` and its first training command
    run locally (`device=cpu`), each as the words a shell would pass."""
    text = (repo / "docs" / "vision.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", text, re.DOTALL)
    lines = [" ".join(b.replace("\\\n", " ").split()) for b in blocks]
    make = next(line for line in lines if f"{package} make-dataset --images" in line)
    train = next(line for line in lines if "device=cpu" in line and "make-dataset" not in line)
    return [shlex.split(make), shlex.split(train)]


def test_docs_vision_packs_images_and_trains_a_resnet_on_the_cpu(repo, package, tmp_path):
    make, train = vision_commands(repo, package)
    assert make[:4] == ["python", "-m", package, "make-dataset"] and "--out" in make
    assert train[:3] == ["python", "-m", package] and "vision_model=resnet18" in train
    photos = tmp_path / "photos"  # an ImageFolder: 2 classes, 24 noise images each
    rng = np.random.default_rng(0)
    for label in ("cat", "dog"):
        (photos / label).mkdir(parents=True)
        for i in range(24):
            pixels = rng.integers(0, 256, (40, 48, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(photos / label / f"{i:02d}.png")
    data = tmp_path / "data" / "photos"
    make[make.index("--images") + 1] = str(photos)
    make[make.index("--out") + 1] = str(data)
    env = package_env(repo)
    made = run([sys.executable, *make[1:]], cwd=repo, env=env, timeout=300)
    assert (data / "index.json").is_file(), made.stdout
    # the docs' command as written, on this folder; epochs=5 of 43 training images at 32 a step
    run_dir = tmp_path / "runs" / "photos"
    words = [w for w in train[1:] if not w.startswith(("dataset=", "run_dir="))]
    trained = run(
        [sys.executable, *words, f"dataset={data}", f"run_dir={run_dir}"],
        cwd=repo,
        env=env,
        timeout=600,
    )
    assert re.search(r"training finished at step \d+", trained.stderr), trained.stderr[-3000:]
    records = [json.loads(r) for r in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert sum(r["kind"] == "eval" for r in records) == 5  # eval_every=1epoch
    assert "vision:resnet18" in trained.stderr
