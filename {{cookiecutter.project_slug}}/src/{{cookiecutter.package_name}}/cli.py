"""Command line: `python -m <pkg> [train|benchmark|doctor|make-dataset|generate|evaluate|...]`
(and `export`, `plot`, `train-tokenizer`).

Exit status: 0 done, 3 stopped to be requeued (checkpoint written), 2 configuration or usage
error, 1 any other failure (including a run directory held by another live job).
"""

from __future__ import annotations

import argparse
import difflib
import logging
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from . import arguments
from .config.settings import ConfigError, load_config
from .config_keys import first_line
from .data import hf as hf_data
from .data import sources as dataset_sources
from .distributed import LaunchError, is_collective_timeout, is_peer_lost
from .models import MODELS
from .run.rundir import os_error_text

log = logging.getLogger(__package__)

COMMANDS = (
    "train",
    "benchmark",
    "doctor",
    "make-dataset",
    "train-tokenizer",
    "generate",
    "evaluate",
    "export",
    "plot",
    "compare",
    "keys",
)
PROG = f"python -m {__package__}"


def add_config_arguments(cmd: argparse.ArgumentParser) -> None:
    cmd.add_argument(
        "--config",
        type=Path,
        action="append",
        help="TOML file, e.g. configs/tiny.toml; repeat it to merge several, in order",
    )
    cmd.add_argument(
        "overrides",
        nargs="*",
        metavar="key=value",
        help="override config keys, e.g. max_steps=100 run_dir=runs/a",
    )


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description="Training on CPU or GPU.")
    sub = parser.add_subparsers(dest="command", metavar="{" + ",".join(COMMANDS) + "}")
    train = sub.add_parser("train", help="train, or resume from the newest checkpoint (default)")
    add_config_arguments(train)
    train.add_argument(
        "--job-default",
        action="append",
        default=[],
        metavar="key=value",
        help="a value below every config file: how the job scripts give dataset its default",
    )
    bench = sub.add_parser("benchmark", help="time the training step against a bare loop (JSON)")
    add_config_arguments(bench)
    bench.add_argument(
        "--size",
        choices=("default", "large"),
        default="default",
        help="large: the 75M-parameter MLP (model=mlp, 1024 -> 8192 -> 8192)",
    )
    bench.add_argument("--model", choices=tuple(MODELS), help="same as model=...")
    bench.add_argument("--preset", help="same as preset=..., e.g. gpt2-124m")
    sub.add_parser(
        "doctor", help="check this node's environment, then all-reduce bandwidth", add_help=False
    )
    make = sub.add_parser("make-dataset", help="write a dataset directory")
    make.add_argument("--out", type=Path, required=True, help="directory to write")
    source = dataset_sources.add_arguments(make)  # --stdlib, --text, --tokens, --hf, yours
    source.add_argument("--x", type=Path, help="MLP: inputs .npy (N, features)")
    make.add_argument("--y", type=Path, help="MLP: integer labels .npy (N,)")
    make.add_argument("--samples", type=int, default=16384, help="MLP synthetic: samples")
    make.add_argument("--features", type=int, default=64, help="MLP synthetic: input features")
    make.add_argument(
        "--classes", type=int, help="MLP: number of classes (synthetic: 10; .npy: max label + 1)"
    )
    make.add_argument("--seed", type=int, default=1234, help="MLP synthetic: seed")
    hf_data.add_train_tokenizer(sub)
    gen = sub.add_parser("generate", help="sample text from a run's newest checkpoint")
    gen.add_argument("run", type=run_dir_argument, metavar="run_dir=DIR", help="the run directory")
    gen.add_argument("--prompt", default="\n", help="text to continue")
    gen.add_argument("--tokens", type=int, default=200, help="number of tokens to generate")
    gen.add_argument("--temperature", type=float, default=0.8)
    gen.add_argument("--top-k", type=int, default=200)
    gen.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument(
        "--tokenizer", type=Path, help="tokenizer.json (default: the one in the run's dataset)"
    )
    evaluate = sub.add_parser(
        "evaluate", help="loss, bits per token and perplexity of a run's newest checkpoint (JSON)"
    )
    evaluate.add_argument(
        "overrides",
        nargs="*",
        metavar="key=value",
        help="run_dir=DIR (required); dataset=, eval_batches=, batch_size=, device=",
    )
    export = sub.add_parser(
        "export", help="the model of a run's newest checkpoint: one file, or a Hugging Face dir"
    )
    export.add_argument(
        "run", type=run_dir_argument, metavar="run_dir=DIR", help="the run directory"
    )
    export.add_argument(
        "--out", type=Path, required=True, help="model.pt, model.safetensors, or a new directory"
    )
    export.add_argument(
        "--format",
        choices=("file", "hf"),
        default="file",
        help="file: one state dict (.pt/.safetensors); hf: a directory transformers loads",
    )
    plot = sub.add_parser("plot", help="PNG of loss and throughput from metrics.jsonl")
    plot.add_argument(
        "path",
        type=plot_source,
        metavar="run_dir=DIR",
        help="the run directory (or a metrics.jsonl)",
    )
    plot.add_argument("--out", type=Path, help="PNG file (default: next to metrics.jsonl)")
    sub.add_parser("keys", help="every config key of every registered model (markdown table)")
    compare = sub.add_parser("compare", help="runs side by side: one table, one PNG")
    compare.add_argument(
        "runs", type=run_dir_argument, nargs="+", metavar="run_dir=DIR", help="two runs or more"
    )
    compare.add_argument(
        "--out", type=Path, default=Path("compare.png"), help="PNG file (default: compare.png)"
    )
    parser.subcommands = dict(sub.choices)  # each subcommand's parser, for arguments.parse
    return parser


