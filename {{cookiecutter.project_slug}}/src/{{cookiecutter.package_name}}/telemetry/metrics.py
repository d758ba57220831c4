"""Training metrics: every `log_every` steps rank 0 logs one line and appends the same record
to `<run_dir>/metrics.jsonl`; `plot()` draws loss and throughput from that file.

Each start of the run appends a `{"kind": "start", "step": S}` record first: a resume after a
kill repeats the steps after its checkpoint S, and readers (`read_records`) keep the latest
segment's record of each step. A run that starts at step 0 where records already exist (an
earlier run there died before its first checkpoint) moves them aside to
`metrics.before-<time>.jsonl` and starts a new file.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import resource
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from .. import distributed
from ..config_keys import key, optional_import, parse_every
from ..run.atomic import atomic_write
from ..run.rundir import RunDir, reported
from . import health, tracking
from .console import duration

log = logging.getLogger(__name__.split(".")[0])


# fmt: off
@dataclass
class TelemetryKeys:
    log_every: int = key(25, "steps between metric records", bounds=(1, 10**12))
    eval_every: str = key("100", '"N" steps or "Xepochs" between evaluations; "0": none',
                          check=parse_every)
    eval_batches: int = key(20, "held-out batches per evaluation, all ranks together, spread "
                            "over the split (evaluate: the whole split unless given)",
                            bounds=(1, 10**6))
    peak_tflops: float = key(989.0, "per-GPU peak for MFU (H100/GH200 dense bf16)",
                             bounds=(1e-3, 1e6))
    tracker: str = key("none", "also log to it (metrics.jsonl always)",
                       choices=("none", "tensorboard", "wandb"))
    wandb_project: str = key("", 'W&B project ("": the package name)')
    wandb_mode: str = key("offline", "offline: compute nodes have no internet",
                          choices=("offline", "online", "disabled"))
# fmt: on


def peak_memory_gib(device: torch.device) -> float:
    """Peak allocated GPU memory on CUDA; peak resident memory of the process on CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return peak_resident_gib()


def peak_resident_gib() -> float:
    """The most host memory this process has held so far: VmHWM, not ru_maxrss, which a
    process inherits from the one that forked it (a launcher holding a model reports that)."""
    return _proc_status_kib("VmHWM") / 2**20


def resident_gib() -> float:
    """The host memory this process holds now."""
    return _proc_status_kib("VmRSS") / 2**20


def _proc_status_kib(field: str) -> float:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return float(line.split()[1])  # "VmHWM:   649628 kB"
    except (OSError, IndexError, ValueError):
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # not Linux: the best there is


