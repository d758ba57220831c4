"""The generated training package (the default bake, workload=all): its layout, the tests of its
shared training part pass, and the commands a user runs first work (a config error's status,
the benchmark prints its JSON line). The README's first example runs in the language bake
(tests/test_bake_language.py)."""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import pytest
from conftest import assert_generated_suite_passes, package_env, run
from workload_bakes import part_tests


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
            *("generate", "keys", "make_dataset", "plan", "plot", "train", "train_tokenizer"),
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
        "training": {"__init__", "baselines", "build", "epochs", "loop", "plan", "start", "step"},
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


@pytest.mark.timeout(1600)  # above the run's own limit below
def test_generated_test_suite_passes(repo, post_gen_hook):
    """The tests of the three training parts (the shared training code, language, images) and the
    layout test, in the bake of all workloads: each generated test runs in one bake only. The
    tests every bake shares (the doctor, the launcher, the lock, the linter) run in the program
    bake (tests/test_bake_program.py); the language and images bakes hold the same files as here
    and prove that they are complete: every test file collects and their layout and config
    tests pass (tests/test_bake_language.py, test_bake_images.py). One suite, not three: each
    costs its workers' start and its session fixtures again."""
    parts = [part_tests(repo, post_gen_hook, part) for part in ("training", "language", "images")]
    assert "tests/test_train.py" in parts[0] and "tests/test_gpt.py" in parts[1]
    assert "tests/test_vision.py" in parts[2] and "tests/test_doctor.py" not in sum(parts, [])
    files = sorted([*sum(parts, []), "tests/test_layout.py"], key=heaviest_first)
    assert_generated_suite_passes(repo, *files, timeout=1500)


# The generated files that take longest (`--durations=0` in a default bake, summed per file:
# 92, 79, 67, 51, 34, 24, 22, 16, 15 and 14 s of the 563 s): handed out first, so that no worker
# ends the suite alone with one of them (xdist's loadfile gives out files in the order given).
HEAVIEST = (
    *("test_resume", "test_vision_resume", "test_run_integrity", "test_lora", "test_hf_model"),
    *("test_evaluate_tokens", "test_hf_data", "test_gpt", "test_chat", "test_evaluate"),
)


def heaviest_first(path: str) -> int:
    name = Path(path).stem
    return HEAVIEST.index(name) if name in HEAVIEST else len(HEAVIEST)


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