def run_dir_argument(text: str) -> Path:
    """`run_dir=DIR`, the spelling of the training overrides."""
    key, _, value = text.partition("=")
    if key != "run_dir" or not value:
        raise argparse.ArgumentTypeError(f"expected run_dir=DIR, got {text[:80]!r}")
    return Path(value)


def plot_source(text: str) -> Path:
    """`run_dir=DIR`, or a metrics.jsonl file."""
    return Path(text) if Path(text).is_file() else run_dir_argument(text)


def make_dataset(args: argparse.Namespace) -> int:
    source = dataset_sources.chosen(args)
    if source is None:
        return make_array_dataset(args)
    index = source.write(args)
    print(
        f"wrote {index['train']['tokens']} training and {index['val']['tokens']} validation "
        f"tokens (vocabulary {index['vocab_size']}) to {args.out}; train with dataset={args.out}"
    )
    return 0


def make_array_dataset(args: argparse.Namespace) -> int:
    import numpy as np

    from .data.batches import synthetic_arrays, write_dataset

    if (args.x is None) != (args.y is None):
        raise ConfigError("make-dataset needs both --x and --y, or neither (synthetic data)")
    if args.x is not None:
        x, y = np.load(args.x, mmap_mode="r"), np.load(args.y, mmap_mode="r")
        classes = args.classes  # None: the largest label + 1
    else:
        classes = args.classes or 10
        x, y = synthetic_arrays(args.samples, args.features, classes, args.seed)
    out = write_dataset(args.out, x, y, classes)
    print(f"wrote {len(x)} samples x {x.shape[1]} features to {out} (model=mlp dataset={out})")
    return 0


def generate_command(args: argparse.Namespace) -> int:
    """Print the text as it is sampled; Ctrl-C stops and keeps what was printed."""
    from .generate import stream

    pieces = stream(
        args.run,
        args.prompt,
        args.tokens,
        args.temperature,
        args.top_k,
        args.device,
        args.seed,
        args.tokenizer,
    )
    printed = False
    try:
        for piece in pieces:
            print(piece, end="", flush=True)
            printed = True
    except KeyboardInterrupt:
        print(flush=True)
        what = "the text above is what was sampled" if printed else "nothing was sampled yet"
        print(f"{PROG} generate: stopped (Ctrl-C); {what}", file=sys.stderr)
        return 130
    print()
    return 0


# Commands that write files through a temporary name: a stop signal must let them clean up.
WRITERS = ("make-dataset", "train-tokenizer", "export")


class Stopped(KeyboardInterrupt):
    """SIGTERM (scancel, a job's time limit) or SIGHUP while a command writes files: raised like
    Ctrl-C's KeyboardInterrupt, so every writer's cleanup (`finally`) runs on the way out."""


