"""The `language` bake (workload=language): the GPT, Hugging Face causal LMs, LoRA, token and
chat data, tokenizers, their exports, and `program`'s parts; no image model. It is complete
(tests/workload_bakes.py: every test file collects, its layout test passes; its language tests
run in the default bake's suite, which holds the same files), and the README's first example
runs: the standard library as byte tokens, the tiny GPT, the same command again (resumes), then
text sampled from the checkpoint."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from conftest import package_env, run
from workload_bakes import check_complete, part_tests


@pytest.fixture(scope="module")
def repo(bake) -> Path:
    return bake("language")


@pytest.fixture(scope="module")
def package(repo) -> str:
    return repo.name.replace("-", "_")


def test_the_bake_is_complete_without_image_code(repo, package, post_gen_hook, tmp_path):
    tests = part_tests(repo, post_gen_hook, "language")
    assert "tests/test_gpt.py" in tests and not (repo / "tests" / "test_vision.py").exists()
    commands = check_complete(
        repo,
        tmp_path=tmp_path,
        absent=("torchvision", "timm"),
        unsaid=("torchvision", "timm", "ResNet", "image_size", "--images", "vision"),
    )
    assert commands == [
        *("train", "benchmark", "doctor", "make-dataset", "train-tokenizer", "generate"),
        *("evaluate", "export", "plot", "compare", "keys", "plan"),
    ]
    keys = run([sys.executable, "-m", package, "keys"], cwd=repo, env=package_env(repo)).stdout
    assert "| gpt, mlp, hf |" in keys and "vision_model" not in keys and "image_size" not in keys
    assert not (repo / "docs" / "vision.md").exists()


def test_first_example_prepare_data_train_resume_generate(repo, package, tmp_path):
    """The README's first example on CPU: the standard library as byte tokens, the tiny GPT,
    the same command again (resumes), then text sampled from the checkpoint."""
    data = tmp_path / "stdlib-bytes"
    env = package_env(repo)
    made = run(
        [sys.executable, "-m", package, "make-dataset", "--stdlib", "--out", str(data)],
        cwd=repo,
        env=env,
        timeout=300,
    )
    assert "training and" in made.stdout and (data / "index.json").is_file()
    run_dir = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        package,
        "--config",
        "configs/tiny.toml",
        f"dataset={data}",
        f"run_dir={run_dir}",
        "max_steps=20",
        "log_every=10",
        "checkpoint_every=10",
        "eval_every=20",
    ]
    first = run(cmd, cwd=repo, env=env, timeout=300)
    assert "training finished at step 20" in first.stderr
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir() if p.is_dir()) == [
        "step-00000010",
        "step-00000020",
    ]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["kind"] == "train"] == [1, 10, 20]  # the first at once
    assert [r["step"] for r in records if r["kind"] == "eval"] == [20]
    assert (run_dir / "config.toml").is_file() and not (run_dir / "REQUEUE").exists()

    again = run(cmd, cwd=repo, env=env, timeout=300)  # the same command resumes
    assert "RESUMING" in again.stderr and "from checkpoint step 20" in again.stderr

    sampled = run(
        [
            sys.executable,
            "-m",
            package,
            "generate",
            f"run_dir={run_dir}",
            "--prompt",
            "def ",
            "--tokens",
            "50",
            "--device",
            "cpu",
        ],
        cwd=repo,
        env=env,
        timeout=300,
    )
    assert sampled.stdout.startswith("def ") and len(sampled.stdout) > 20