class Metrics:
    """Accumulates per-step values on the device (no host sync) until the next `log`; writes
    `metrics.jsonl` (the source of truth) and, if configured, a tracker (TensorBoard, W&B).

    Throughput is per sample for a classifier and per token for a language model; MFU is model
    FLOPs per second over the GPU's peak (`peak_tflops`), the standard definition (PaLM,
    appendix B).
    """

    def __init__(
        self,
        run_dir: Path,
        env,
        cfg,
        task,  # the model's models.spec.Task: what throughput counts, extra loss fields
        flops_per_step: float,
        units_per_step: int,
        start_step: int,
        units_seen=None,  # step -> units all ranks read before it, padding excluded (batches.py)
    ):
        self.path, self.run_dir = RunDir.of(run_dir).metrics, run_dir
        self.is_main, self.world, self.cfg = env.is_main, env.world_size, cfg
        self.device = torch.device("cpu")
        self.flops_per_step = flops_per_step
        self.task, self.unit = task, task.unit
        self.units_per_step = units_per_step  # per rank, padding included
        self.units_seen = units_seen or (lambda step: step * units_per_step * env.world_size)
        self.losses: list[torch.Tensor] = []  # since the last log, summed there
        self.norms: list[torch.Tensor] = []  # the steps' clipped gradient norms, likewise
        self.saved_step = start_step  # the newest checkpoint's step (0: none)
        self._wait_seen = 0.0
        self.tracker = tracking.open_tracker(
            cfg.tracker,
            RunDir.of(run_dir),
            dataclasses.asdict(cfg),
            env.is_main,
            project=cfg.wandb_project or __name__.split(".")[0],
            mode=cfg.wandb_mode,
            resume_step=start_step,
        )
        if self.is_main:
            with reported(f"cannot append to {self.path}"):
                self._begin_segment(start_step)
        self.restart_clock()

    def _begin_segment(self, start_step: int) -> None:
        if start_step == 0 and self.path.is_file() and self.path.stat().st_size:
            kept = self.path.with_name(f"metrics.before-{time.strftime('%Y%m%dT%H%M%S')}.jsonl")
            self.path.rename(kept)
            log.warning(
                "%s held an earlier run's records (no checkpoint): kept as %s", self.path, kept.name
            )
        self._append({"kind": "start", "step": start_step, "time": time.time()})

    def restart_clock(self) -> None:
        """Exclude what just happened (eval, checkpoint) from the step-time measurement."""
        self.window_start, self.window_steps, self.window_wait = time.perf_counter(), 0, 0.0

    def update(self, loss: torch.Tensor, inputs, grad_norm: torch.Tensor | None = None) -> None:
        """After each step: the loss (a device tensor), the clipped gradient norm (None: not
        clipped) and the input pipeline's wait so far. Kept, not added: no device operation
        per step (the addition cost 10 µs of a tiny GPT's CPU step; the losses are summed at
        `log`, where a non-finite one stops the run: health.py)."""
        self.device = loss.device
        self.losses.append(loss)
        if grad_norm is not None:
            self.norms.append(health.local_value(grad_norm))
        self.window_steps += 1
        self.window_wait += inputs.wait_s - self._wait_seen
        self._wait_seen = inputs.wait_s

    def log(self, step: int, lr: float, epoch: float | None = None) -> dict:
        """Reduce across ranks (collective: all ranks call it at the same steps) and record;
        `epoch`: passes over the training split so far (None: no sample stream)."""
        totals = torch.stack(
            [
                torch.stack(self.losses).sum().float(),
                torch.tensor(self.window_wait, device=self.device),
                self._norms_sum(),
            ]
        )
        distributed.all_reduce(totals)
        loss, wait, norms = (totals / self.world).tolist()  # one host sync per log, not per step
        if not (math.isfinite(loss) and math.isfinite(norms)):
            self._stop(step, None)
        loss /= len(self.losses)
        elapsed = time.perf_counter() - self.window_start
        step_time = elapsed / max(self.window_steps, 1)
        # real data: the units read since the window began, padding excluded (chat windows)
        real = self.units_seen(step) - self.units_seen(step - self.window_steps)
        per_s = real / max(elapsed, 1e-9)
        real_share = real / max(self.units_per_step * self.world * self.window_steps, 1)
        record = {
            "kind": "train",
            "step": step,
            **({} if epoch is None else {"epoch": epoch}),
            "loss": loss,
            "lr": lr,
            "step_time_s": step_time,
            "data_wait_s": wait / max(self.window_steps, 1),
            "data_wait_fraction": wait / max(self.window_steps, 1) / step_time,
            f"{self.unit}_seen": self.units_seen(step),  # all ranks', padding excluded
            f"{self.unit}_per_s": per_s,
            f"{self.unit}_per_s_per_rank": per_s / self.world,
            "tflops_per_rank": self.flops_per_step / step_time / 1e12,
            "peak_mem_gib": peak_memory_gib(self.device),
            "eta_s": (self.cfg.max_steps - step) * step_time,
            "time": time.time(),
        }
        record.update(self.task.train_metrics(loss))
        if self.device.type == "cuda":  # MFU against the GPU's peak; meaningless on CPU
            model_flops = self.flops_per_step * real_share  # the padding's are not the model's
            record["mfu"] = model_flops / step_time / (self.cfg.peak_tflops * 1e12)
        self.losses, self.norms = [], []
        self.restart_clock()
        if self.is_main:
            mfu = f" | mfu {record['mfu']:.1%}" if "mfu" in record else ""
            log.info(
                "step %d/%d%s loss %.4f lr %.2e | %.1f ms/step (data %.1f ms) | %.0f %s/s "
                "(%.0f/rank)%s | mem %.2f GiB | eta %s",
                step,
                self.cfg.max_steps,
                "" if epoch is None else f" epoch {epoch:.2f}",
                loss,
                lr,
                1e3 * step_time,
                1e3 * record["data_wait_s"],
                per_s,
                self.unit,
                per_s / self.world,
                mfu,
                record["peak_mem_gib"],
                duration(record["eta_s"]),
            )
        self.write(record)
        return record

    def _norms_sum(self) -> torch.Tensor:
        if not self.norms:
            return torch.zeros((), device=self.device)
        return torch.stack(self.norms).sum().float()

    def check_finite(self, step: int, model: torch.nn.Module) -> None:
        """Before a checkpoint of step `step` (collective): the losses and norms since the last
        log, and the model's parameters, finite on every rank, or NonFinite is raised."""
        values = [self._norms_sum(), health.parameters_sum(model).to(self.device)]
        if self.losses:
            values.append(torch.stack(self.losses).sum().float())
        totals = distributed.all_reduce(torch.stack(values))
        if not all(math.isfinite(value) for value in totals.tolist()):
            self._stop(step, model)
        self.saved_step = step  # the checkpoint that follows holds a good state

    def _stop(self, step: int, model: torch.nn.Module | None) -> None:
        """A check failed: name the first bad step and rank (health.stop) and raise."""
        steps = range(step - len(self.losses) + 1, step + 1)
        found = health.first_bad("loss", steps, self.losses)
        if self.norms:  # one per step, or none (no clipping)
            found += health.first_bad("gradient norm", steps, self.norms)
        self.write({"kind": "non-finite", "step": step, "found": [list(item) for item in found]})
        last = "no checkpoint was written before it"
        if self.saved_step:
            path = RunDir.of(self.run_dir).checkpoints
            last = f"the last good state is its checkpoint of step {self.saved_step} in {path}"
        health.stop(step, found, model, last, self.is_main)

    def write(self, record: dict) -> None:
        if self.is_main:
            with reported(f"cannot append to {self.path}"):
                self._append(record)
            self.tracker.log(record)

    def _append(self, record: dict) -> None:
        close_cut_line(self.path)
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")

    def close(self) -> None:
        self.tracker.close()


