"""The commands of `python -m <pkg>`, as a table: one `Command` each, with its name, its line of
help, the function that adds its arguments and the function that runs it. Both functions import
what they need when they are called, so a command line loads only its own command's parser and
modules (`train` never imports the dataset writers), and `--help` lists every command from this
table alone. A command of your own is two functions here and one entry in COMMANDS.

One argument style for every command: a directory a command works on is named like a config key,
`run_dir=DIR` (and `data_dir=DIR` for doctor), the spelling `train` takes, so one command line can
be copied from `train` to `generate`, `export`, `doctor` and `plot`; everything else is an
`--option`. Options and `key=value` items may come in any order (`train run_dir=x --config c.toml
dataset=y`), and `--config` may be repeated (the files merge in order).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .config_keys import ConfigError, integer_option, number_option, split_assignment
from .run.atomic import output_path

PROG = f"python -m {__package__}"


@dataclass(frozen=True)
class Command:
    """`add_arguments(parser)` adds the command's arguments; None: the command parses its own
    (doctor), and `run` finds them in `args.argv`. `run(args)` returns the exit status.
    `writes_files`: it writes through temporary names, so a stop signal must let it remove them
    (cli.Stopped)."""

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None] | None
    run: Callable[[argparse.Namespace], int]
    writes_files: bool = False


# ----------------------------------------------------------------------- shared argument types


def run_dir_argument(text: str) -> Path:
    """`run_dir=DIR`, the spelling of the training overrides."""
    try:
        key, value = split_assignment(text)
    except ConfigError:
        key, value = "", ""
    if key != "run_dir" or not value:
        raise argparse.ArgumentTypeError(f"expected run_dir=DIR, got {text[:80]!r}")
    return Path(value)


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


# ------------------------------------------------------------------------ train and benchmark


def add_train(cmd: argparse.ArgumentParser) -> None:
    add_config_arguments(cmd)
    cmd.add_argument(
        "--job-default",
        action="append",
        default=[],
        metavar="key=value",
        help="a value below every config file: how the job scripts give dataset its default",
    )


def train(args: argparse.Namespace) -> int:
    from .config.settings import load_config
    from .train import train

    return train(*load_config(args.config, args.overrides, args.job_default))


def add_benchmark(cmd: argparse.ArgumentParser) -> None:
    from .models import MODELS

    add_config_arguments(cmd)
    cmd.add_argument(
        "--size",
        choices=("default", "large"),
        default="default",
        help="large: the 75M-parameter MLP (model=mlp, 1024 -> 8192 -> 8192)",
    )
    cmd.add_argument("--model", choices=tuple(MODELS), help="same as model=...")
    cmd.add_argument("--preset", help="same as preset=..., e.g. gpt2-124m")


def benchmark(args: argparse.Namespace) -> int:
    from .benchmark import SIZES, main
    from .config.settings import load_config

    extra = SIZES[args.size] + [f"model={args.model}"] * bool(args.model)
    extra += [f"preset={args.preset}"] * bool(args.preset)
    return main(load_config(args.config, extra + args.overrides).config)


# --------------------------------------------------------------------------------------- doctor

# The directory settings written key=value, and the option doctor's own parser reads for each.
DIRECTORY_KEYS = {"run_dir": "--run-dir", "data_dir": "--data-dir"}


def directory_options(argv: list[str]) -> list[str]:
    """doctor's arguments for its own parser: `run_dir=DIR` -> `--run-dir DIR`."""
    result = []
    for item in argv:
        if item.startswith("-") or "=" not in item:  # an option (--timeout-s=2) or its value
            result.append(item)
            continue
        key, value = split_assignment(item)
        result += [DIRECTORY_KEYS[key], value] if key in DIRECTORY_KEYS else [item]
    return result


def doctor(args: argparse.Namespace) -> int:
    from .doctor import preflight

    return preflight.main(args.argv)


# --------------------------------------------------------------------- datasets and tokenizers


