"""`python -m <pkg> evaluate run_dir=R [dataset=D] [eval_batches=N]`: the newest checkpoint of
a run on a dataset's validation split (the run's own by default). `evaluate hf_model=DIR
dataset=D [hf_context_length=N]`: a Hugging Face model directory as it is, without training
(the baseline a fine-tuning run starts from; the same numbers as transformers' on the same
windows). `evaluate dataset=D --print-split`: the validation split as text.

One JSON line: the loss (a language model: bits per token and perplexity), which split, what
was scored (`scored_tokens` of the split's `scoreable_tokens`; samples or images for a
classifier) and how (`scheme`: the windows). The whole split by default; `eval_batches=N`
scores N batches spread evenly over it. The same samples on any number of ranks, so the same
numbers to float rounding (under srun or torchrun the checkpoint is resharded as for a resume);
nothing is written."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from pathlib import Path

from .. import checkpoint, distributed
from ..checkpoint import adapters, complete_checkpoints, read_checkpoint, verify
from ..checkpoint.start import Start, load_start, open_start
from ..config.settings import Config, load_config
from ..config_keys import ConfigError, split_assignment
from ..data import batches as data
from ..data.kinds import kind_of_directory
from ..models import spec_of
from ..run.rundir import RunDir
from ..training.build import build
from ..training.step import evaluate

# what evaluate may change about a run: the data it reads and how it runs
ALLOWED = {"dataset", "eval_batches", "batch_size", "device", "num_workers", "cpu_threads"}
# evaluate hf_model=DIR: the model directory and how it is read, besides
HF_ALLOWED = ALLOWED | {"hf_model", "hf_context_length", "parallelism", "precision"}


def evaluation_config(overrides: list[str]) -> tuple[Config, int | None]:
    """The config to evaluate (a run's recorded config.toml with the allowed overrides, or
    model=hf over `hf_model`), and eval_batches if given (None: the whole split)."""
    pairs = [split_assignment(item) for item in overrides]
    given = dict(pairs)
    if given.get("hf_model") and "run_dir" not in given:
        cfg = hf_model_config(pairs)
    else:
        cfg = run_config(pairs)
    return cfg, cfg.eval_batches if "eval_batches" in given else None


def run_config(pairs: list[tuple[str, str]]) -> Config:
    """The run's recorded config (its config.toml) with the allowed overrides."""
    given = dict(pairs)
    if not given.get("run_dir"):
        raise ConfigError(
            "evaluate needs run_dir=DIR (a run directory with a checkpoint) or hf_model=DIR "
            "dataset=D (a Hugging Face model directory as it is)"
        )
    run_dir = RunDir(given["run_dir"])
    check_allowed(pairs, ALLOWED, "run_dir=DIR", "(the model is the checkpoint's)")
    if not run_dir.config.is_file():
        raise ConfigError(f"{run_dir.path}: no config.toml, not a run directory of this package")
    cfg, _ = load_config(
        run_dir.config, [f"{key}={value}" for key, value in pairs if key != "run_dir"]
    )
    return dataclasses.replace(cfg, run_dir=str(run_dir.path), init_from="", compile=False)


def hf_model_config(pairs: list[tuple[str, str]]) -> Config:
    """model=hf with hf_model's pretrained weights on `dataset`; run_dir="": none is read."""
    check_allowed(pairs, HF_ALLOWED, "hf_model=DIR", "(the model is hf_model's)")
    if not dict(pairs).get("dataset"):
        raise ConfigError(
            "evaluate hf_model=DIR needs dataset=D: a token dataset made with the model's "
            "tokenizer (make-dataset --tokenizer DIR)"
        )
    items = ["model=hf", "hf_weights=pretrained", *(f"{k}={v}" for k, v in pairs)]
    cfg, _ = load_config(None, items)
    return dataclasses.replace(cfg, run_dir="", init_from="", compile=False)


def check_allowed(pairs: list[tuple[str, str]], allowed: set[str], mode: str, why: str) -> None:
    others = sorted({key for key, _ in pairs if key != "run_dir"} - allowed)
    if others:
        raise ConfigError(
            f"evaluate {mode} takes {', '.join(sorted(allowed))}; not {', '.join(others)} {why}"
        )


def recorded_data_info(run_dir: Path) -> dict:
    """What the newest checkpoint's model was told about its data (its recorded data_info:
    vocabulary, tokenizer). A damaged checkpoint is passed over here; the manager names it
    when it skips it too."""
    for path in complete_checkpoints(RunDir(run_dir).checkpoints):
        if verify(path):
            continue
        extra = read_checkpoint(path, lambda key: key == "train.extra").get("train.extra")
        return json.loads(extra or "{}").get("config", {}).get("data_info", {})
    return {}


def tokenizer_of(info: dict) -> str | None:
    """What made a token dataset's ids, in words; None where nothing says (pre-tokenised ids,
    synthetic tokens, not a token dataset)."""
    details = info.get("details") or {}
    if details.get("tokenizer") == "bytes":
        return "byte tokens"
    if details.get("tokenizer_sha256"):
        return f"the tokenizer {details['tokenizer_sha256'][:19]}"
    return None


