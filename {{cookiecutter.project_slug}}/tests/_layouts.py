"""The same losses under HSDP, FSDP and DDP (tests/test_resume.py on conftest.py's TINY,
tests/test_language_runs.py on the tiny GPT): 4 CPU ranks build a run with the package's
build() and step it with its train_step() under each layout in turn, in one process group (one
start of 4 interpreters, not 3). A rank is `python tests/_layouts.py OUT KEY=VALUE...`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, TIMEOUT_S, free_port, rank_env

LAYOUTS = {"hsdp": ["hsdp_shard=2"], "fsdp": [], "ddp": []}
STEPS = 20


def train_layouts(out: Path, argv: list[str]) -> None:
    """One rank: its losses under each layout to OUT/rank<r>.json."""
    from {{ cookiecutter.package_name }} import distributed
    from {{ cookiecutter.package_name }}.config.settings import load_config
    from {{ cookiecutter.package_name }}.training.build import build, input_pipeline
    from {{ cookiecutter.package_name }}.training.step import train_step

    losses = {}
    with distributed.process_group(60, 1, "cpu") as (env, device):
        for layout, keys in LAYOUTS.items():
            overrides = [f"max_steps={STEPS}", f"parallelism={layout}", *keys]
            cfg = load_config(None, [*argv, *overrides]).config
            run = build(cfg, env, device)
            _, inputs = input_pipeline(run, cfg.max_steps)
            try:
                losses[layout] = [float(train_step(run, inputs)) for _ in range(cfg.max_steps)]
            finally:
                inputs.close()
    (out / f"rank{env.rank}.json").write_text(json.dumps(losses))


def losses_per_layout(argv: list[str], out: Path) -> tuple[list[dict], str]:
    """4 ranks of train_layouts: each rank's {layout: losses}, and rank 0's output."""
    port = free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, str(out), *argv],
            cwd=REPO,
            env=rank_env(rank, 4, port),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in range(4)
    ]
    outputs = [p.communicate(timeout=TIMEOUT_S)[0] for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, outputs[0][-3000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(4)], outputs[0]


def assert_the_same_losses(ranks: list[dict]) -> None:
    """HSDP (2 groups of 2), FSDP over all 4 and DDP differ only in the order of the gradients'
    reduction: each rank's loss, step by step, within 1e-5."""
    for rank, losses in enumerate(ranks):
        assert len(losses["hsdp"]) == STEPS
        for layout in ("fsdp", "ddp"):
            assert losses[layout] == pytest.approx(losses["hsdp"], abs=1e-5), (rank, layout)


if __name__ == "__main__":
    train_layouts(Path(sys.argv[1]), sys.argv[2:])
