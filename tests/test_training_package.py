"""The generated training package: its own test suite passes, and the commands a user runs
first work (train with the default config, benchmark prints its JSON line)."""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import pytest
from conftest import assert_generated_suite_passes, package_env, run


@pytest.fixture(scope="module")
def repo(bake) -> Path:
    return bake("default")


@pytest.fixture(scope="module")
def package(repo) -> str:
    (name,) = [p.name for p in (repo / "src").iterdir() if (p / "__init__.py").exists()]
    return name


def test_package_layout(repo, package):
    src = repo / "src" / package
    modules = {"__init__", "__main__", "cli", "config_keys", "distributed", "optim", "parallel"}
    assert {p.stem for p in src.glob("*.py")} == modules
    packages = {
        "checkpoint": {
            "__init__",
            "adapters",
            "export",
            "export_hf",
            "export_peft",
            "hf_format",
            "initial",
            "initial_hf",
            "integrity",
            "lora",
            "manager",
            "start",
            "state",
        },
        "commands": {
            *("__init__", "arguments", "benchmark", "compare", "doctor", "evaluate", "export"),
            *("generate", "keys", "make_dataset", "plot", "train", "train_tokenizer"),
        },
        "config": {"__init__", "files", "resume", "settings"},
        "data": {
            "__init__",
            "arrays",
            "augmentation",
            "batches",
            "chat",
            "directory",
            "images",
            "info",
            "kinds",
            "plain_loader",
            "prefetch",
            "preprocessing",
            "recorded_tokenizer",
            "tokenizer",
            "tokens",
            "windows",
        },
        "doctor": {"__init__", "bandwidth", "checks", "nodes", "preflight", "storage", "vision"},
        "make_dataset": {
            *("__init__", "arrays", "benchmark", "chat", "chat_template", "chat_worker"),
            *("hf_datasets", "image_check", "images", "sources", "text_files", "tokenizer"),
            "tokens",
        },
        "models": {"__init__", "spec", "gpt", "gpt_hf", "hf", "lora", "mlp", "vision", "timm"},
        "run": {
            *("__init__", "atomic", "interrupts", "lock", "preemption", "program", "rundir"),
            "torchrun",
        },
        "telemetry": {
            *("__init__", "compare", "console", "health", "metrics", "profiling", "timing"),
            "tracking",
        },
        "training": {"__init__", "baselines", "build", "epochs", "loop", "start", "step"},
    }
    folders = {p.name for p in src.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders == set(packages)
    for name, members in packages.items():
        assert {p.stem for p in (src / name).glob("*.py")} == members
    assert (repo / "configs" / "default.toml").is_file()
    assert (repo / "configs" / "tiny.toml").is_file()
    assert (repo / "docs" / "training.md").is_file()


def test_only_the_registry_and_the_gpt_module_know_the_gpt_by_name(repo, package):
    """The loop, data, metrics, benchmark, CLI and generate ask the model's spec."""
    src = repo / "src" / package
    naming = {str(p.relative_to(src)) for p in src.rglob("*.py") if '"gpt"' in p.read_text()}
    # and ShareGPT's name for the assistant's role, read by make-dataset --chat
    assert naming == {"models/__init__.py", "models/gpt.py", "make_dataset/chat.py"}


def test_every_module_of_the_package_stays_short(repo, package):
    """Read in one sitting: no module of the package (models/ and checkpoint/ included) is
    over 450 lines."""
    src = repo / "src" / package
    paths = list(src.rglob("*.py"))
    assert len(paths) > 30
    long = {
        str(p.relative_to(src)): n for p in paths if (n := len(p.read_text().splitlines())) > 450
    }
    assert not long, f"modules over 450 lines: {long}"


def test_the_docs_list_every_key_of_the_shipped_models(repo, package):
    """The generated test accepts a docs table without a user's own model; the template ships
    its table whole: exactly what `keys` prints."""
    keys = run([sys.executable, "-m", package, "keys"], cwd=repo, env=package_env(repo)).stdout
    docs = (repo / "docs" / "training.md").read_text()
    begin = "<!-- config keys: python tests/test_config.py rewrites this table -->"
    assert docs.split(begin, 1)[1].split("<!-- end -->", 1)[0].strip() == keys.strip()


def every_bakes_tests(repo: Path, post_gen_hook) -> list[str]:
    """The generated test files every workload keeps (the hook's table: in no part), but
    test_layout.py, which differs by workload: tests/test_bake_program.py runs them in the
    program bake, where they are the whole suite."""
    in_parts = {p for paths in post_gen_hook.WORKLOAD_PARTS.values() for p in paths}
    return sorted(
        f"tests/{p.name}"
        for p in (repo / "tests").glob("test_*.py")
        if f"tests/{p.stem}.py" not in in_parts and p.name != "test_layout.py"
    )


@pytest.mark.timeout(1600)  # above the run's own limit below
def test_generated_test_suite_passes(repo, post_gen_hook):
    shared = every_bakes_tests(repo, post_gen_hook)
    assert "tests/test_doctor.py" in shared and "tests/test_train.py" not in shared
    # 6 minutes on an idle 2-core machine where one process took 9.5 (552 passed in one
    # process when this changed). The tests every bake shares (the doctor, the launcher, the
    # lock, the linter) run in the program bake only. With two CPU hogs beside the whole
    # template suite it passed 600 s in one process
    assert_generated_suite_passes(repo, *(f"--ignore={path}" for path in shared), timeout=1500)


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


def test_config_error_exit_status(repo, package):
    proc = run(
        [sys.executable, "-m", package, "--config", "configs/default.toml", "lr=fast"],
        cwd=repo,
        env=package_env(repo),
        timeout=120,
        check=False,
    )
    assert proc.returncode == 2 and "'lr'" in proc.stderr


def test_benchmark_prints_one_json_line(repo, package):
    proc = run(
        [
            sys.executable,
            "-m",
            package,
            "benchmark",
            "--config",
            "configs/tiny.toml",
            "bench_warmup=3",
            "bench_steps=20",
        ],
        cwd=repo,
        env=package_env(repo),
        timeout=300,
    )
    (line,) = proc.stdout.strip().splitlines()
    result = json.loads(line)
    assert result["steps"] == 20 and result["world_size"] == 1
    assert result["train_step_median_s"] > 0 and result["bare_step_median_s"] > 0
    # two rounds of 10-step blocks: the median of the rounds' ratios (CPU time on a CPU)
    train, bare = result["blocks"]["train"], result["blocks"]["bare"]
    ratios = [t / b for t, b in zip(train, bare, strict=True)]
    assert len(ratios) == 2 and result["ratio"] == pytest.approx(statistics.median(ratios))
    # The overhead ratio itself is measured and reported in docs/training.md rather than
    # asserted here: on a shared 2-core CI machine the noise is larger than the overhead.
