"""Runs side by side: `python -m <package> compare run_dir=A run_dir=B ...` prints one table
(steps, best and last eval loss, throughput, wall time, the settings that differ) and writes one
PNG with their loss curves overlaid (`--out`, by default compare.png in the first run's
directory). It reads what each run wrote: metrics.jsonl (each step's record from its latest
segment) and config.toml. A run named twice (two spellings of one path) is compared once; a
NaN or infinite value (a diverged run) is left out of the figures and the plot, and counted.
"""

from __future__ import annotations

import math
from pathlib import Path

from ..config_keys import ConfigError, read_toml
from ..run.atomic import atomic_write
from ..run.rundir import RunDir
from .metrics import has_numbers, pyplot, read_records, throughput_unit


def summary(run_dir: Path) -> dict:
    """What one run reached, from its own records; "not_finite" counts the records left out
    for a NaN or infinite value (a diverged run's loss, a clock gone wrong)."""
    path = RunDir(run_dir).metrics
    if not path.is_file():
        raise RuntimeError(f"{run_dir}: no metrics.jsonl (not a run directory, or not started)")
    records = read_records(path)
    kept = [r for r in records if finite(r, "step", "loss", "eval_loss", "time")]
    train = [r for r in kept if r.get("kind") == "train" and has_numbers(r, "step", "loss")]
    evals = [
        r["eval_loss"] for r in kept if r.get("kind") == "eval" and has_numbers(r, "eval_loss")
    ]
    unit = throughput_unit(train[0]) if train else "samples"
    speeds = sorted(r[f"{unit}_per_s"] for r in train if finite(r, f"{unit}_per_s", need=True))
    return {
        "run": str(run_dir),
        "steps": train[-1]["step"] if train else 0,
        "last_loss": train[-1]["loss"] if train else math.nan,
        "best_eval": min(evals) if evals else math.nan,
        "last_eval": evals[-1] if evals else math.nan,
        "per_s": speeds[len(speeds) // 2] if speeds else math.nan,  # the median
        "unit": unit,
        "wall_s": wall_time(kept),
        "train": train,
        "not_finite": len(records) - len(kept),
    }


def finite(record: dict, *keys: str, need: bool = False) -> bool:
    """Whether the record's numbers under `keys` are finite (a missing one passes unless
    `need`; a value that is not a number is another check's: has_numbers)."""
    values = [record.get(k) for k in keys]
    if need and not has_numbers(record, *keys):
        return False
    return all(math.isfinite(v) for v in values if isinstance(v, int | float))


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


def distinct(run_dirs: list[Path]) -> list[Path]:
    """The runs in the order given, each once: `runs/a`, `./runs/a/` and its absolute path are
    one run directory."""
    seen, runs = set(), []
    for run_dir in map(Path, run_dirs):
        if run_dir.resolve() not in seen:
            seen.add(run_dir.resolve())
            runs.append(run_dir)
    return runs


def compare(run_dirs: list[Path], out: Path | None = None) -> tuple[str, Path]:
    """The table (text) and the PNG of the runs' training loss against step, written to `out`
    (a file, or a directory to hold compare.png; None: the first run's directory)."""
    run_dirs = distinct(run_dirs)
    if len(run_dirs) < 2:
        raise ConfigError(
            "compare needs at least two runs (a run named twice counts once): "
            "compare run_dir=A run_dir=B ..."
        )
    rows = [summary(d) for d in run_dirs]
    configs = [config_of(d) for d in run_dirs]
    plt = pyplot("compare's plot")
    out = Path(run_dirs[0] if out is None else out)
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
    except OSError as err:  # named after the file asked for, not the hidden one written first
        raise OSError(err.errno, f"cannot write {out}: {err.strerror or err}") from None
    finally:
        plt.close(fig)
    return table(rows, configs) + skipped_values(rows), out


def skipped_values(rows: list[dict]) -> str:
    """A line per run whose records with a NaN or infinite value were left out of the table
    and the plot."""
    return "".join(
        f"\n{row['run']}: {row['not_finite']} record(s) with a NaN or infinite value left out"
        for row in rows
        if row["not_finite"]
    )