@contextmanager
def stopped_by_signals() -> Iterator[None]:
    def stop(signum, frame):
        raise Stopped(signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def dispatch(args: argparse.Namespace, argv: list[str]) -> int:
    if args.command == "make-dataset":
        return make_dataset(args)
    if args.command == "train-tokenizer":
        return hf_data.train_tokenizer_command(args)
    if args.command == "doctor":
        from .doctor.preflight import main as doctor

        return doctor(args.doctor_argv)
    if args.command == "generate":
        return generate_command(args)
    if args.command == "evaluate":
        from .evaluate import main as run_evaluate

        return run_evaluate(args.overrides)
    if args.command == "export":
        if args.format == "hf":
            from .checkpoint.export_hf import export_hf

            print(f"wrote {export_hf(args.run, args.out)}")
            return 0
        from .checkpoint import export_model

        print(f"wrote {export_model(args.run, args.out)}")
        return 0
    if args.command == "keys":
        from .config.settings import docs_table

        print(docs_table())
        return 0
    if args.command == "compare":
        from .telemetry.compare import compare

        text, out = compare(args.runs, args.out)
        print(f"{text}\nwrote {out}")
        return 0
    if args.command == "plot":
        from .telemetry.metrics import plot

        print(f"wrote {plot(args.path, args.out)}")
        return 0
    overrides = list(args.overrides)
    if args.command == "benchmark":
        from .benchmark import SIZES
        from .benchmark import main as run_benchmark

        extra = SIZES[args.size] + [f"model={args.model}"] * bool(args.model)
        extra += [f"preset={args.preset}"] * bool(args.preset)
        return run_benchmark(load_config(args.config, extra + overrides).config)
    from .train import train

    return train(*load_config(args.config, overrides, args.job_default))


def unknown_command(word: str) -> str | None:
    """Why `word` (the first argument) cannot start a command line, or None. A bare word that
    is neither a command nor an option nor a key=value override is a mistyped command."""
    if word in COMMANDS or word.startswith("-") or "=" in word:
        return None
    close = difflib.get_close_matches(word, COMMANDS, n=1)
    hint = f" (did you mean {close[0]}?)" if close else ""
    return f"unknown command {word[:60]!r}{hint}; choose from {', '.join(COMMANDS)}"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and unknown_command(argv[0]):
        print(f"{PROG}: error: {unknown_command(argv[0])}", file=sys.stderr)
        return 2
    if not argv or (argv[0] not in COMMANDS and argv[0] not in ("-h", "--help")):
        argv.insert(0, "train")  # `python -m <pkg> --config ... key=value` trains
    args = arguments.parse(make_parser(), argv)  # options and key=value in any order
    if not logging.getLogger(__package__).handlers:
        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    from .data.tokens import DatasetError
    from .run.rundir import RunDirError
    from .telemetry.tracking import TrackerError

    try:
        if args.command not in WRITERS:
            return dispatch(args, argv)
        with stopped_by_signals():
            return dispatch(args, argv)
    except KeyboardInterrupt as err:
        # A writer's temporary files are gone (see Stopped). Training handles its signals
        # itself; this is one that came before its handlers or after them (one Ctrl-C can
        # arrive twice), so its last complete checkpoint is where the same command resumes.
        name = str(err) or "SIGINT"  # Ctrl-C's KeyboardInterrupt carries no name
        done = {
            "train": "the same command resumes from its last complete checkpoint",
            **dict.fromkeys(WRITERS, "its temporary files were removed and nothing was written"),
        }.get(args.command)
        print(
            f"{PROG} {args.command}: stopped ({name})" + (f"; {done}" if done else ""),
            file=sys.stderr,
        )
        return 128 + signal.Signals[name].value
    except ConfigError as err:
        print(f"{PROG}: config error: {err}", file=sys.stderr)
        return 2
    except DatasetError as err:
        print(f"{PROG} {args.command}: dataset error: {err}", file=sys.stderr)
        return 2
    except (LaunchError, RunDirError, TrackerError) as err:
        print(f"{PROG} {args.command}: error: {err}", file=sys.stderr)
        return 1
    except (RuntimeError, OSError, ValueError) as err:
        if args.command in ("train", "benchmark") and is_collective_timeout(err):
            # also inside a checkpoint write (a CheckpointError naming the rank's timeout)
            logging.getLogger(__package__).error(
                "a collective did not complete within dist_timeout_s: another rank is hung or "
                "dead (its own lines say which); ending instead of holding the nodes (%s)",
                first_line(err),
            )
        elif args.command in ("train", "benchmark") and is_peer_lost(err):
            logging.getLogger(__package__).error(
                "another rank's process ended during a collective (killed, out of memory or "
                "crashed: its own lines say which); this rank ends too (%s)",
                first_line(err),
            )
        elif isinstance(err, checkpoint_error()):  # a checkpoint that cannot be used
            print(f"{PROG} {args.command}: error: {err}", file=sys.stderr)
        elif out_of_memory(err):
            print(
                f"{PROG} {args.command}: error: out of memory ({first_line(err)}): lower "
                "batch_size (raise grad_accum_steps to keep the global batch), or use "
                "activation_checkpointing=true / parallelism=fsdp",
                file=sys.stderr,
            )
        elif isinstance(err, OSError):  # ENOSPC, EACCES, EROFS, a file where a folder belongs
            print(f"{PROG} {args.command}: error: {os_error_text(err)}", file=sys.stderr)
        elif args.command in ("train", "benchmark"):
            logging.getLogger(__package__).exception("failed")
        else:  # a one-line error for the small commands
            print(f"{PROG} {args.command}: error: {err}", file=sys.stderr)
        return 1
    except Exception:
        logging.getLogger(__package__).exception("failed")
        return 1


def checkpoint_error() -> type[Exception]:
    """The checkpoint package's error, imported only once something has failed: the package
    loads torch's distributed checkpointing (about a second), which only training needs."""
    from .checkpoint import CheckpointError

    return CheckpointError


def out_of_memory(err: BaseException) -> bool:
    """A GPU (torch.OutOfMemoryError) or CPU allocation that failed."""
    text = str(err)
    return isinstance(err, torch.OutOfMemoryError) or "can't allocate memory" in text
