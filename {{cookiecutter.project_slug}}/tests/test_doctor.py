"""`doctor`: every check finds its planted fault; two gloo ranks report the all-reduce figure."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import PACKAGE, REPO, TIMEOUT_S, free_port, one_line, rank_env

from {{ cookiecutter.package_name }}.doctor import bandwidth, checks, storage, vision
from {{ cookiecutter.package_name }}.doctor import preflight as doctor
from {{ cookiecutter.package_name }}.doctor.checks import FAIL, OK, WARN

ALPS_FABRIC_ENV = {
    "NCCL_NET": "AWS Libfabric",
    "NCCL_NET_GDR_LEVEL": "PHB",
    "NCCL_PROTO": "^LL128",
    "FI_CXI_DEFAULT_CQ_SIZE": "131072",
    "FI_CXI_DEFAULT_TX_SIZE": "16384",
    "FI_CXI_DISABLE_HOST_REGISTER": "1",
    "FI_MR_CACHE_MONITOR": "userfaultfd",
}
PLUGIN = "/user-environment/env/default/lib/libnccl-net.so"


def run_doctor(args: list[str], log_dir: Path, world: int = 2, extra_env=None):
    """`world` ranks of the doctor as gloo subprocesses; (exit codes, output of each rank)."""
    port, procs, logs = free_port(), [], []
    for rank in range(world):
        env = rank_env(rank, world, port)
        logs.append(Path(log_dir) / f"doctor-rank{rank}.log")
        with open(logs[-1], "w") as out:
            cmd = [sys.executable, "-m", PACKAGE, "doctor", "--device", "cpu", *args]
            env |= extra_env or {}
            procs.append(subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=out))
    try:
        codes = [p.wait(TIMEOUT_S) for p in procs]
    except subprocess.TimeoutExpired:
        for p in procs:
            p.send_signal(signal.SIGKILL)
        pytest.fail(f"doctor did not finish in {TIMEOUT_S} s:\n{logs[0].read_text()}")
    return codes, [log.read_text() for log in logs]


# --------------------------------------------------------------------------- whole command


def test_two_ranks_report_allreduce_bandwidth_and_pass(tmp_path):
    args = ["--quick", "--run-dir", str(tmp_path / "run"), "--data-dir", str(tmp_path)]
    codes, (out, out1) = run_doctor(args, tmp_path)
    assert codes == [0, 0], out
    assert out1 == ""  # only rank 0 prints
    rows = [line.split() for line in out.splitlines() if line.strip().startswith("64 MiB")]
    assert len(rows) == 1, out
    size, unit, time_ms, algbw, busbw = rows[0]
    # 2 ranks: busbw = algbw * 2(n-1)/n = algbw
    assert float(busbw) > 0 and float(busbw) == pytest.approx(float(algbw), abs=0.011)
    assert "OK    allreduce    busbw" in out
    assert "2 rank(s) on 1 node(s)" in out
    assert "FAIL" not in out.replace("0 FAIL", "")
    assert not (tmp_path / "run").exists()  # checking a directory does not create it


def test_planted_faults_fail_naming_them(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    args = ["--quick", "--sizes", "1M", "--run-dir", str(blocker / "run")]
    codes, (out, _) = run_doctor(args, tmp_path, extra_env={"NCCL_NET": "Socket"})
    assert codes == [1, 1], out
    assert "FAIL  nccl_net     NCCL_NET='Socket': NCCL would use TCP sockets" in out
    assert f"FAIL  run_dir      run_dir {blocker / 'run'}" in out
    assert "[all 2 ranks on " in out  # one line for both ranks
    assert "doctor: 2 FAIL" in out
    assert "busbw" in out  # the bandwidth test still ran


def test_expected_bandwidth_is_compared(tmp_path):
    """--expect-busbw far above what gloo reaches: a WARN, and still exit 0."""
    args = ["--sizes", "1M", "--expect-busbw", "100000"]
    codes, (out, _) = run_doctor(args, tmp_path)
    assert codes == [0, 0], out
    assert "WARN  allreduce" in out and "below half of the 100000 GB/s expected" in out


def test_a_rank_that_cannot_join_writes_its_lines_in_one_piece(monkeypatch, tmp_path):
    """Rank 0 alone (rank 1 never comes): its error and its FAIL lines in one write, which
    another rank's lines cannot cut into where the ranks share a log (torchrun's workers):
    print() writes each line's text and its newline apart."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    env = {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": free_port()}
    for name, value in env.items():
        monkeypatch.setenv(name, str(value))
    writes: list[str] = []
    stderr = argparse.Namespace(write=writes.append, flush=lambda: None)
    monkeypatch.setattr(sys, "stderr", stderr)
    args = ["--device", "cpu", "--timeout-s", "2", "--run-dir", str(blocker / "run")]
    assert doctor.main(args) == 1
    (said,) = [text for text in writes if "rank 0 on" in text]
    assert said.endswith("\n") and f"FAIL  run_dir      run_dir {blocker / 'run'}" in said, said


