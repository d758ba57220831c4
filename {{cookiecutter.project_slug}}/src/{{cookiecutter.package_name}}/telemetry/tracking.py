"""Optional experiment trackers beside `metrics.jsonl`, which stays the source of truth.

`tracker = "none" | "tensorboard" | "wandb"`; the packages are extras of this project
(`pip install '{{ cookiecutter.project_slug }}[tensorboard]'` or `[wandb]`) and are imported only
when chosen. Each record written to metrics.jsonl ({"kind": "train", "step": 100, "loss": ...})
is logged as scalars named "<kind>/<field>" at its step, on rank 0 only.

Both survive a requeue or resume:
- TensorBoard writes to `<run_dir>/tensorboard`; a resumed run purges the events logged after
  the checkpoint it resumed from (they were lost with the job), so each step shows once.
- W&B keeps its run id in `<run_dir>/tracker.json` and resumes that run. Compute nodes have no
  internet, so it runs offline by default (WANDB_MODE, if set, wins); upload the offline runs
  from a login node with `wandb sync <run_dir>/wandb/offline-run-*`.
"""

from __future__ import annotations

import json
import logging
import os
import secrets

from ..config_keys import optional_import
from ..run.atomic import atomic_write_text
from ..run.rundir import RunDir, os_error_text

log = logging.getLogger(__name__.split(".")[0])

KINDS = ("none", "tensorboard", "wandb")
NOT_LOGGED = ("kind", "step", "time")  # `time` becomes the event's wall time instead


class TrackerError(RuntimeError):
    """A tracker cannot start: unknown kind, missing package, unreadable tracker.json."""


def scalars(record: dict) -> dict[str, float]:
    """The record's numeric fields, named "<kind>/<field>"."""
    kind = record.get("kind", "train")
    numeric = {k: v for k, v in record.items() if isinstance(v, int | float)}
    return {
        f"{kind}/{name}": float(value)
        for name, value in numeric.items()
        if name not in NOT_LOGGED and not isinstance(value, bool)
    }


class Tracker:
    """The "none" tracker, and the base of the others: `log(record)` per metrics record,
    `close()` at the end. A tracker that fails while training warns once and stops logging:
    the run goes on, metrics.jsonl has every record."""

    name = "none"

    def __init__(self) -> None:
        self.broken = False

    def log(self, record: dict) -> None:
        if self.broken:
            return
        try:
            self.write(int(record["step"]), scalars(record), record.get("time"))
        except Exception as err:
            self.broken = True
            log.warning("%s tracker stopped (metrics.jsonl still has everything): %s", self, err)

    def write(self, step: int, values: dict[str, float], wall_time: float | None) -> None:
        pass

    def close(self) -> None:
        pass

    def __str__(self) -> str:
        return self.name


class TensorBoardTracker(Tracker):
    name = "tensorboard"

    def __init__(self, run_dir: RunDir, config: dict, resume_step: int) -> None:
        super().__init__()
        from torch.utils.tensorboard import SummaryWriter

        # purge_step: TensorBoard hides events at or after this step that were written before,
        # i.e. those logged after the checkpoint by the job that was killed.
        self.writer = SummaryWriter(
            log_dir=str(RunDir.of(run_dir).tensorboard), purge_step=resume_step + 1, flush_secs=30
        )
        if resume_step == 0:
            text = json.dumps(config, indent=2, default=str)
            self.writer.add_text("config", "    " + text.replace("\n", "\n    "), 0)

    def write(self, step: int, values: dict[str, float], wall_time: float | None) -> None:
        for name, value in values.items():
            self.writer.add_scalar(name, value, step, walltime=wall_time)

    def close(self) -> None:
        self.writer.close()


class WandbTracker(Tracker):
    name = "wandb"

    def __init__(self, run_dir: RunDir, config: dict, project: str, mode: str) -> None:
        super().__init__()
        import wandb

        run_dir = RunDir.of(run_dir)
        self.run = wandb.init(
            project=project,
            id=wandb_run_id(run_dir, project),
            resume="allow",  # the same run after a requeue or resume
            dir=str(run_dir.path),  # offline runs land in <run_dir>/wandb/offline-run-*
            name=run_dir.path.name,
            config=config,
            mode=os.environ.get("WANDB_MODE") or mode,
            settings=wandb.Settings(console="off"),  # the job log already has the output
        )

    def write(self, step: int, values: dict[str, float], wall_time: float | None) -> None:
        # Steps redone after a resume from an older checkpoint are logged again under the same
        # numbers, with the same loss (the resume is exact).
        self.run.log(values, step=step)

    def close(self) -> None:
        self.run.finish()


def wandb_run_id(run_dir: RunDir, project: str) -> str:
    """The run id stored in `<run_dir>/tracker.json`, made and stored (atomically) if absent."""
    path = RunDir.of(run_dir).tracker_state
    if path.exists():
        try:
            return str(json.loads(path.read_text())["wandb_run_id"])
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise TrackerError(
                f"cannot read the W&B run id from {path} ({err}); fix it, or delete it to "
                "start a new W&B run"
            ) from None
    run_id = secrets.token_hex(6)
    record = json.dumps({"wandb_run_id": run_id, "wandb_project": project}) + "\n"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, record)
    except OSError as err:
        raise TrackerError(f"cannot store the W&B run id: {os_error_text(err)}") from None
    return run_id


def open_tracker(
    kind: str,
    run_dir: RunDir,
    config: dict,
    is_main: bool,
    project: str,
    mode: str = "offline",
    resume_step: int = 0,
) -> Tracker:
    """The tracker `kind` on rank 0, a no-op elsewhere. Every rank checks that the package is
    installed (it imports it), so all of them stop with the same TrackerError at start, not
    mid-run."""
    if kind not in KINDS:
        raise TrackerError(f"tracker must be one of {', '.join(KINDS)}, not {kind!r}")
    if kind == "none":
        return Tracker()
    # the package and the extra are both named after the tracker
    optional_import(kind, kind, f'tracker = "{kind}" (or tracker = "none")', TrackerError)
    if not is_main:
        return Tracker()
    if kind == "tensorboard":
        return TensorBoardTracker(run_dir, config, resume_step)
    return WandbTracker(run_dir, config, project, mode)