def close_cut_line(path: Path) -> None:
    """A last line without its newline (a write cut by a full disk or a kill) is ended before
    the next record, with a warning, so the two do not merge into one unreadable line."""
    try:
        with open(path, "rb") as f:
            f.seek(-1, 2)
            cut = f.read(1) != b"\n"
    except (FileNotFoundError, OSError):  # no file yet, or empty (seek before the start)
        return
    if cut:
        log.warning("%s: its last line was cut off (a write interrupted); ended it there", path)
        with open(path, "a") as f:
            f.write("\n")


def read_records(path: Path) -> list[dict]:
    """The JSON objects of a run's metrics.jsonl, each step's from the latest segment: a start
    record at step S drops the earlier records of the steps after S (a resume redid them). A
    line that is not a JSON object (cut by a kill, not UTF-8, another JSON value) is skipped,
    and the skipped lines are counted in one warning."""
    path = Path(path)
    if path.is_dir():
        path = RunDir(path).metrics
    records, skipped = [], 0
    for line in path.read_bytes().splitlines():
        try:
            record = json.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            record = None
        if isinstance(record, dict):
            if record.get("kind") == "start" and isinstance(record.get("step"), int):
                records = [r for r in records if not _after(r, record["step"])]
            records.append(record)
        elif line.strip():
            skipped += 1
    if skipped:
        log.warning("%s: skipped %d line(s) that are not JSON records", path, skipped)
    return records


def _after(record: dict, step: int) -> bool:
    return isinstance(record.get("step"), (int, float)) and record["step"] > step


