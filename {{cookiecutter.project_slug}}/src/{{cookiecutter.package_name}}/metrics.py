"""Training metrics: every `log_every` steps rank 0 logs one line and appends the same record
to `<run_dir>/metrics.jsonl`; `plot()` draws loss and throughput from that file."""

from __future__ import annotations

import json
import logging
import resource
import time
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode

from . import distributed

log = logging.getLogger(__package__)


def count_flops(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, loss_fn) -> int:
    """FLOPs of one forward + backward on this batch, counted once by running it.

    Runs in eval mode (no dropout, no BatchNorm statistics updates) and with the RNG state
    forked, so counting does not change anything a checkpoint restores.
    """
    was_training = model.training
    model.eval()
    devices = [x.device] if x.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices), FlopCounterMode(display=False) as counter:
        loss_fn(model(x), y).backward()
    model.zero_grad(set_to_none=True)
    model.train(was_training)
    return counter.get_total_flops()


def peak_memory_gib(device: torch.device) -> float:
    """Peak allocated GPU memory on CUDA; peak resident memory of the process on CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # ru_maxrss is KiB


class Metrics:
    """Accumulates per-step values on the device (no host sync) until the next `log`."""

    def __init__(
        self,
        run_dir: Path,
        is_main: bool,
        world: int,
        samples_per_step: int,
        flops_per_step: int,
        peak_flops: float,
        device: torch.device,
        max_steps: int,
    ):
        self.path = Path(run_dir) / "metrics.jsonl"
        self.is_main, self.world, self.device = is_main, world, device
        self.samples_per_step, self.flops_per_step = samples_per_step, flops_per_step
        self.peak_flops, self.max_steps = peak_flops, max_steps
        self.loss_sum = torch.zeros((), device=device)
        self.loss_steps = 0
        self.restart_clock()

    def restart_clock(self) -> None:
        """Exclude what just happened (eval, checkpoint) from the step-time measurement."""
        self.window_start, self.window_steps, self.window_wait = time.perf_counter(), 0, 0.0

    def update(self, loss: torch.Tensor, data_wait_s: float) -> None:
        self.loss_sum += loss
        self.loss_steps += 1
        self.window_steps += 1
        self.window_wait += data_wait_s

    def log(self, step: int, lr: float, epoch: int) -> dict:
        """Reduce across ranks (collective: all ranks call it at the same steps) and record."""
        totals = torch.stack([self.loss_sum, torch.tensor(self.window_wait, device=self.device)])
        distributed.all_reduce(totals)
        loss, wait = (totals / self.world).tolist()  # one host sync per log, not per step
        elapsed = time.perf_counter() - self.window_start
        step_time = elapsed / max(self.window_steps, 1)
        samples_per_s = self.samples_per_step * self.world / step_time
        record = {
            "kind": "train",
            "step": step,
            "epoch": epoch,
            "loss": loss / self.loss_steps,
            "lr": lr,
            "step_time_s": step_time,
            "data_wait_s": wait / max(self.window_steps, 1),
            "samples_per_s": samples_per_s,
            "samples_per_s_per_rank": samples_per_s / self.world,
            "tflops_per_rank": self.flops_per_step / step_time / 1e12,
            "peak_mem_gib": peak_memory_gib(self.device),
            "eta_s": (self.max_steps - step) * step_time,
            "time": time.time(),
        }
        if self.device.type == "cuda":  # MFU against the GPU's peak; meaningless on CPU
            record["mfu"] = self.flops_per_step / step_time / self.peak_flops
        self.loss_sum.zero_()
        self.loss_steps = 0
        self.restart_clock()
        if self.is_main:
            mfu = f" mfu {record['mfu']:.1%}" if "mfu" in record else ""
            log.info(
                "step %d/%d loss %.4f lr %.2e | %.1f ms/step (data %.1f ms) | %.0f samples/s "
                "(%.0f/rank)%s | mem %.2f GiB | eta %.0f s",
                step,
                self.max_steps,
                record["loss"],
                lr,
                1e3 * step_time,
                1e3 * record["data_wait_s"],
                samples_per_s,
                record["samples_per_s_per_rank"],
                mfu,
                record["peak_mem_gib"],
                record["eta_s"],
            )
        self.write(record)
        return record

    def write(self, record: dict) -> None:
        if self.is_main:
            with open(self.path, "a") as f:
                f.write(json.dumps(record) + "\n")


def read_records(path: Path) -> list[dict]:
    path = Path(path)
    if path.is_dir():
        path = path / "metrics.jsonl"
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line cut by a kill
    return records


def plot(path: Path, out: Path | None = None) -> Path:
    """PNG of loss and throughput vs step from a run directory or a metrics.jsonl file."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise RuntimeError(
            "plotting needs matplotlib: pip install matplotlib (or this project's [plot] extra)"
        ) from None
    path = Path(path)
    records = read_records(path)
    train = [r for r in records if r.get("kind") == "train"]
    evals = [r for r in records if r.get("kind") == "eval"]
    if not train:
        raise RuntimeError(f"no training records in {path}")
    out = Path(out) if out else (path if path.is_dir() else path.parent) / "metrics.png"
    fig, (ax_loss, ax_speed) = plt.subplots(2, 1, figsize=(7, 6), sharex=True)
    ax_loss.plot([r["step"] for r in train], [r["loss"] for r in train], label="train")
    if evals:
        ax_loss.plot(
            [r["step"] for r in evals], [r["eval_loss"] for r in evals], "o-", label="eval"
        )
    ax_loss.set_ylabel("loss")
    ax_loss.legend()
    ax_speed.plot([r["step"] for r in train], [r["samples_per_s"] for r in train])
    ax_speed.set_ylabel("samples/s (all ranks)")
    ax_speed.set_xlabel("step")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