def test_venv_shadowing_the_image_torch_fails(single_process, monkeypatch, tmp_path, capsys):
    venv = tmp_path / "venv"
    (venv / "lib/python3/site-packages/torch").mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\ninclude-system-site-packages = true\n")
    monkeypatch.setattr(sys, "prefix", str(venv))
    fake_torch = venv / "lib/python3/site-packages/torch/__init__.py"
    monkeypatch.setattr(doctor.torch, "__file__", str(fake_torch))
    assert doctor.main(["--device", "cpu", "--run-dir", str(tmp_path / "run")]) == 1
    out = capsys.readouterr().out
    assert "FAIL  torch_origin venv shadows the image's torch" in out
    assert "pip uninstall torch in the venv" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [(["--sizes", "1M,lots"], "argument --sizes: bad size 'lots' in --sizes"),
     (["--device", "gpu"], "argument --device: invalid choice: 'gpu'"),
     (["--bogus"], "unrecognized arguments: --bogus")],
)  # fmt: skip
def test_an_option_it_does_not_take_is_a_usage_error_in_one_line(args, message, capsys):
    """Exit status 2, never a FAIL's 1: the job scripts tell a bad DOCTOR_ARGS from a FAIL."""
    with pytest.raises(SystemExit) as exit_info:
        doctor.main(args)
    assert exit_info.value.code == doctor.USAGE_EXIT_CODE == 2
    line = one_line(capsys)
    assert line.startswith(f"{doctor.PROG}: error: {message}") and "(see --help)" in line


# --------------------------------------------------------------------------- pure checks


@pytest.mark.parametrize(
    ("args", "status", "text"),
    [
        (("2.9.1", "12.9", "2.29.2", True), OK, "torch 2.9.1, CUDA 12.9, NCCL 2.29.2"),
        (("2.13.0+cpu", None, None, False), OK, "CUDA -"),
        (("2.13.0+cpu", None, None, True), FAIL, "CPU-only build on a GPU node"),
        (("2.3.1", "12.1", "2.20.5", True), FAIL, "needs torch>=2.4"),
    ],
)
def test_check_torch_build(args, status, text):
    result = checks.check_torch_build(*args)
    assert result.status == status and text in result.message


@pytest.mark.parametrize(
    ("torch_file", "system_site", "on_alps", "status", "text"),
    [
        ("/usr/lib/python3/site-packages/torch/__init__.py", True, True, OK, "image/system"),
        ("/venv/lib/python3/site-packages/torch/__init__.py", True, False, FAIL, "shadows"),
        ("/venv/lib/python3/site-packages/torch/__init__.py", False, True, WARN, "without"),
        ("/venv/lib/python3/site-packages/torch/__init__.py", False, False, OK, "the venv"),
    ],
)
def test_check_torch_origin(torch_file, system_site, on_alps, status, text):
    result = checks.check_torch_origin(torch_file, "/venv", "/usr", system_site, on_alps)
    assert result.status == status and text in result.message


def test_check_torch_origin_outside_a_venv():
    result = checks.check_torch_origin("/usr/lib/torch/__init__.py", "/usr", "/usr", True, True)
    assert result.status == OK


def torchvision(file="/usr/lib/torchvision/__init__.py", pin="2.13.0", ops=True, error=""):
    return vision.Torchvision("0.28.0", file, pin, ops, error)


@pytest.mark.parametrize(
    ("found", "status", "text"),
    [
        (None, OK, "not installed: only model=vision and model=timm need it"),
        (torchvision(), OK, "torchvision 0.28.0 from /usr/lib/torchvision"),
        (torchvision(pin="2.13.0+cpu"), OK, "from /usr/lib"),  # a local part is the same build
        (torchvision(pin=None), OK, "from /usr/lib"),  # an image's own build pins nothing
        (torchvision("/venv/lib/torchvision/__init__.py"), FAIL, "venv shadows the image's"),
        (torchvision(pin="2.12.0"), FAIL, "built for torch 2.12.0, this torch is 2.13.0"),
        (torchvision(ops=False, error="operator torchvision::nms does not exist"), FAIL, "nms"),
        (torchvision(ops=False), OK, "its compiled ops do not load"),
    ],
)
def test_check_torchvision(found, status, text):
    result = vision.check_torchvision(found, "2.13.0", "/venv", "/usr", True)
    assert result.status == status and text in result.message, result


