"""torchrun, ending in one line when a signal stopped it. The job scripts start it as
`python -m <package>.run.torchrun ARGS`, with torchrun's own arguments.

torchrun forwards a stop signal (Slurm's USR2 before the time limit, scancel's TERM) to its
workers, which checkpoint and leave the REQUEUE marker, and then raises SignalException itself:
a page of traceback in the job log after a clean stop. Here that is one line, and the exit
status says which signal (128 + its number). Any other failure is torchrun's own report.
"""

from __future__ import annotations

import sys

from torch.distributed.elastic.multiprocessing.api import SignalException
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
    return 0


if __name__ == "__main__":
    sys.exit(run())
