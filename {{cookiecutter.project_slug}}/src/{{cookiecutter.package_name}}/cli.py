"""Command line: `python -m <pkg> [train|benchmark|doctor|make-dataset|generate|evaluate|...]`
(the table of commands is commands.py) and the error boundary every command runs inside.

Exit status: 0 done, 3 stopped to be requeued (checkpoint written), 2 configuration or usage
error (a file name too long included), 4 training diverged (a NaN or inf loss or gradient norm:
no checkpoint of it, not requeued), 1 any other failure (including a run directory held by
another live job), 128 + the signal's number when a signal stopped a command before training's
own handlers took over.
"""

from __future__ import annotations

import difflib
import errno
import logging
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext

from .commands import COMMANDS, PROG, commands_parser, parse
from .config_keys import ConfigError, first_line
from .run.rundir import RunDirError, os_error_text

log = logging.getLogger(__package__)


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
    if argv and argv[0] in ("-h", "--help"):  # every command's line of help; argparse exits
        commands_parser().parse_args(argv)
    if (not argv or argv[0] not in COMMANDS) and "train" not in COMMANDS:
        # a repository without the training package (workload=program): nothing to default to
        print(f"{PROG}: error: name a command: {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    if not argv or argv[0] not in COMMANDS:
        argv.insert(0, "train")  # `python -m <pkg> --config ... key=value` trains
    name, command = argv[0], COMMANDS[argv[0]]
    if not logging.getLogger(__package__).handlers:
        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    try:
        with stopped_by_signals() if command.writes_files else nullcontext():
            return command.run(parse(argv))  # options and key=value in any order
    except KeyboardInterrupt as err:
        # A writer's temporary files are gone (see Stopped). Training handles its signals
        # itself; this is one that came before its handlers or after them (one Ctrl-C can
        # arrive twice), so its last complete checkpoint is where the same command resumes.
        signame = str(err) or "SIGINT"  # Ctrl-C's KeyboardInterrupt carries no name
        done = ""
        if command.writes_files:
            done = "; its temporary files were removed and nothing was written"
        elif name == "train":
            done = "; the same command resumes from its last complete checkpoint"
        print(f"{PROG} {name}: stopped ({signame}){done}", file=sys.stderr)
        return 128 + signal.Signals[signame].value
    except ConfigError as err:
        print(f"{PROG}: config error: {err}", file=sys.stderr)
        return 2
    # An `except` names its classes only when an error arrives: `loaded` gives those of the
    # modules the command imported (the others cannot have raised them).
    except loaded("data.directory.DatasetError") as err:
        print(f"{PROG} {name}: dataset error: {raised_in_a_worker(err)}", file=sys.stderr)
        return 2
    except loaded("telemetry.health.NonFinite") as err:  # a diverged run: not requeued
        if err.shown:  # rank 0's line; the other ranks exit with the same status
            log.error("%s", err)
        return err.exit_code  # 4
    # (telemetry/ named by its string: a bake without the training package has none)
    except (
        RunDirError,
        *loaded("telemetry.tracking.TrackerError", "distributed.LaunchError"),
    ) as err:
        print(f"{PROG} {name}: error: {err}", file=sys.stderr)
        return 1
    except (RuntimeError, OSError, ValueError) as err:
        report_failure(name, err)
        # a name longer than the file system takes is one the command line gave (run_dir=,
        # an input file; --out is checked when parsed): bad input
        return 2 if getattr(err, "errno", None) == errno.ENAMETOOLONG else 1
    except Exception:
        log.exception("failed")
        return 1


def report_failure(name: str, err: RuntimeError | OSError | ValueError) -> None:
    """One line for a command's failure; training's unexpected ones keep their traceback."""
    training = name in ("train", "benchmark")
    if training:
        from .distributed import is_collective_timeout, is_peer_lost  # loaded by training

        if is_collective_timeout(err):
            # also inside a checkpoint write (a CheckpointError naming the rank's timeout)
            log.error(
                "a collective did not complete within dist_timeout_s: another rank is hung or "
                "dead (its own lines say which); ending instead of holding the nodes (%s)",
                first_line(err),
            )
            return
        if is_peer_lost(err):
            log.error(
                "another rank's process ended during a collective (killed, out of memory or "
                "crashed: its own lines say which); this rank ends too (%s)",
                first_line(err),
            )
            return
    if isinstance(err, loaded("checkpoint.CheckpointError")):  # a checkpoint that cannot be used
        print(f"{PROG} {name}: error: {err}", file=sys.stderr)
    elif out_of_memory(err):
        print(
            f"{PROG} {name}: error: out of memory ({first_line(err)}): lower batch_size (raise "
            "grad_accum_steps to keep the global batch), or use activation_checkpointing=true / "
            "parallelism=fsdp",
            file=sys.stderr,
        )
    elif isinstance(err, OSError):  # ENOSPC, EACCES, EROFS, a file where a folder belongs
        print(f"{PROG} {name}: error: {os_error_text(err)}", file=sys.stderr)
    elif training:
        log.exception("failed")
    else:  # a one-line error for the small commands
        print(f"{PROG} {name}: error: {err}", file=sys.stderr)


def raised_in_a_worker(err: BaseException) -> str:
    """An error's own message, also when a loader process raised it: torch raises it again in
    the training process with "Caught ... in DataLoader worker process N" and the worker's
    traceback as its message, whose last line is the original `module.Class: message`."""
    text = str(err)
    if not (text.startswith("Caught ") and "\nOriginal Traceback" in text):
        return text
    return text.rstrip().splitlines()[-1].split(": ", 1)[-1]


def loaded(*names: str) -> tuple[type[BaseException], ...]:
    """The package's error classes ("data.directory.DatasetError") whose modules are loaded.
    Importing a module only to name its error would load torch into every command."""
    found = []
    for qualified in names:
        module, _, cls = qualified.rpartition(".")
        if (imported := sys.modules.get(f"{__package__}.{module}")) is not None:
            found.append(getattr(imported, cls))
    return tuple(found)


def out_of_memory(err: BaseException) -> bool:
    """A GPU (torch.OutOfMemoryError) or CPU allocation that failed. A command that never
    imported torch cannot have raised torch's error."""
    torch = sys.modules.get("torch")
    gpu = torch is not None and isinstance(err, torch.OutOfMemoryError)
    return gpu or "can't allocate memory" in str(err)