def test_torchvision_as_this_process_finds_it():
    pytest.importorskip("torchvision")
    found = vision.torchvision_found()
    assert found.file.endswith("__init__.py") and found.version
    assert vision.torchvision_here().check == "torchvision"


def test_venv_has_system_site_packages(tmp_path):
    assert not checks.venv_has_system_site_packages(str(tmp_path))  # no pyvenv.cfg
    (tmp_path / "pyvenv.cfg").write_text("home = /x\ninclude-system-site-packages = false\n")
    assert not checks.venv_has_system_site_packages(str(tmp_path))
    (tmp_path / "pyvenv.cfg").write_text("home = /x\ninclude-system-site-packages = true\n")
    assert checks.venv_has_system_site_packages(str(tmp_path))


@pytest.mark.parametrize(
    ("want_gpu", "visible", "tasks", "status", "text"),
    [
        (False, 0, 2, OK, "CPU run"),
        (True, 4, 4, OK, "4 GPU(s) for 4 task(s)"),
        (True, 1, 1, OK, "1 GPU(s) for 1 task(s)"),
        (True, 0, 4, FAIL, "no GPU visible"),
        (True, 2, 4, FAIL, "4 tasks on this node share 2 GPUs"),
        (True, 1, 4, WARN, "--gpus-per-task=1"),
        (True, 4, 1, WARN, "3 GPU(s) idle"),
    ],
)
def test_check_gpus(want_gpu, visible, tasks, status, text):
    result = checks.check_gpus(want_gpu, visible, tasks, None)
    assert result.status == status and text in result.message


@pytest.mark.parametrize(
    ("bound", "threads", "tasks", "node", "gpu", "status", "text"),
    [
        (72, 8, 4, 288, True, OK, "72 core(s) bound, 8 thread(s)"),
        (8, 16, 4, 288, True, FAIL, "oversubscribed; set OMP_NUM_THREADS<=8"),
        (288, 100, 4, 288, True, FAIL, "4 unbound tasks on 288 cores"),
        (288, 100, 4, 288, True, FAIL, "set OMP_NUM_THREADS<=72 or bind tasks"),
        # one thread each already: the advice is fewer processes, not OMP_NUM_THREADS<=1
        (2, 1, 4, 2, False, FAIL, "oversubscribed; run at most 2 processes per node"),
        (8, 8, 4, 288, True, WARN, "--cpus-per-task=72"),
        (2, 1, 2, 2, False, OK, "2 core(s) bound"),
    ],
)
def test_check_cpu(bound, threads, tasks, node, gpu, status, text):
    result = checks.check_cpu(bound, threads, tasks, node, gpu)
    assert result.status == status and text in result.message


def test_is_alps_node():
    assert checks.is_alps_node("nid001234", False, False)
    assert checks.is_alps_node("x", True, False) and checks.is_alps_node("x", False, True)
    assert not checks.is_alps_node("laptop", False, False)
    assert not checks.is_alps_node("nid001234.login", False, False)


def test_find_net_plugins(tmp_path):
    (tmp_path / "libnccl-net.so").write_text("")
    (tmp_path / "libnccl.so").write_text("")
    ldconfig = (
        "\tlibnccl-net-ofi.so (libc6,AArch64) => /opt/aws-ofi/lib/libnccl-net-ofi.so\n"
        "\tlibc.so.6 (libc6,AArch64) => /lib64/libc.so.6\n"
    )
    found = checks.find_net_plugins(f"/does/not/exist:{tmp_path}", ldconfig)
    assert found == [str(tmp_path / "libnccl-net.so"), "/opt/aws-ofi/lib/libnccl-net-ofi.so"]
    assert checks.find_net_plugins("", "") == []