def add_make_dataset(cmd: argparse.ArgumentParser) -> None:
    from .data import sources

    cmd.add_argument("--out", type=output_path, required=True, help="directory to write")
    source = sources.add_arguments(cmd)  # --stdlib, --text, --tokens, --hf, yours
    source.add_argument("--x", type=Path, help="MLP: inputs .npy (N, features)")
    cmd.add_argument("--y", type=Path, help="MLP: integer labels .npy (N,)")
    cmd.add_argument("--samples", type=integer_option, default=16384, help="MLP synthetic: samples")
    cmd.add_argument(
        "--features", type=integer_option, default=64, help="MLP synthetic: input features"
    )
    cmd.add_argument(
        "--classes",
        type=integer_option,
        help="MLP: number of classes (synthetic: 10; .npy: max label + 1)",
    )
    cmd.add_argument("--seed", type=integer_option, default=1234, help="MLP synthetic: seed")


def make_dataset(args: argparse.Namespace) -> int:
    from .data import sources

    source = sources.chosen(args)
    if source is None:
        return make_array_dataset(args)
    print(source.summary(source.write(args), args))
    return 0


def make_array_dataset(args: argparse.Namespace) -> int:
    import numpy as np

    from .data.arrays import synthetic_arrays, write_dataset

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


def add_train_tokenizer(cmd: argparse.ArgumentParser) -> None:
    from .data.hf_datasets import add_train_tokenizer

    add_train_tokenizer(cmd)


def train_tokenizer(args: argparse.Namespace) -> int:
    from .data.hf_datasets import train_tokenizer_command

    return train_tokenizer_command(args)


# ----------------------------------------------------------------- what a run's checkpoint does


def add_generate(cmd: argparse.ArgumentParser) -> None:
    cmd.add_argument("run", type=run_dir_argument, metavar="run_dir=DIR", help="the run directory")
    prompt = cmd.add_mutually_exclusive_group()
    prompt.add_argument("--prompt", default="\n", help="text to continue")
    prompt.add_argument(
        "--chat", metavar="MESSAGE", help="a user's message, in the tokenizer's chat template"
    )
    cmd.add_argument(
        "--tokens", type=integer_option, default=200, help="number of tokens to generate"
    )
    cmd.add_argument("--temperature", type=number_option, default=0.8)
    cmd.add_argument("--top-k", type=integer_option, default=200)
    cmd.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    cmd.add_argument("--seed", type=integer_option, default=0)
    cmd.add_argument(
        "--tokenizer", type=Path, help="tokenizer.json (default: the one in the run's dataset)"
    )


