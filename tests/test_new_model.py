"""A user's own model in one file and one line (docs/your-model.md of the generated repo).

The model file and the registry line are copied out of the docs page itself, into a copy of a
baked repository; no other file of the package is touched. The new model then trains with DDP
and with FSDP on two CPU ranks (torchrun), resumes bit-exactly, refuses a changed key of its own,
exports, and generates text.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
import torch
from conftest import package_env, run
from user_code import add_from_docs, python

ARGS = [  # as docs/your-model.md trains it, in small
    "--config",
    "configs/default.toml",
    "device=cpu",
    "model=onelayer",
    "onelayer_width=32",
    "onelayer_context=16",
    "vocab_size=256",
    "batch_size=4",
    "max_steps=4",
    "warmup_steps=1",
    "lr=0.01",
    "min_lr=0.001",
    "log_every=2",
    "eval_every=4",
    "eval_batches=1",
    "checkpoint_every=2",
    "async_checkpoint=false",
    "num_workers=0",
    "dist_timeout_s=60",
]


@pytest.fixture(scope="module")
def user_repo(bake, tmp_path_factory) -> tuple[Path, str]:
    """A copy of the default bake with the docs' model file and registry line added."""
    repo = tmp_path_factory.mktemp("own-model") / "repo"
    return repo, add_from_docs(
        bake("default"), repo, "your-model.md", "models/onelayer.py", "models/__init__.py", '"mlp",'
    )


def torchrun(repo: Path, package: str, *args: str):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    return run([*cmd, "-m", package, *args], cwd=repo, env=package_env(repo), timeout=300)


def test_a_model_in_one_file_trains_resumes_exports_and_generates(user_repo, tmp_path):
    repo, package = user_repo
    run_dir = tmp_path / "run"
    fsdp = torchrun(repo, package, *ARGS, f"run_dir={run_dir}", "parallelism=fsdp")
    assert "training finished at step 4" in fsdp.stderr
    python(repo, package, "export", f"run_dir={run_dir}", "--out", str(tmp_path / "first.pt"))

    # The newest checkpoint gone, the same run continues from step 2 with DDP (the checkpoint
    # reshards) and ends with the weights it had.
    shutil.rmtree(run_dir / "checkpoints" / "step-00000004")
    ddp = torchrun(repo, package, *ARGS, f"run_dir={run_dir}", "parallelism=ddp")
    assert "from checkpoint step 2" in ddp.stderr and "training finished at step 4" in ddp.stderr
    python(repo, package, "export", f"run_dir={run_dir}", "--out", str(tmp_path / "resumed.pt"))
    first, resumed = (
        torch.load(tmp_path / n, weights_only=True) for n in ("first.pt", "resumed.pt")
    )
    assert first.keys() == resumed.keys() and "blocks.0.qkv.weight" in first
    assert all(torch.equal(first[k], resumed[k]) for k in first), "resume is not bit-exact"

    # A changed key of the model on the existing run: one line, exit 2, before DCP reads it.
    changed = python(repo, package, *ARGS, f"run_dir={run_dir}", "onelayer_width=64", check=False)
    assert changed.returncode == 2, changed.stderr[-3000:]
    (line,) = [line for line in changed.stderr.splitlines() if "error" in line.lower()]
    assert "onelayer_width: 32 -> 64" in line and "new run_dir" in line
    assert "Traceback" not in changed.stderr and "mismatch" not in changed.stderr.lower()

    # its keys are listed by `keys`, and the repo's own config tests pass untouched (the docs
    # table of keys once failed them until regenerated)
    assert "| `onelayer_width` |" in python(repo, package, "keys").stdout
    own = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0"]
    run([*own, "tests/test_config.py"], cwd=repo, env=package_env(repo), timeout=300)

    prompt = ["--prompt", "def ", "--tokens", "20", "--device", "cpu"]
    sampled = python(repo, package, "generate", f"run_dir={run_dir}", *prompt)
    assert sampled.stdout.startswith("def ") and len(sampled.stdout) > 10
