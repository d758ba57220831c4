"""What a run says on the console besides the step lines (metrics.py): what it is about to do
(with a warning when the step will be slow on a CPU), each evaluation, and a closing summary.

Only rank 0 prints; every line also says the number a user looks for without opening
metrics.jsonl.
"""

from __future__ import annotations

import logging
import math
import time

import torch

from ..models import spec_of

log = logging.getLogger(__name__.split(".")[0])

SLOW_STEP_S = 2.0  # warn when a CPU step is expected to take longer than this
TRY_OUT_BATCH = 8  # configs/tiny.toml's batch_size (and grad_accum_steps 1)


def cpu_matmul_gflops(size: int = 384, repeats: int = 4) -> float:
    """This CPU's matmul speed with the current thread count, in GFLOP/s (about 0.1 s)."""
    a = torch.randn(size, size)
    a @ a  # warm-up: thread pool and caches
    start = time.perf_counter()
    for _ in range(repeats):
        a @ a
    elapsed = max(time.perf_counter() - start, 1e-9)
    return 2 * size**3 * repeats / elapsed / 1e9


def estimated_step_s(flops_per_step: float, gflops: float) -> float:
    """A lower bound: the step's FLOPs at the speed of a bare matmul (real steps are slower)."""
    return flops_per_step / (gflops * 1e9)


def duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def count(n: float) -> str:
    for limit, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if n >= limit:
            return f"{n / limit:.3g}{suffix}"
    return f"{n:.0f}"


