"""Fixtures of the real-Slurm tests (tests/test_slurm_e2e.py, tests/test_slurm_two_node.py),
registered for the whole suite by tests/conftest.py (`pytest_plugins`): the running clusters,
the baked repos' copies with their venvs, and the session's dataset."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import run
from slurm import harness, two_node
from slurm.jobs import Repo


def started_or_skip(cluster: harness.SlurmHarness, reason: str | None):
    """Start `cluster` (unless `reason` says why it cannot run) for a fixture, stop it after.
    Skip with the reason where it cannot start, or fail under ALPS_SLURM_REQUIRED=1."""
    required = os.environ.get("ALPS_SLURM_REQUIRED") == "1"
    if reason is None:
        try:
            cluster.start()
        except harness.HarnessUnavailable as exc:
            reason = str(exc)
        except BaseException:
            cluster.stop()  # a partly started one is torn down
            raise
    if reason is not None:
        cluster.stop()
        if required:
            pytest.fail(f"ALPS_SLURM_REQUIRED=1 but {reason}")
        pytest.skip(reason)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def slurm() -> Iterator[harness.SlurmHarness]:
    """The running single-node Slurm (started once, or reused); stopped at the end."""
    yield from started_or_skip(harness.SlurmHarness(), harness.unavailable_reason())


@pytest.fixture(scope="module")
def cluster() -> Iterator[two_node.TwoNodeHarness]:
    """The two-node cluster, for the module that asks for it; torn down (network included) at
    the module's end."""
    yield from started_or_skip(two_node.TwoNodeHarness(), two_node.unavailable_reason())


@pytest.fixture(scope="session")
def repo(bake, tmp_path_factory):
    """repo(name, flavour): a copy of the baked repo with its venv, made as the README says;
    once per session, for both clusters."""
    cache: dict[tuple[str, str], Repo] = {}

    def _repo(name: str, flavour: str) -> Repo:
        if (name, flavour) not in cache:
            # a copy: the session's baked repos are compared file by file by other tests
            baked = bake(name)
            path = tmp_path_factory.mktemp(f"slurm-{name}") / baked.name
            shutil.copytree(baked, path, symlinks=True)
            run(["bash", "scripts/setup_venv.sh", flavour, "--here"], cwd=path, timeout=600)
            cache[name, flavour] = Repo(name, flavour, path)
        return cache[name, flavour]

    return _repo


@pytest.fixture(scope="session")
def dataset(tmp_path_factory) -> Path:
    """Where the session's jobs find (the first one makes) the default stdlib-bytes dataset."""
    return tmp_path_factory.mktemp("datasets") / "stdlib-bytes"
