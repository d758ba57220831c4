"""torchrun, ending in one line when a signal stopped it. The job scripts start it as
`python -m <package>.run.torchrun ARGS`, with torchrun's own arguments.

torchrun forwards a stop signal (Slurm's USR2 before the time limit, scancel's TERM) to its
workers, which checkpoint and leave the REQUEUE marker, and then raises SignalException itself:
a page of traceback in the job log after a clean stop. Here that is one line, and the exit
status says which signal (128 + its number). A worker that fails makes torchrun raise
ChildFailedError, another page of traceback, and exit 1 whatever the worker's status: here it is
one line, and the exit status is the first failing worker's own (4: training diverged; 128 + the
signal that killed one).
"""

from __future__ import annotations

import sys

from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.run import main


def run(argv: list[str] | None = None) -> int:
    try:
        main(argv)
    except SignalException as err:
        print(
            f"torchrun: stopped by {err.sigval.name}, which it forwarded to the workers (their "
            "lines above say whether they checkpointed)",
            file=sys.stderr,
        )
        return 128 + int(err.sigval)
    except ChildFailedError as err:
        rank, failure = err.get_first_failure()
        status = failure.exitcode
        how = f"exited with status {status}"
        if status < 0:  # killed by a signal: as a shell says it
            status = 128 - status
            how = f"was killed by {failure.signal_name()} (exit status {status})"
        print(
            f"torchrun: worker rank {rank}, the first of its workers to fail, {how} (its lines "
            "above say why)",
            file=sys.stderr,
        )
        return status
    return 0


if __name__ == "__main__":
    sys.exit(run())