def has_numbers(record: dict, *keys: str) -> bool:
    return all(isinstance(record.get(k), (int, float)) for k in keys)


def throughput_unit(record: dict) -> str:
    """What a training record's throughput counts: the task's unit in its `<unit>_per_s` field
    (tokens, images, samples, or yours)."""
    found = [k for k in record if k.endswith("_per_s") and not k.endswith("_per_rank")]
    return found[0].removesuffix("_per_s") if found else "samples"


def pyplot(purpose: str):
    """matplotlib.pyplot, drawing into files (a compute node has no display); without
    matplotlib, a RuntimeError (exit 1) that says how to install it."""
    optional_import("matplotlib", "plot", purpose, RuntimeError).use("Agg")
    import matplotlib.pyplot

    return matplotlib.pyplot


# The evaluation figures `plot` draws in their own panel, and how it names them; one a task of
# yours adds is drawn under its own name. The eval loss is drawn with the training loss.
EVAL_FIGURES = {"eval_acc": "accuracy", "eval_top5": "top-5"}
NOT_DRAWN = {"eval_loss", "eval_bits_per_token", "step", "epoch", "time"}  # a loss restated


def plot_series(records: list[dict]) -> dict[str, dict[str, tuple[list, list]]]:
    """What `plot` draws, by panel: {panel: {label: (steps, values)}}: the loss (training and
    evaluation), the task's other evaluation figures (a classifier's accuracy and top-5) when
    it has any, and the throughput."""
    train = [r for r in records if r.get("kind") == "train" and has_numbers(r, "step", "loss")]
    evals = [r for r in records if r.get("kind") == "eval" and has_numbers(r, "step")]

    def series(rows: list[dict], name: str) -> tuple[list, list]:
        rows = [r for r in rows if has_numbers(r, name)]
        return [r["step"] for r in rows], [r[name] for r in rows]

    panels = {"loss": {"train": series(train, "loss")}}
    if any(has_numbers(r, "eval_loss") for r in evals):
        panels["loss"]["eval"] = series(evals, "eval_loss")
    names = dict.fromkeys(k for r in evals for k in r if k not in NOT_DRAWN and has_numbers(r, k))
    figures = {EVAL_FIGURES.get(k, k.removeprefix("eval_")): series(evals, k) for k in names}
    if figures:
        panels["evaluation"] = figures
    if train:
        unit = throughput_unit(train[0])
        panels[f"{unit}/s (all ranks)"] = {"all ranks": series(train, f"{unit}_per_s")}
    return panels


def plot(path: Path, out: Path | None = None) -> Path:
    """PNG of the loss, the task's evaluation figures and the throughput vs step, from a run
    directory or a metrics.jsonl file (plot_series)."""
    plt = pyplot("plot")
    path = Path(path)
    panels = plot_series(read_records(path))
    if not panels["loss"]["train"][0]:
        raise RuntimeError(f"no training records (with step and loss) in {path}")
    out = Path(out) if out else (path if path.is_dir() else path.parent) / "metrics.png"
    if out.is_dir():  # --out runs/a: the plot goes into it
        out = out / "metrics.png"
    fmt = out.suffix.lstrip(".").lower() or "png"
    fig, axes = plt.subplots(len(panels), 1, figsize=(7, 3 * len(panels)), sharex=True)
    if fmt not in fig.canvas.get_supported_filetypes():
        plt.close(fig)
        raise RuntimeError(f"plot --out {out}: .{fmt} is not an image format matplotlib writes")
    for ax, (panel, lines) in zip(axes, panels.items(), strict=True):
        for label, (steps, values) in lines.items():
            ax.plot(steps, values, "-" if label in ("train", "all ranks") else "o-", label=label)
        ax.set_ylabel(panel)
        if len(lines) > 1 or panel == "evaluation":
            ax.legend()
    axes[-1].set_xlabel("step")
    fig.tight_layout()
    try:  # complete or not at all, under the name said (savefig alone appends .png to "x")
        atomic_write(out, lambda tmp: fig.savefig(tmp, dpi=100, format=fmt))
    finally:
        plt.close(fig)
    return out