class Console:
    """Rank 0's console lines for one training session (from `start_step` on)."""

    def __init__(
        self,
        cfg,
        is_main: bool,
        device: torch.device,
        flops_per_step: float,
        units_per_sample: int,
        start_step: int,
        units_seen=None,  # samples -> what they hold, padding excluded (batches.py)
    ):
        self.cfg, self.is_main, self.device = cfg, is_main, device
        self.flops_per_step = flops_per_step
        self.units_per_sample = units_per_sample  # tokens per window (language models), or 1
        self.units_seen = units_seen or (lambda samples: samples * units_per_sample)
        self.spec = spec_of(cfg)
        self.unit = self.spec.task.unit  # "tokens" or "samples"
        self.start_step, self.start_samples = start_step, None
        self.evals: list[tuple[int, float]] = []
        self.started = time.perf_counter()

    def start(self, samples_seen: int) -> None:
        """Say what the run is about to do; warn when a CPU step will take long."""
        self.start_samples, self.started = samples_seen, time.perf_counter()
        if not self.is_main:
            return
        cfg = self.cfg
        if self.start_step >= cfg.max_steps:  # a finished run started again: say so, once
            return
        what = f"{self.spec.task.name} {self.spec.label(cfg)}"
        begin = f"from step {self.start_step} " if self.start_step else ""
        log.info(
            "training the %s %sto step %d on %s into %s (dataset %s)",
            what,
            begin,
            cfg.max_steps,
            self.device.type,
            cfg.run_dir,
            cfg.dataset,
        )
        if self.device.type != "cpu" or self.flops_per_step < SLOW_STEP_S * 1e9:
            return  # on a GPU, or fast on any CPU: nothing to measure
        gflops = cpu_matmul_gflops()
        step_s = estimated_step_s(self.flops_per_step, gflops)
        if step_s < SLOW_STEP_S:
            return
        log.warning(
            "this run is large for a CPU: each step needs %.3g GFLOP, at least %s at this "
            "CPU's measured %.0f GFLOP/s, so %d steps take at least %s; %s",
            self.flops_per_step / 1e9,
            duration(step_s),
            gflops,
            cfg.max_steps - self.start_step,
            duration(step_s * (cfg.max_steps - self.start_step)),
            self.try_out_advice(),
        )

    def try_out_advice(self) -> str:
        """What would make the step small: the batch, when it is larger than configs/tiny.toml's,
        else the model (a run of tiny.toml, or as small a batch, is told so, not to use it)."""
        cfg = self.cfg
        if cfg.batch_size * cfg.grad_accum_steps > TRY_OUT_BATCH:
            return "for a try-out use --config configs/tiny.toml, or run on a GPU node"
        return (
            f"the model ({self.spec.label(cfg)}) makes it so at batch_size {cfg.batch_size}: "
            "for a try-out choose a smaller one, or run on a GPU node"
        )

    def first_loss(self, loss: float, chance: float | None) -> None:
        """A new run's first loss far above what uniform predictions give (`chance`, ln of the
        number of outputs) means outputs far too large: a broken initialisation, more often
        than hard data. Trained on, it wastes steps undoing it, or diverges. A task with no
        such figure (a regression: `chance` None) is not checked."""
        if self.is_main and chance is not None and loss >= 2 * chance:
            log.warning(
                "the first loss is %.3g, %.1f times the %.3g of uniform predictions (ln of %d "
                "outputs): the model's initial outputs are far too large - likely its "
                "initialisation (the weights' scale, a missing normalisation, an output layer "
                "not scaled down)",
                loss,
                loss / chance,
                chance,
                round(math.exp(chance)),
            )

    def evaluated(
        self, step: int, result: dict, samples_seen: int, scored: float, epoch: float | None = None
    ) -> None:
        """One line per evaluation: the held-out loss and the task's other figures over what
        it scored (`scored`: samples, or a language model's target tokens), data trained on (and
        the epoch, with a sample stream)."""
        self.evals.append((step, result["eval_loss"]))
        if not self.is_main:
            return
        figures = [describe(name, v) for name, v in result.items() if name != "eval_loss"]
        log.info(
            "eval step %d/%d%s: loss %.4f%s over %s held-out %s; %s %s trained on",
            step,
            self.cfg.max_steps,
            "" if epoch is None else f" epoch {epoch:.2f}",
            result["eval_loss"],
            f" ({', '.join(figures)})" if figures else "",
            count(scored),
            self.unit,
            count(self.units_seen(samples_seen)),
            self.unit,
        )

    def summary(self, step: int, samples_seen: int, checkpoint, stopped: str = "") -> str:
        """The closing line: steps, best and last eval loss, time, throughput, checkpoint."""
        if not stopped and self.start_step >= self.cfg.max_steps:  # a finished run, again
            line = (
                f"nothing to train: the run in {self.cfg.run_dir} already finished at step "
                f"{step} (max_steps={self.cfg.max_steps}); its evaluations are in its "
                f"metrics.jsonl; checkpoint {checkpoint}"
            )
        else:
            line = self.trained(step, samples_seen, checkpoint, stopped)
        if self.is_main:
            log.info("%s", line)
        return line

    def trained(self, step: int, samples_seen: int, checkpoint, stopped: str) -> str:
        elapsed = time.perf_counter() - self.started
        done = self.units_seen(samples_seen) - self.units_seen(self.start_samples or 0)
        if self.evals:
            best_step, best = min(self.evals, key=lambda e: e[1])
            last_step, last = self.evals[-1]
            evals = (
                f"eval loss best {best:.4f} (step {best_step}), last {last:.4f} (step {last_step})"
            )
        else:
            evals = "no evaluation (eval_every=0 or no eval step reached)"
        head = (
            f"stopped at step {step} ({stopped})"
            if stopped
            else f"training finished at step {step}"
        )
        return (
            f"{head}, {step - self.start_step} steps in {duration(elapsed)}, "
            f"{done / max(elapsed, 1e-9):.0f} {self.unit}/s overall; {evals}; "
            f"checkpoint {checkpoint}"
        )


# How the evaluation line shows a task's figures; one a task of yours adds shows as name value.
SHOWN = {
    "eval_bits_per_token": lambda v: f"{v:.4f} bits/token",
    "eval_acc": lambda v: f"accuracy {v:.1%}",
    "eval_top5": lambda v: f"top-5 {v:.1%}",
}


def describe(name: str, value: float) -> str:
    return SHOWN[name](value) if name in SHOWN else f"{name.removeprefix('eval_')} {value:.4g}"
