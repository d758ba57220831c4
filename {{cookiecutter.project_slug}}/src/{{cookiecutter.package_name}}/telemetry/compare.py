"""Runs side by side: `python -m <package> compare run_dir=A run_dir=B ...` prints one table
(steps, best and last eval loss, throughput, wall time, the settings that differ) and writes one
PNG with their loss curves overlaid. It reads what each run wrote: metrics.jsonl (each step's
record from its latest segment) and config.toml.
"""

from __future__ import annotations

import math
from pathlib import Path

from ..config_keys import ConfigError, read_toml
from ..run.atomic import atomic_write
from ..run.rundir import RunDir
from .metrics import has_numbers, pyplot, read_records, throughput_unit


def summary(run_dir: Path) -> dict:
    """What one run reached, from its own records."""
    path = RunDir(run_dir).metrics
    if not path.is_file():
        raise RuntimeError(f"{run_dir}: no metrics.jsonl (not a run directory, or not started)")
    records = read_records(path)
    train = [r for r in records if r.get("kind") == "train" and has_numbers(r, "step", "loss")]
    evals = [
        r["eval_loss"] for r in records if r.get("kind") == "eval" and has_numbers(r, "eval_loss")
    ]
    unit = throughput_unit(train[0]) if train else "samples"
    speeds = sorted(r[f"{unit}_per_s"] for r in train if has_numbers(r, f"{unit}_per_s"))
    return {
        "run": str(run_dir),
        "steps": train[-1]["step"] if train else 0,
        "last_loss": train[-1]["loss"] if train else math.nan,
        "best_eval": min(evals) if evals else math.nan,
        "last_eval": evals[-1] if evals else math.nan,
        "per_s": speeds[len(speeds) // 2] if speeds else math.nan,  # the median
        "unit": unit,
        "wall_s": wall_time(records),
        "train": train,
    }


def wall_time(records: list[dict]) -> float:
    """Seconds spent running: each segment (start record to its last record), summed, so the
    time a requeued job waited in the queue does not count."""
    total, start, last = 0.0, None, None
    for record in records:
        if not has_numbers(record, "time"):
            continue
        if record.get("kind") == "start":
            total += (last - start) if start is not None else 0.0
            start = last = record["time"]
        else:
            start = record["time"] if start is None else start
            last = record["time"]
    return total + ((last - start) if start is not None else 0.0)


def config_of(run_dir: Path) -> dict:
    """The run's config.toml, its model's table spelled as on the command line (`gpt.preset`)."""
    path = RunDir(run_dir).config
    values = read_toml(path) if path.is_file() else {}
    flat = {}
    for name, value in values.items():
        if isinstance(value, dict):
            flat.update({f"{name}.{own}": v for own, v in value.items()})
        else:
            flat[name] = value
    return flat


def differences(configs: list[dict]) -> list[str]:
    """The settings whose values are not the same in every run (run_dir aside)."""
    keys = sorted(set().union(*configs) - {"run_dir"})
    return [k for k in keys if len({repr(c.get(k)) for c in configs}) > 1]


def table(rows: list[dict], configs: list[dict]) -> str:
    differ = differences(configs)
    header = ["run", "steps", "last loss", "best eval", "last eval", f"{rows[0]['unit']}/s", "wall"]
    lines = [header]
    for row, config in zip(rows, configs, strict=True):
        lines.append(
            [
                row["run"],
                str(row["steps"]),
                number(row["last_loss"]),
                number(row["best_eval"]),
                number(row["last_eval"]),
                number(row["per_s"], 0),
                duration(row["wall_s"]),
            ]
            + [f"{k}={config.get(k, '-')}" for k in differ]
        )
    width = [max(len(line[i]) for line in lines if i < len(line)) for i in range(len(header))]
    text = "\n".join(
        "  ".join(
            cell.ljust(width[i]) if i < len(width) else cell for i, cell in enumerate(line)
        ).rstrip()
        for line in lines
    )
    return text + ("\nsettings that differ: " + ", ".join(differ) if differ else "\nsame settings")


def number(value: float, digits: int = 4) -> str:
    return "-" if math.isnan(value) else f"{value:.{digits}f}"


def duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(round(seconds)), 60)
    return f"{minutes // 60}h{minutes % 60:02d}m" if minutes >= 60 else f"{minutes}m{secs:02d}s"


def compare(run_dirs: list[Path], out: Path) -> tuple[str, Path]:
    """The table (text) and the PNG of the runs' training (and eval) loss against step."""
    if len(run_dirs) < 2:
        raise ConfigError("compare needs at least two runs: compare run_dir=A run_dir=B ...")
    rows = [summary(Path(d)) for d in run_dirs]
    configs = [config_of(Path(d)) for d in run_dirs]
    plt = pyplot("compare's plot")
    out = Path(out)
    if out.is_dir():
        out = out / "compare.png"
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for row in rows:
        line = ax.plot([r["step"] for r in row["train"]], [r["loss"] for r in row["train"]])
        line[0].set_label(row["run"])
    ax.set_xlabel("step")
    ax.set_ylabel("training loss")
    ax.legend(fontsize="small")
    fig.tight_layout()
    try:
        atomic_write(out, lambda tmp: fig.savefig(tmp, dpi=100, format="png"))
    finally:
        plt.close(fig)
    return table(rows, configs), out