@pytest.mark.parametrize(
    ("environ", "alps_gpu", "plugins", "status", "text"),
    [
        ({"NCCL_NET": "AWS Libfabric"}, True, [PLUGIN], OK, "plugin " + PLUGIN),
        ({}, False, [], OK, "not an Alps GPU run"),
        ({"NCCL_NET": "IB"}, False, [], OK, "NCCL_NET=IB"),
        ({"NCCL_NET": "Socket"}, False, [], FAIL, "would use TCP sockets"),
        ({"NCCL_NET": "IB"}, True, [PLUGIN], FAIL, "a transport other than Slingshot"),
        ({"NCCL_NET": "'AWS Libfabric'"}, True, [PLUGIN], FAIL, "extra quotes"),
        ({}, True, [], FAIL, "NCCL would use TCP sockets"),
        ({"NCCL_NET": "AWS Libfabric"}, True, [], WARN, "fail at start if it is really missing"),
        ({}, True, [PLUGIN], WARN, "NCCL_NET unset"),
        ({"NCCL_NET_PLUGIN": "ofi"}, True, [PLUGIN], FAIL, "looked for libnccl-net-ofi.so"),
        (
            {"NCCL_NET_PLUGIN": "ofi", "NCCL_NET": "AWS Libfabric"},
            True,
            ["/x/libnccl-net-ofi.so.1"],
            OK,
            "plugin /x/libnccl-net-ofi.so.1",
        ),
    ],
)
def test_check_nccl_network(environ, alps_gpu, plugins, status, text):
    result = checks.check_nccl_network(environ, alps_gpu, plugins)
    assert result.status == status and text in result.message, result


@pytest.mark.parametrize(
    ("change", "alps_gpu", "status", "text"),
    [
        ({}, True, OK, "present"),
        ({}, False, OK, "not an Alps GPU run"),
        ({"FI_CXI_DEFAULT_CQ_SIZE": None}, True, WARN, "FI_CXI_DEFAULT_CQ_SIZE"),
        ({"NCCL_PROTO": "Simple,LL128"}, True, WARN, "LL128 is slower"),
        ({"MPICH_GPU_SUPPORT_ENABLED": "1"}, True, WARN, "can deadlock"),
    ],
)
def test_check_fabric_env(change, alps_gpu, status, text):
    environ = {k: v for k, v in (ALPS_FABRIC_ENV | change).items() if v is not None}
    result = checks.check_fabric_env(environ, alps_gpu)
    assert result.status == status and text in result.message, result


def test_check_directory_ok_and_not_created(tmp_path):
    result = storage.check_directory("run_dir", tmp_path / "new" / "run", 0.0, lambda p: None)
    assert result.status == OK and f"(in {tmp_path})" in result.message
    assert not (tmp_path / "new").exists()
    assert list(tmp_path.iterdir()) == []  # the probe file is gone


