"""`python -m <pkg> evaluate run_dir=R [dataset=D] [eval_batches=N]`: the newest checkpoint of
a run on a dataset's validation split (the run's own by default), as one JSON line: loss, and
for a language model bits per token and perplexity. Any model, any number of ranks (under srun or
torchrun the checkpoint is resharded as for a resume); nothing in the run directory changes."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

from . import checkpoint, distributed
from .checkpoint import complete_checkpoints, lora, read_checkpoint, verify
from .config.settings import Config, load_config
from .config_keys import ConfigError, split_assignment
from .data import batches as data
from .run.rundir import RunDir
from .train import build, evaluate

# what evaluate may change about the run: the data it reads and how it runs
ALLOWED = {"dataset", "eval_batches", "batch_size", "device", "num_workers", "cpu_threads"}


def evaluation_config(overrides: list[str]) -> Config:
    """The run's recorded config (its config.toml) with the allowed overrides."""
    pairs = [split_assignment(item) for item in overrides]
    run_dirs = [value for key, value in pairs if key == "run_dir"]
    if not run_dirs or not run_dirs[-1]:
        raise ConfigError("evaluate needs run_dir=DIR (a run directory with a checkpoint)")
    run_dir = RunDir(run_dirs[-1])
    others = sorted({key for key, _ in pairs if key != "run_dir"} - ALLOWED)
    if others:
        raise ConfigError(
            f"evaluate takes run_dir= and {', '.join(sorted(ALLOWED))}; not {', '.join(others)} "
            "(the model is the checkpoint's)"
        )
    if not run_dir.config.is_file():
        raise ConfigError(f"{run_dir.path}: no config.toml, not a run directory of this package")
    cfg, _ = load_config(
        run_dir.config, [f"{key}={value}" for key, value in pairs if key != "run_dir"]
    )
    return dataclasses.replace(cfg, run_dir=str(run_dir.path), init_from="", compile=False)


def recorded_vocabulary(run_dir: Path) -> int | None:
    """The vocabulary the newest checkpoint's model was built for (its recorded data_info).
    A damaged checkpoint is passed over here; the manager names it when it skips it too."""
    for path in complete_checkpoints(RunDir(run_dir).checkpoints):
        if verify(path):
            continue
        extra = read_checkpoint(path, lambda key: key == "train.extra").get("train.extra")
        info = json.loads(extra or "{}").get("config", {}).get("data_info", {})
        return info.get("vocab_size")
    return None


def run_evaluation(cfg: Config) -> dict:
    with distributed.process_group(cfg.dist_timeout_s, cfg.cpu_threads, cfg.device) as (env, dev):
        run = build(cfg, env, dev)
        trained = recorded_vocabulary(Path(cfg.run_dir)) if env.is_main else None
        trained = distributed.broadcast_object(trained)
        vocab = run.source.info.vocab_size
        if trained and vocab and vocab != trained:
            raise ConfigError(
                f"dataset {cfg.dataset} has {vocab} token ids, the model of {cfg.run_dir} was "
                f"trained on {trained}: evaluate on data made with the run's tokenizer"
            )
        manager = checkpoint.CheckpointManager(
            RunDir(cfg.run_dir).checkpoints, run.checkpoint_parts(), keep=cfg.keep_checkpoints
        )
        lora.load_base(run.model, run.spec, cfg, run.source.info, None)  # a LoRA run's base
        step = manager.load_latest()
        if step is None:
            raise ConfigError(f"{cfg.run_dir}: no complete checkpoint to evaluate")
        lora.record_base(run.state.extra, cfg)  # refused if not the checkpoint's
        batches = data.eval_batches(
            run.source, cfg.batch_size, env.rank, env.world_size, cfg.eval_batches
        )
        metrics = evaluate(run, batches)
    result = {"run_dir": cfg.run_dir, "step": step, "dataset": cfg.dataset, "ranks": env.world_size}
    result.update(metrics)
    if "eval_bits_per_token" in metrics:
        result["perplexity"] = math.exp(min(metrics["eval_loss"], 700.0))
    return result if env.is_main else {}


def main(overrides: list[str]) -> int:
    result = run_evaluation(evaluation_config(overrides))
    if result:
        print(json.dumps(result), flush=True)
    return 0
