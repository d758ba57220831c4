"""A user's own model in one file and one line (docs/your-model.md of the generated repo).

The model file and the registry line are copied out of the docs page itself, into a copy of a
baked repository; no other file of the package is touched. In the default bake the page's
language model then trains with DDP and with FSDP on two CPU ranks (torchrun), resumes
bit-exactly, refuses a changed key of its own, exports, and generates text. The images bake's page
adds an image classifier instead: its own commands, shrunk, train it, resume it bit-exactly,
evaluate and export it in one interpreter (the two-rank runs are the default bake's to prove).
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import sys
from pathlib import Path

import pytest
import torch
from conftest import package_env, run
from user_code import add_from_docs

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
    in_one_interpreter(repo, package, [["export", f"run_dir={run_dir}", "--out", "first.pt"]])

    # The newest checkpoint gone, the same run continues from step 2 with DDP (the checkpoint
    # reshards) and ends with the weights it had.
    shutil.rmtree(run_dir / "checkpoints" / "step-00000004")
    ddp = torchrun(repo, package, *ARGS, f"run_dir={run_dir}", "parallelism=ddp")
    assert "from checkpoint step 2" in ddp.stderr and "training finished at step 4" in ddp.stderr
    prompt = ["--prompt", "def ", "--tokens", "20", "--device", "cpu"]
    out, err, status = in_one_interpreter(
        repo,
        package,
        [
            ["export", f"run_dir={run_dir}", "--out", "resumed.pt"],
            # a changed key of the model on the existing run: one line, exit 2, before DCP
            [*ARGS, f"run_dir={run_dir}", "onelayer_width=64"],
            ["keys"],
            ["generate", f"run_dir={run_dir}", *prompt],
        ],
    )
    assert status == ["0", "2", "0", "0"], err[-3000:]
    first, resumed = (torch.load(repo / n, weights_only=True) for n in ("first.pt", "resumed.pt"))
    assert first.keys() == resumed.keys() and "blocks.0.qkv.weight" in first
    assert all(torch.equal(first[k], resumed[k]) for k in first), "resume is not bit-exact"

    changed = re.split(r"<<exit \d+>>\n", err)[1]
    (line,) = [line for line in changed.splitlines() if "error" in line.lower()]
    assert "onelayer_width: 32 -> 64" in line and "new run_dir" in line
    assert "Traceback" not in changed and "mismatch" not in changed.lower()

    # its keys are listed by `keys`, and the repo's own config tests pass untouched (the docs
    # table of keys once failed them until regenerated)
    keys, sampled = re.split(r"<<exit \d+>>\n", out)[2:4]
    assert "| `onelayer_width` |" in keys
    own = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0"]
    run([*own, "tests/test_config.py"], cwd=repo, env=package_env(repo), timeout=300)
    assert sampled.startswith("def ") and len(sampled) > 10


def in_one_interpreter(repo: Path, package: str, steps: list) -> tuple[str, str, list[str]]:
    """DRIVER's steps in the repo: (stdout, stderr, each step's exit status)."""
    done = run(
        [sys.executable, "-c", DRIVER, package, json.dumps(steps)],
        cwd=repo,
        env=package_env(repo),
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    return done.stdout, done.stderr, re.findall(r"<<exit (\d+)>>\n", done.stderr)


# The images bake's page, docs/your-model.md: its training command (synthetic images from
# configs/tiny.toml), then the same command again (the resume), its evaluate and its export, run
# as its words say in a copy of the bake, with these keys added: a few steps on tiny images.
SHRUNK = [
    *("max_steps=4", "checkpoint_every=2", "async_checkpoint=false", "batch_size=4"),
    *("synthetic_samples=32", "eval_samples=8", "image_size=16"),
]

# Runs each step in one interpreter, from the repo copy: a list is `python -m <package> ARGS`
# (the package's cli.main, as the generated conftest's `cli` fixture calls it), a string is
# Python run in one shared namespace; a marker with the step's exit status ends each step's output.
DRIVER = """
import importlib, json, sys
main = importlib.import_module(sys.argv[1] + ".cli").main
namespace = {}
for step in json.loads(sys.argv[2]):
    status = main(step) if isinstance(step, list) else exec(step, namespace)
    for stream in (sys.stdout, sys.stderr):
        print(f"<<exit {status or 0}>>", file=stream, flush=True)
"""


def page_commands(text: str, package: str) -> dict[str, list[str]]:
    """The page's `python -m <package>` command lines (`\\` joined), as the argument lists the
    package gets: "train" (the one without `dataset=`), "evaluate", "export"."""
    blocks = re.findall(r"```bash\n(.*?)```", text, re.DOTALL)
    lines = [line for b in blocks for line in b.replace("\\\n", " ").splitlines()]
    found = {}
    for words in (shlex.split(line) for line in lines if line.startswith("python -m ")):
        if words[2] == package and not any(w.startswith("dataset=") for w in words):
            found.setdefault("train" if words[3].startswith("--") else words[3], words[3:])
    return found


@pytest.fixture(scope="module")
def image_repo(bake, tmp_path_factory) -> tuple[Path, str]:
    """A copy of the images bake with its page's model file and registry line added."""
    repo = tmp_path_factory.mktemp("own-image-model") / "repo"
    return repo, add_from_docs(
        bake("images"), repo, "your-model.md", "models/smallcnn.py", "models/__init__.py", '"mlp",'
    )


def test_an_image_model_in_one_file_trains_resumes_evaluates_and_exports(image_repo):
    repo, package = image_repo
    page = (repo / "docs" / "your-model.md").read_text()
    commands = page_commands(page, package)
    train = [*commands["train"], *SHRUNK]
    assert "model=smallcnn" in train and "run_dir=runs/smallcnn" in train
    (export_out,) = [w for w in commands["export"] if w.endswith(".pt")]
    reload = page.split("<!-- reload: smallcnn.pt -->", 1)[1].split("```python\n", 1)[1]
    steps = [
        train,
        ["export", "run_dir=runs/smallcnn", "--out", "uninterrupted.pt"],
        "import shutil; shutil.rmtree('runs/smallcnn/checkpoints/step-00000004')",
        train,  # the same command continues from step 2
        commands["evaluate"],
        commands["export"],
        [*train, "smallcnn_width=64"],  # a changed key of the model: refused
        reload.split("```", 1)[0],  # the page's code, reading the export back into SmallCNN
        "first = torch.load('uninterrupted.pt', weights_only=True)\n"
        "assert first.keys() == model.state_dict().keys() and 'head.weight' in first\n"
        "assert all(torch.equal(first[k], v) for k, v in model.state_dict().items()), 'resume'",
    ]
    stdout, stderr, status = in_one_interpreter(repo, package, steps)
    assert status == ["0"] * 6 + ["2", "0", "0"], stderr[-6000:]
    err = re.split(r"<<exit \d+>>\n", stderr)
    out = re.split(r"<<exit \d+>>\n", stdout)
    first, resumed, changed = err[0], err[3], err[6]
    assert "training the image classifier smallcnn" in first and "(dataset synthetic)" in first
    assert "training finished at step 4" in first
    assert "from checkpoint step 2" in resumed and "training finished at step 4" in resumed
    scores = json.loads(out[4].strip().splitlines()[-1])
    assert scores["scored_images"] == 8 and 0 <= scores["eval_acc"] <= 1
    assert (repo / export_out).is_file()
    (line,) = [line for line in changed.splitlines() if "error" in line.lower()]
    assert "smallcnn_width: 32 -> 64" in line and "Traceback" not in changed
