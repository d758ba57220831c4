"""The Slurm clusters of one test session never share a job id, and a job's log never counts
another job's lines (tests/slurm/README.md, "What the two clusters share"). No daemon runs here:
these check the configurations the harnesses write and the log reader the Slurm tests use."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from slurm.harness import SlurmHarness
from slurm.jobs import JOB_HEADER, Repo, Submission
from slurm.two_node import TwoNodeHarness

HARNESSES = (SlurmHarness, TwoNodeHarness)


def job_id_range(harness: SlurmHarness) -> range:
    """The ids the slurm.conf the harness writes lets slurmctld hand out."""
    conf = next(
        text for path, text in harness._render_config().items() if path.name == "slurm.conf"
    )
    first = int(re.search(r"^FirstJobId=(\d+)$", conf, re.MULTILINE).group(1))
    last = int(re.search(r"^MaxJobId=(\d+)$", conf, re.MULTILINE).group(1))
    return range(first, last + 1)


def test_each_cluster_hands_out_job_ids_of_its_own(tmp_path):
    ranges = [job_id_range(cls(state_dir=tmp_path / cls.__name__)) for cls in HARNESSES]
    assert all(len(r) >= 10_000 for r in ranges)
    first, second = ranges
    assert first.stop <= second.start or second.stop <= first.start, ranges
    # and with the ids their MASTER_PORT (jobs/common.sh: 15000 + id % 15000) for 5000 jobs
    ports = [{15000 + i % 15000 for i in r[:5000]} for r in ranges]
    assert not ports[0] & ports[1]


def submission(tmp_path: Path, job_id: int, log: str) -> Submission:
    repo = Repo("default", "container", tmp_path)
    (tmp_path / "logs").mkdir(exist_ok=True)
    sub = Submission(None, repo, job_id, tmp_path)
    sub.log.write_text(log)
    return sub


def test_a_log_with_another_jobs_lines_is_reported_not_counted(tmp_path):
    mine = "== job 100007 start 1 on nid001 at 2026-01-01T00:00:00Z\n0: [rank0] INFO step 1/40\n"
    assert submission(tmp_path, 100007, mine).text() == mine
    requeued = mine + mine.replace("start 1", "start 2")
    assert submission(tmp_path, 100007, requeued).text() == requeued
    stray = mine.replace("100007", "200007") + mine
    with pytest.raises(AssertionError, match=r"holds lines of job\(s\) \[200007\], not only"):
        submission(tmp_path, 100007, stray).text()


def test_the_job_scripts_write_the_header_the_tests_read():
    common = Path(__file__).resolve().parent.parent / "{{cookiecutter.project_slug}}/jobs/common.sh"
    echo = next(line for line in common.read_text().splitlines() if line.startswith('echo "== job'))
    line = echo.replace("${SLURM_JOB_ID}", "123").replace("$((${SLURM_RESTART_COUNT:-0} + 1))", "2")
    assert JOB_HEADER.match(line.removeprefix('echo "')), echo
