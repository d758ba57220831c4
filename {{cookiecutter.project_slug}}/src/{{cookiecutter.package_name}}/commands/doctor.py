"""`python -m <pkg> doctor [--quick] [run_dir=DIR data_dir=DIR]`: the node's preflight checks
(doctor/preflight.py parses its own arguments)."""

from __future__ import annotations

import argparse

from ..config_keys import split_assignment

# The directory settings written key=value, and the option doctor's own parser reads for each.
DIRECTORY_KEYS = {"run_dir": "--run-dir", "data_dir": "--data-dir"}


def own_arguments(argv: list[str]) -> list[str]:
    """doctor's arguments for its own parser: `run_dir=DIR` -> `--run-dir DIR`."""
    result = []
    for item in argv:
        if item.startswith("-") or "=" not in item:  # an option (--timeout-s=2) or its value
            result.append(item)
            continue
        key, value = split_assignment(item)
        result += [DIRECTORY_KEYS[key], value] if key in DIRECTORY_KEYS else [item]
    return result


def run(args: argparse.Namespace) -> int:
    from ..doctor import preflight

    return preflight.main(args.argv)