def check_same_tokens(cfg: Config, trained: dict, info) -> None:
    """The dataset's ids must mean what they meant in training: the same vocabulary, and the
    same tokenizer where both datasets record theirs (same size, other ids: a plausible loss
    of nothing)."""
    vocab = info.vocab_size
    if trained.get("vocab_size") and vocab and vocab != trained["vocab_size"]:
        raise ConfigError(
            f"dataset {cfg.dataset} has {vocab} token ids, the model of {cfg.run_dir} was "
            f"trained on {trained['vocab_size']}: evaluate on data made with the run's tokenizer"
        )
    was, now = tokenizer_of(trained), tokenizer_of(dataclasses.asdict(info))
    if was and now and was != now:
        raise ConfigError(
            f"dataset {cfg.dataset} was made with {now}, the model of {cfg.run_dir} was trained "
            f"on data made with {was}: evaluate on data made with the run's tokenizer"
        )


def load_weights(cfg: Config, run, env, start: Start) -> dict:
    """The newest checkpoint of the run (a LoRA run's over its base), or hf_model's weights,
    into the model (`start`: checkpoint.start.open_start's); what the JSON line says about
    where they came from."""
    if not cfg.run_dir:
        load_start(start, run.model, run.spec, cfg, run.source.info)
        return {"hf_model": cfg.hf.hf_model}
    if not start.resume:
        raise ConfigError(f"{cfg.run_dir}: no complete checkpoint to evaluate")
    trained = recorded_data_info(Path(cfg.run_dir)) if env.is_main else None
    check_same_tokens(cfg, distributed.broadcast_object(trained), run.source.info)
    parts = run.checkpoint_parts()
    del parts["rng"]  # training's random states: nothing here draws (nor warns of reseeding)
    manager = checkpoint.CheckpointManager(
        RunDir(cfg.run_dir).checkpoints, parts, keep=cfg.keep_checkpoints
    )
    step, _, _ = load_start(start, run.model, run.spec, cfg, run.source.info, manager)
    if step is None:
        raise ConfigError(f"{cfg.run_dir}: no complete checkpoint to evaluate")
    adapters.record_base(run.state.extra, cfg)  # refused if not the checkpoint's
    return {"run_dir": cfg.run_dir, "step": step}


def run_evaluation(cfg: Config, limit: int | None = None) -> dict:
    """The JSON record of the evaluation (rank 0's; {} on the others)."""
    start = open_start(cfg, spec_of(cfg), cfg.run_dir)  # before any rank waits
    with distributed.process_group(cfg.dist_timeout_s, cfg.cpu_threads, cfg.device) as (env, dev):
        run = build(cfg, env, dev, start)
        result = load_weights(cfg, run, env, start)
        eval_set = data.eval_batches(run.source, cfg.batch_size, env.rank, env.world_size, limit)
        sums = evaluate(run, eval_set)
    unit = run.spec.task.unit
    result |= {"dataset": cfg.dataset, "split": "val", "ranks": env.world_size}
    result |= run.spec.task.report(sums)
    if "eval_bits_per_token" in result:
        result["perplexity"] = math.exp(min(result["eval_loss"], 700.0))
    result |= {
        f"scored_{unit}": round(sums["count"]),
        f"scoreable_{unit}": eval_set.scoreable,
        "scheme": eval_set.scheme,
    }
    return result if env.is_main else {}


def print_split(overrides: list[str]) -> int:
    """The validation split of dataset=D (or of run_dir=R's dataset) as text, decoded with the
    dataset's tokenizer, document by document as far as they go (it starts mid-document): the
    dataset's kind makes the text (DatasetKind.as_text)."""
    given = dict(split_assignment(item) for item in overrides)
    dataset = given.get("dataset")
    if not dataset and given.get("run_dir"):
        dataset = evaluation_config([f"run_dir={given['run_dir']}"])[0].dataset
    if not dataset or dataset == "synthetic":
        raise ConfigError("evaluate --print-split needs dataset=DIR (or run_dir=R): a directory")
    kind = kind_of_directory(Path(dataset))
    if kind.as_text is None:
        raise ConfigError(
            f"evaluate --print-split: dataset {dataset} holds {kind.name} data, which is not text"
        )
    for piece in kind.as_text(Path(dataset)):
        print(piece, end="", flush=True)
    print()
    return 0


def main(overrides: list[str], show_split: bool = False) -> int:
    if show_split:
        return print_split(overrides)
    result = run_evaluation(*evaluation_config(overrides))
    if result:
        print(json.dumps(result), flush=True)
    return 0


def add_arguments(cmd: argparse.ArgumentParser) -> None:
    cmd.add_argument(
        "overrides",
        nargs="*",
        metavar="key=value",
        help="run_dir=DIR{% if cookiecutter.workload in ("all", "language") %} or hf_model=DIR dataset=D{% endif %}; dataset=, eval_batches=, batch_size=, device=",
    )
    cmd.add_argument(
        "--print-split",
        action="store_true",
        help="print the validation split of dataset=D (or run_dir's) as text, evaluate nothing",
    )


def run(args: argparse.Namespace) -> int:
    return main(args.overrides, args.print_split)
