"""Checkpoints through torch.distributed.checkpoint (DCP): every rank writes its own shards.

    <run_dir>/checkpoints/step-00000100/
        __0_0.distcp __1_0.distcp ...  each rank's share of the tensors (DCP)
        .metadata                      DCP's index: which bytes of which file hold what
        COMPLETE.json                  written last: every file with its size and sha256

- `state`      the parts a checkpoint holds: `ModelAndOptimizer`, `TrainState`, `RNGState`
               (any object with `state_dict()`/`load_state_dict()` works: a scheduler, a scaler)
- `manager`    `CheckpointManager`: save (sync or async), keep the newest few, resume
- `integrity`  when a checkpoint is trusted (COMPLETE.json lists exactly its files, checksums);
               `complete_checkpoints`: those of a run directory, newest first
- `export`     the model alone, in one process: `load_model_state`, `export_model`

On restart the newest checkpoint that passes its checks is loaded; a complete but damaged one
is skipped with a warning naming the file. A checkpoint written by N ranks loads with M ranks
(DCP reshards on load). When to save is `preemption.CheckpointSchedule`'s decision.
"""

from .export import export_model, git_commit, load_model_state, read_checkpoint
from .integrity import (
    MARKER,
    CheckpointError,
    complete_checkpoints,
    complete_steps,
    describe,
    file_record,
    is_complete,
    verify,
)
from .manager import CheckpointManager, SaveStats
from .state import ModelAndOptimizer, RNGState, TrainState, check_replicas

__all__ = [
    "MARKER",
    "CheckpointError",
    "CheckpointManager",
    "ModelAndOptimizer",
    "RNGState",
    "SaveStats",
    "TrainState",
    "check_replicas",
    "complete_checkpoints",
    "complete_steps",
    "describe",
    "export_model",
    "file_record",
    "git_commit",
    "is_complete",
    "load_model_state",
    "read_checkpoint",
    "verify",
]