def generate(args: argparse.Namespace) -> int:
    """Print the text as it is sampled; Ctrl-C stops and keeps what was printed."""
    from .generate import stream

    pieces = stream(
        args.run,
        args.prompt if args.chat is None else args.chat,
        args.tokens,
        args.temperature,
        args.top_k,
        args.device,
        args.seed,
        args.tokenizer,
        args.chat is not None,
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


def add_evaluate(cmd: argparse.ArgumentParser) -> None:
    cmd.add_argument(
        "overrides",
        nargs="*",
        metavar="key=value",
        help="run_dir=DIR or hf_model=DIR dataset=D; dataset=, eval_batches=, batch_size=, device=",
    )
    cmd.add_argument(
        "--print-split",
        action="store_true",
        help="print the validation split of dataset=D (or run_dir's) as text, evaluate nothing",
    )


def evaluate(args: argparse.Namespace) -> int:
    from .evaluate import main

    return main(args.overrides, args.print_split)


def add_export(cmd: argparse.ArgumentParser) -> None:
    cmd.add_argument("run", type=run_dir_argument, metavar="run_dir=DIR", help="the run directory")
    cmd.add_argument(
        "--out",
        type=output_path,
        required=True,
        help="model.pt, model.safetensors, or a new directory",
    )
    cmd.add_argument(
        "--format",
        choices=("file", "hf", "peft"),
        default="file",
        help="file: one state dict (.pt/.safetensors); hf: a directory transformers loads; "
        "peft: a LoRA run's adapters, a directory peft loads onto the base",
    )


def export(args: argparse.Namespace) -> int:
    if args.format == "hf":
        from .checkpoint.export_hf import export_hf

        print(f"wrote {export_hf(args.run, args.out)}")
        return 0
    if args.format == "peft":
        from .checkpoint.export_peft import export_peft

        print(f"wrote {export_peft(args.run, args.out)}")
        return 0
    from .checkpoint import export_model

    print(f"wrote {export_model(args.run, args.out)}")
    return 0


# ------------------------------------------------------------------------- metrics and config


def plot_source(text: str) -> Path:
    """`run_dir=DIR`, or a metrics.jsonl file."""
    return Path(text) if Path(text).is_file() else run_dir_argument(text)


def add_plot(cmd: argparse.ArgumentParser) -> None:
    cmd.add_argument(
        "path",
        type=plot_source,
        metavar="run_dir=DIR",
        help="the run directory (or a metrics.jsonl)",
    )
    cmd.add_argument("--out", type=output_path, help="PNG file (default: next to metrics.jsonl)")


def plot(args: argparse.Namespace) -> int:
    from .telemetry.metrics import plot

    print(f"wrote {plot(args.path, args.out)}")
    return 0


def add_compare(cmd: argparse.ArgumentParser) -> None:
    cmd.add_argument(
        "runs", type=run_dir_argument, nargs="+", metavar="run_dir=DIR", help="two runs or more"
    )
    help = "PNG file, or a directory for compare.png (default: the first run's directory)"
    cmd.add_argument("--out", type=output_path, help=help)


def compare(args: argparse.Namespace) -> int:
    from .telemetry.compare import compare

    text, out = compare(args.runs, args.out)
    print(f"{text}\nwrote {out}")
    return 0


def keys(args: argparse.Namespace) -> int:
    from .config.settings import docs_table

    print(docs_table())
    return 0


def no_arguments(cmd: argparse.ArgumentParser) -> None:
    pass


COMMANDS = {
    command.name: command
    for command in (
        Command("train", "train, or resume from the newest checkpoint (default)", add_train, train),
        Command(
            "benchmark",
            "time the training step against a bare loop (JSON)",
            add_benchmark,
            benchmark,
        ),
        Command("doctor", "check this node's environment, then all-reduce bandwidth", None, doctor),
        Command(
            "make-dataset",
            "write a dataset directory",
            add_make_dataset,
            make_dataset,
            writes_files=True,
        ),
        Command(
            "train-tokenizer",
            "train a byte-level BPE tokenizer on text",
            add_train_tokenizer,
            train_tokenizer,
            writes_files=True,
        ),
        Command("generate", "sample text from a run's newest checkpoint", add_generate, generate),
        Command(
            "evaluate",
            "loss, bits per token and perplexity of a run or a Hugging Face dir (JSON)",
            add_evaluate,
            evaluate,
        ),
        Command(
            "export",
            "the model of a run's newest checkpoint: one file, or a Hugging Face dir",
            add_export,
            export,
            writes_files=True,
        ),
        Command("plot", "PNG of loss and throughput from metrics.jsonl", add_plot, plot),
        Command("compare", "runs side by side: one table, one PNG", add_compare, compare),
        Command(
            "keys",
            "every config key of every registered model (markdown table)",
            no_arguments,
            keys,
        ),
    )
}


def commands_parser() -> argparse.ArgumentParser:
    """`python -m <pkg> --help`: every command with its line of help, none of their arguments."""
    parser = argparse.ArgumentParser(prog=PROG, description="Training on CPU or GPU.")
    sub = parser.add_subparsers(dest="command", metavar="{" + ",".join(COMMANDS) + "}")
    for command in COMMANDS.values():
        sub.add_parser(command.name, help=command.help)
    return parser


def parse(argv: list[str]) -> argparse.Namespace:
    """Parse `argv` (argv[0] is the command) with options and `key=value` in any order; only that
    command's parser is built. A ConfigError names a `key=value` item that is not one."""
    command, rest = COMMANDS[argv[0]], argv[1:]
    if command.add_arguments is None:
        return argparse.Namespace(command=command.name, argv=directory_options(rest))
    parser = argparse.ArgumentParser(prog=f"{PROG} {command.name}")
    command.add_arguments(parser)
    return parser.parse_intermixed_args(rest, argparse.Namespace(command=command.name))