def test_check_directory_below_a_file_fails(tmp_path):
    (tmp_path / "f").write_text("")
    result = storage.check_directory("run_dir", tmp_path / "f" / "run", 0.0, lambda p: None)
    assert result.status == FAIL and "is not a directory; choose another run_dir" in result.message


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes to read-only directories")
def test_check_directory_read_only_fails(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    result = storage.check_directory("data_dir", locked, 0.0, lambda p: None)
    assert result.status == FAIL and "is not writable" in result.message


def test_check_directory_free_space_and_striping(tmp_path):
    full = storage.check_directory("run_dir", tmp_path, 1e9, lambda p: None)
    assert full.status == WARN and "GiB free" in full.message
    flat = storage.check_directory("run_dir", tmp_path, 0.0, lambda p: 1)
    layout = storage.lustre_layout(REPO / "scripts" / "stripe_lustre.sh")
    assert layout and flat.status == WARN
    assert f"run scripts/stripe_lustre.sh {tmp_path} (lfs setstripe {layout})" in flat.message
    for stripes in (32, -1):
        striped = storage.check_directory("run_dir", tmp_path, 0.0, lambda p, n=stripes: n)
        assert striped.status == OK and f"stripe count {stripes}" in striped.message


def test_stripe_advice_reads_the_layout_from_the_script(tmp_path):
    """One source: the layout is scripts/stripe_lustre.sh's LAYOUT line, edited there only."""
    script = tmp_path / "scripts" / "stripe_lustre.sh"
    script.parent.mkdir()
    script.write_text("#!/bin/bash\nLAYOUT=(-E 8M -c 1  -E -1 -c 16)\n")
    advice = storage.stripe_advice(Path("/d"), roots=(tmp_path,))
    assert advice == "scripts/stripe_lustre.sh /d (lfs setstripe -E 8M -c 1 -E -1 -c 16)"
    script.unlink()  # a package installed away from the repository: the script is named
    assert storage.stripe_advice(Path("/d"), roots=(tmp_path,)).startswith(
        "scripts/stripe_lustre.sh /d from the repository"
    )


def test_lustre_stripe_count_reads_lfs(tmp_path, monkeypatch):
    """A fake `lfs` first on PATH: a progressive layout counts by its widest component."""
    lfs = tmp_path / "lfs"
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    for script, count in (("echo 1; echo 4; echo 32", 32), ("echo 1", 1), ("exit 2", None)):
        lfs.write_text(f"#!/bin/sh\n{script}\n")
        lfs.chmod(0o755)
        try:
            subprocess.run([lfs], check=False)
        except PermissionError:
            pytest.skip(f"{tmp_path} does not allow running programs (noexec)")
        assert storage.lustre_stripe_count(tmp_path) == count
    monkeypatch.setenv("PATH", "/nonexistent")
    assert storage.lustre_stripe_count(tmp_path) is None  # no lfs: not checked


def test_check_clock_skew():
    assert checks.check_clock_skew({"a": 100.0, "b": 100.2}).status == OK
    skewed = checks.check_clock_skew({"a": 100.0, "b": 103.5, "c": 101.0})
    assert skewed.status == WARN and "3.5 s between a and b" in skewed.message


def test_check_gpu_sharing():
    assert checks.check_gpu_sharing({0: ("a", None), 1: ("a", None)}) is None
    assert checks.check_gpu_sharing({0: ("a", "u0"), 1: ("a", "u1"), 2: ("b", "u0")}).status == OK
    shared = checks.check_gpu_sharing({0: ("a", "u0"), 1: ("a", "u0"), 2: ("a", "u1")})
    assert shared.status == FAIL and "ranks 0-1 on a use the same GPU" in shared.message


def test_bus_bandwidth_as_nccl_tests_defines_it():
    algbw, busbw = bandwidth.bus_bandwidth(4 * 10**9, 2.0, 4)
    assert algbw == pytest.approx(2.0) and busbw == pytest.approx(2.0 * 2 * 3 / 4)
    assert bandwidth.bus_bandwidth(10**9, 1.0, 2) == pytest.approx((1.0, 1.0))


def test_expected_busbw():
    assert bandwidth.expected_busbw("cpu", 1, 2) is None
    assert bandwidth.expected_busbw("cuda", 1, 1) is None
    assert bandwidth.expected_busbw("cuda", 1, 4)[0] == 250
    assert bandwidth.expected_busbw("cuda", 2, 4)[0] == 50
    assert bandwidth.expected_busbw("cuda", 8, 1)[0] == 15


def test_check_bandwidth():
    assert bandwidth.check_bandwidth(1.0, 2**20, "gloo on CPU", None).status == OK
    low = bandwidth.check_bandwidth(20.0, 2**30, "NCCL", (50.0, "several nodes"))
    assert low.status == WARN and "below half of the 50 GB/s" in low.message
    assert bandwidth.check_bandwidth(30.0, 2**30, "NCCL", (50.0, "several nodes")).status == OK


def test_parse_sizes_and_format():
    assert bandwidth.parse_sizes("1M, 64MiB,1G,512") == (2**20, 64 * 2**20, 2**30, 512)
    for bad in ("0M", "1T", "x", ""):
        with pytest.raises(argparse.ArgumentTypeError):
            bandwidth.parse_sizes(bad)
    assert [bandwidth.format_size(n) for n in (512, 2**20, 3 * 2**30)] == [
        "512 B",
        "1 MiB",
        "3 GiB",
    ]
    assert checks.format_ranks([5, 0, 1, 2, 7, 8]) == "0-2,5,7-8"


def test_report_lines_group_ranks():
    bad = checks.Result(FAIL, "run_dir", "run_dir /x is not writable")
    ok = checks.Result(OK, "cpu", "8 cores")
    odd = checks.Result(WARN, "cpu", "2 cores")
    per_rank = {0: ("a", [bad, ok]), 1: ("a", [bad, ok]), 2: ("b", [bad, odd])}
    lines = doctor.report_lines(per_rank)
    assert lines == [
        "FAIL  run_dir      run_dir /x is not writable [all 3 ranks on a,b]",
        "WARN  cpu          2 cores [rank 2 on b]",
        "OK    cpu          8 cores [ranks 0-1 on a]",
    ]
    many = {r: ("a", [checks.Result(OK, "gpus", f"v{r}")]) for r in range(5)}
    assert doctor.report_lines(many, max_variants=2)[-1].endswith("3 more variant(s)")


def test_the_doctor_finds_the_repository_it_lives_in():
    """The stripe advice reads scripts/stripe_lustre.sh from the repository the package is in."""
    assert storage.REPO_ROOT == REPO
    assert (storage.REPO_ROOT / storage.STRIPE_SCRIPT).is_file()
