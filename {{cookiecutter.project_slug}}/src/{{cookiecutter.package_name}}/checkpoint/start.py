"""What a run's model starts from, decided in one call and each source opened once.

`open_start(cfg, spec, run_dir)`, before the run directory is touched and before any rank waits
in a collective, looks at the run directory and at the weights the config names:

- a run directory with a complete checkpoint resumes: its newest good checkpoint loads (the
  manager's `load_latest`), and nothing else is opened;
- a new run starts from weights where the config names some: `init_from` (a run directory, a
  Hugging Face directory or a weights file, initial.py) or the model's own (`model=hf`:
  hf_model's pretrained weights); else from the weights `build` makes;
- a run that trains adapters (adapters.py; LoRA's: models/lora.py) loads its frozen base,
  hf_model's, at every start, new or resumed: the checkpoints hold the adapters only, which then
  load over it.

`load_start` loads them in that order: the opened weights, then the checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..run.rundir import RunDir
from .adapters import trains_adapters
from .initial import WeightSource, initial_source, load_initial_weights, open_initial
from .integrity import complete_steps


@dataclass(frozen=True)
class Start:
    """resume: the run directory holds a complete checkpoint, and the newest good one loads.
    weights: opened weights the model gets before any checkpoint (a new run's initial weights,
        or a LoRA run's base); None: none.
    replaced: every weight `build` would make is replaced (by a checkpoint's or the opened
        ones): the model is built without them (parallel.parameters_on_meta)."""

    resume: bool
    weights: WeightSource | None
    replaced: bool


def open_start(cfg, spec, run_dir: str) -> Start:
    """The start of a run of `cfg` in `run_dir` ("": never a resume: evaluate hf_model=,
    benchmark), with the weights it needs opened (a source that is missing or broken: one
    line, initial.open_initial)."""
    resume = bool(run_dir) and bool(complete_steps(RunDir(run_dir).checkpoints))
    weights = None
    if not resume or trains_adapters(cfg):
        weights = open_initial(cfg, spec, run_dir)
    return Start(resume, weights, replaced=initial_source(cfg, spec) is not None)


def load_start(
    start: Start, model, spec, cfg, info, manager=None
) -> tuple[int | None, str | None, dict]:
    """Load the start into `model` (plain, DDP or FSDP2, each rank its part): the opened weights,
    then the newest good checkpoint of `manager` (a CheckpointManager; None: no checkpoints).
    Returns the checkpoint's step (None: a new run), what the opened weights were (None: none),
    and this rank's host memory figures of loading them (initial.load_initial_weights)."""
    loaded, memory = None, {}
    if start.weights is not None:
        loaded, memory = load_initial_weights(model, spec, cfg, info, start.weights)
    step = manager.load_latest() if manager is not None else None
    return step, loaded, memory
