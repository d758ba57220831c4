"""`python -m <pkg> keys`: every config key of every registered model and dataset kind, as the
markdown table of docs/training.md (config/settings.py)."""

from __future__ import annotations

import argparse


def add_arguments(cmd: argparse.ArgumentParser) -> None:
    pass


def run(args: argparse.Namespace) -> int:
    from ..config.settings import docs_table

    print(docs_table())
    return 0
