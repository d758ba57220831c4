"""A real single-node Slurm on localhost that looks like one CSCS Alps GH200 node.

`SlurmHarness.start()` runs munged, slurmctld and slurmd from the Debian packages
(tests/slurm/install.sh installs them) with a private configuration under one state directory:

- one node (this host) declared as 4 sockets x 72 cores = 288 CPUs, 4 `gpu` GRES backed by dummy
  files, ~480 GB of memory; `SlurmdParameters=config_overrides` makes slurmd register that node
  on a 2-core machine, so Alps resource requests (`--ntasks-per-node=4 --cpus-per-task=72`,
  `--gpus-per-node=4`, ...) are accepted as written;
- partitions `normal` (default) and `debug`; no accounting daemon, so any `--account` is accepted;
- `JobRequeue=1`, a long `MinJobAge` (finished jobs stay visible to `scontrol show job`) and a job
  completion log (`jobcomp/filetxt`);
- the SPANK plugin alps_spank.c (compiled here) accepts the Alps options `--uenv`, `--view` and
  `--environment` and records, per job step, what the step asked for.

Starting is idempotent: a running instance with the same configuration is reused. Every user
holds a shared lock on it; `stop()` stops the daemons only when no other session uses them and
they were not started from a shell (`harness.py start`, which keeps them until
`harness.py stop`). Clients must run with `SLURM_CONF` pointing at the harness's slurm.conf: use
`harness.env()`.

Command line (for debugging by hand):  python3 tests/slurm/harness.py start|stop|status
"""

from __future__ import annotations

import fcntl
import glob
import hashlib
import os
import pwd
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_STATE_DIR = Path(os.environ.get("ALPS_SLURM_STATE_DIR", "/tmp/alps-slurm-harness"))

REQUIRED_COMMANDS = "munged slurmctld slurmd sbatch srun salloc scontrol scancel sinfo gcc".split()
SPANK_HEADER = Path("/usr/include/slurm/spank.h")
# Slurm's mpi/pmix plugin dlopens the unversioned library (srun --mpi=pmix, Alps Extended Images)
LIBPMIX_GLOB = "/usr/lib/*/libpmix.so"

# not Slurm's defaults (6817/6818), so a Slurm installed on the machine is not disturbed
CTLD_PORT = int(os.environ.get("ALPS_SLURM_CTLD_PORT", "16817"))
SLURMD_PORT = CTLD_PORT + 1

# the Alps GH200 node (https://docs.cscs.ch/alps/hardware/)
NODE_SOCKETS = 4
NODE_CORES_PER_SOCKET = 72
NODE_GPUS = 4
NODE_MEMORY_MB = 480 * 1024

_TERMINAL = (
    "BOOT_FAIL CANCELLED COMPLETED DEADLINE FAILED NODE_FAIL OUT_OF_MEMORY PREEMPTED TIMEOUT"
)
TERMINAL_STATES = frozenset(_TERMINAL.split())


class HarnessUnavailable(RuntimeError):
    """Slurm cannot be started on this machine (the reason is the message): tests should skip."""


def unavailable_reason() -> str | None:
    """Why the harness cannot run here, or None if it can."""
    if not sys.platform.startswith("linux"):
        return "the Slurm harness needs Linux"
    if os.geteuid() != 0:
        return "the Slurm harness must run as root (slurmd runs as root to start jobs)"
    missing = [cmd for cmd in REQUIRED_COMMANDS if shutil.which(cmd) is None]
    if not SPANK_HEADER.exists():
        missing.append(str(SPANK_HEADER) + " (libslurm-dev)")
    if not glob.glob(LIBPMIX_GLOB):
        missing.append("libpmix.so (libpmix-dev)")
    if missing:
        return "Slurm harness: missing " + ", ".join(missing) + "; run tests/slurm/install.sh"
    return None


@dataclass
class Job:
    """A snapshot of `scontrol show job -o`: the fields as a dict, plus a few parsed ones."""

    job_id: int
    fields: dict[str, str] = field(default_factory=dict)

    @property
    def state(self) -> str:
        return self.fields.get("JobState", "UNKNOWN")

    @property
    def restarts(self) -> int:
        return int(self.fields.get("Restarts", "0"))

    @property
    def exit_code(self) -> tuple[int, int]:
        """(exit status, signal) of the batch script, from ExitCode=<status>:<signal>."""
        status, _, sig = self.fields.get("ExitCode", "0:0").partition(":")
        return int(status), int(sig or 0)

    @property
    def stdout(self) -> Path | None:
        out = self.fields.get("StdOut")
        return Path(out) if out else None


# keys of `scontrol show job -o` whose values may contain spaces; they are parsed by position
_SHOW_JOB_KEY = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z0-9_:/]*)=")


def parse_show_job(line: str) -> dict[str, str]:
    """Parse one `scontrol show job -o` line into {key: value} (values may contain spaces)."""
    matches = list(_SHOW_JOB_KEY.finditer(line))
    fields: dict[str, str] = {}
    for i, match in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(line)
        fields.setdefault(match.group(1), line[match.end() : end].strip())
    return fields


class SlurmHarness:
    """Start, reuse, query and stop the single-node Slurm (see the module docstring)."""

    # Job ids this cluster hands out (FirstJobId..MaxJobId, then it wraps). Each cluster the
    # suite starts has a range of its own, so no two jobs of one session share an id, and with
    # it a log file (`logs/slurm-%x-%j.log` in the same repository) or a MASTER_PORT.
    JOB_IDS = (100_000, 199_999)

    def __init__(self, state_dir: Path = DEFAULT_STATE_DIR, ctld_port: int = CTLD_PORT) -> None:
        self.state_dir = Path(state_dir)
        self.ctld_port = ctld_port
        self.slurmd_port = ctld_port + 1
        self.conf = self.state_dir / "etc" / "slurm.conf"
        self.spank_log = self.state_dir / "spank-steps.log"
        self.jobcomp_log = self.state_dir / "jobcomp.log"
        self.munge_socket = self.state_dir / "munge" / "munge.socket"
        self.host = socket.gethostname().split(".")[0]  # slurmctld insists on its own name
        self.node = _resolvable_node_name(self.host)
        self.nodes = [self.node]  # every compute node (a subclass may have several)
        self._usage = None  # the open usage lock file while this object uses the instance

    # ---------------------------------------------------------------- environment and commands
    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """`base` (default: os.environ) with SLURM_CONF set and inherited job variables removed."""
        env = dict(os.environ if base is None else base)
        for key in list(env):
            # a test running inside a Slurm job must not leak that job into its submissions
            if key.startswith(("SLURM_", "SBATCH_", "SRUN_", "SALLOC_")):
                del env[key]
        env["SLURM_CONF"] = str(self.conf)
        # a login shell on Alps always has these; job scripts may rely on them (set -u)
        user = pwd.getpwuid(os.getuid())
        env.setdefault("USER", user.pw_name)
        env.setdefault("LOGNAME", user.pw_name)
        env.setdefault("HOME", user.pw_dir)
        return env

    def run(
        self,
        *cmd: str,
        check: bool = True,
        timeout: float = 60,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
    ) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            list(cmd),
            env=self.env(env),
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and proc.returncode != 0:
            raise RuntimeError(
                f"{' '.join(cmd)} failed ({proc.returncode})\n{proc.stdout}\n{proc.stderr}"
            )
        return proc

    # ---------------------------------------------------------------------------- configuration
    def _render_config(self) -> dict[Path, str]:
        s = self.state_dir
        dev = s / "dev"
        slurm_conf = f"""\
# generated by tests/slurm/harness.py: {self._description()}
ClusterName=alpstest
SlurmctldHost={self.host}({self._ctld_addr()})
SlurmctldPort={self.ctld_port}
SlurmdPort={self.slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
# cred_expire also delays the restart of a requeued job (default 120 s): keep it short
AuthInfo=socket={self.munge_socket},cred_expire=10
CredType=cred/munge
StateSaveLocation={s}/ctld-state
FirstJobId={self.JOB_IDS[0]}
MaxJobId={self.JOB_IDS[1]}
SlurmdSpoolDir={self._slurmd_path("slurmd-spool", "")}
SlurmctldPidFile={s}/run/slurmctld.pid
SlurmdPidFile={self._slurmd_path("run", ".pid")}
SlurmctldLogFile={s}/log/slurmctld.log
SlurmdLogFile={self._slurmd_path("log", ".log")}
SlurmctldDebug=info
SlurmdDebug=info
PlugStackConfig={s}/etc/plugstack.conf
# No cgroups in a container. proctrack/pgid signals a task's process group: the task and the
# children it forks (DataLoader workers), but not processes in a session of their own (torchrun's
# workers), so torchrun must forward the preemption signal itself, as under proctrack/cgroup
# with the default SignalChildrenProcesses=no. Bind nothing: the node's CPUs are not real.
ProctrackType=proctrack/pgid
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc={self.jobcomp_log}
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/backfill
# look at pending jobs often: a requeued job becomes eligible without any event to trigger a pass
SchedulerParameters=sched_interval=2,bf_interval=2
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
# register the configured (Alps) node, not the hardware of this machine
SlurmdParameters=config_overrides
ReturnToService=2
JobRequeue=1
# finished jobs stay visible to `scontrol show job` for an hour
MinJobAge=3600
KillWait=10
MailProg=/bin/true
InactiveLimit=0
SlurmdTimeout={self._slurmd_timeout()}
SlurmctldTimeout=300
MessageTimeout=30
"""
        cpus = NODE_SOCKETS * NODE_CORES_PER_SOCKET
        gres_conf = "AutoDetect=off\n"
        for node, addr in self._node_addresses().items():
            slurm_conf += (
                f"NodeName={node} NodeAddr={addr} CPUs={cpus} Sockets={NODE_SOCKETS} "
                f"CoresPerSocket={NODE_CORES_PER_SOCKET} ThreadsPerCore=1 "
                f"RealMemory={NODE_MEMORY_MB} Gres=gpu:{NODE_GPUS} State=UNKNOWN\n"
            )
            gres_conf += f"NodeName={node} Name=gpu File={dev}/nvidia[0-{NODE_GPUS - 1}]\n"
        nodes = ",".join(self.nodes)
        slurm_conf += (
            f"PartitionName=normal Nodes={nodes} Default=YES MaxTime=INFINITE State=UP\n"
            f"PartitionName=debug Nodes={nodes} MaxTime=INFINITE State=UP\n"
        )
        plugstack = f"required {s}/lib/alps_spank.so log={self.spank_log}\n"
        return {
            s / "etc" / "slurm.conf": slurm_conf,
            s / "etc" / "gres.conf": gres_conf,
            s / "etc" / "plugstack.conf": plugstack,
        }

    # hooks for a cluster of several nodes (tests/slurm/two_node.py)
    def _description(self) -> str:
        return "one Alps-like GH200 node on localhost"

    def _ctld_addr(self) -> str:
        return "127.0.0.1"

    def _node_addresses(self) -> dict[str, str]:
        return {self.node: "127.0.0.1"}

    def _slurmd_path(self, sub: str, suffix: str) -> str:
        """Where slurmd keeps its spool ("") / pid (".pid") / log (".log"): one slurmd here."""
        return f"{self.state_dir}/{sub}/slurmd{suffix}" if suffix else f"{self.state_dir}/{sub}"

    def _slurmd_timeout(self) -> int:
        return 300

    def _fingerprint(self, files: dict[Path, str]) -> str:
        digest = hashlib.sha256()
        for path in sorted(files):
            digest.update(str(path).encode() + b"\0" + files[path].encode() + b"\0")
        digest.update((HERE / "alps_spank.c").read_bytes())
        return digest.hexdigest()

    # ------------------------------------------------------------------------------ life cycle
    def is_up(self) -> bool:
        """slurmctld answers and the node is usable."""
        if not self.conf.exists():
            return False
        try:
            ping = self.run("scontrol", "ping", check=False, timeout=15)
            if ping.returncode != 0 or "UP" not in ping.stdout:
                return False
            nodes = ",".join(self.nodes)
            state = self.run(
                "sinfo", "-h", "-N", "-n", nodes, "-o", "%N %T", check=False, timeout=15
            )
        except subprocess.TimeoutExpired:
            return False
        # one line per node and partition
        states = dict(line.split() for line in state.stdout.splitlines() if line.strip())
        usable = {"idle", "mixed", "allocated", "completing"}
        return (
            state.returncode == 0
            and sorted(states) == sorted(self.nodes)
            and {s.rstrip("*") for s in states.values()} <= usable
        )

    def start(self, timeout: float = 90) -> SlurmHarness:
        """Start (or reuse) the instance; raise HarnessUnavailable when it cannot run here.

        Each user (a test session) holds a shared lock on the instance until `stop()`, so two
        sessions on one machine share it and the last one out stops it.
        """
        reason = unavailable_reason()
        if reason:
            raise HarnessUnavailable(reason)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        with self._start_lock():
            alone = self._hold_usage_lock()
            files = self._render_config()
            fingerprint = self._fingerprint(files)
            stamp = self.state_dir / "fingerprint"
            if stamp.exists() and stamp.read_text() == fingerprint and self.is_up():
                return self
            if not alone:
                raise HarnessUnavailable(
                    f"another session uses the Slurm harness in {self.state_dir} with another "
                    "configuration (or it is down); try again when it is done"
                )
            self._launch(files, timeout)
            stamp.write_text(fingerprint)
        return self

    def stop(self) -> None:
        """Stop using the instance; stop it if no other session uses it and it is not kept
        (`harness.py start` from a shell keeps it running until `harness.py stop`)."""
        if self._usage is None:
            return
        with self._start_lock():
            try:
                fcntl.flock(self._usage, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                pass  # another session still uses it
            else:
                if not (self.state_dir / "keep").exists():
                    self._stop_daemons_from_pid_files()
            finally:
                self._usage.close()
                self._usage = None

    @contextmanager
    def _start_lock(self) -> Iterator[None]:
        with open(self.state_dir / "start.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    def _hold_usage_lock(self) -> bool:
        """Take the shared usage lock (kept until stop); True if no other session holds it."""
        if self._usage is None:
            self._usage = open(self.state_dir / "usage.lock", "a")  # noqa: SIM115 - held open
        try:
            fcntl.flock(self._usage, fcntl.LOCK_EX | fcntl.LOCK_NB)
            alone = True
        except BlockingIOError:
            alone = False
        fcntl.flock(self._usage, fcntl.LOCK_SH)
        return alone

    def _launch(self, files: dict[Path, str], timeout: float) -> None:
        self._stop_daemons_from_pid_files()
        for sub in ("etc", "lib", "dev", "run", "log", "munge", "ctld-state", "slurmd-spool"):
            (self.state_dir / sub).mkdir(parents=True, exist_ok=True)
        for gpu in range(NODE_GPUS):
            _dummy_device(self.state_dir / "dev" / f"nvidia{gpu}")
        for path, text in files.items():
            path.write_text(text)
        # a fresh instance numbers jobs from 1 again: old records would be mistaken for new ones
        logs = (self.spank_log, self.jobcomp_log, *(self.state_dir / "log").glob("*.log"))
        for log in logs:
            log.unlink(missing_ok=True)
        self._build_spank()
        self._before_daemons()
        self._start_munge()
        self._daemon("slurmctld", ["slurmctld", "-c", "-f", str(self.conf)])
        self._start_slurmds()
        deadline = time.monotonic() + timeout
        while not self.is_up():
            if time.monotonic() > deadline:
                raise RuntimeError("Slurm did not come up in time\n" + self.diagnostics())
            time.sleep(1)

    def _before_daemons(self) -> None:
        """Set-up a subclass needs before the daemons start (the two-node network)."""

    def _start_slurmds(self) -> None:
        self._daemon("slurmd", ["slurmd", "-f", str(self.conf), "-N", self.node])

    def _stop_daemons_from_pid_files(self) -> None:
        """Stop a stale instance of this harness (same state directory) before a restart."""
        run = self.state_dir / "run"
        for name in ("slurmd", "slurmctld", "munged"):
            _kill_pid_file(run / f"{name}.pid", name)

    def _build_spank(self) -> None:
        out = self.state_dir / "lib" / "alps_spank.so"
        proc = subprocess.run(
            [
                "gcc",
                "-Wall",
                "-Wextra",
                "-O2",
                "-shared",
                "-fPIC",
                "-o",
                str(out),
                str(HERE / "alps_spank.c"),
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"building alps_spank.so failed:\n{proc.stderr}")

    def _start_munge(self) -> None:
        munge_dir = self.state_dir / "munge"
        munge_dir.chmod(0o711)  # munged wants the socket's directory searchable by all
        key = munge_dir / "munge.key"
        if not key.exists():
            key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        self._daemon(
            "munged",
            [
                "munged",
                "--force",
                f"--socket={self.munge_socket}",
                f"--key-file={key}",
                f"--pid-file={self.state_dir / 'run' / 'munged.pid'}",
                f"--log-file={self.state_dir / 'log' / 'munged.log'}",
                f"--seed-file={munge_dir / 'munged.seed'}",
            ],
        )

    def _daemon(self, name: str, cmd: list[str], pid_name: str | None = None) -> None:
        """Run a self-daemonizing command and wait for its pid file (run/<pid_name>.pid)."""
        proc = subprocess.run(
            cmd,
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            start_new_session=True,
        )
        if proc.returncode != 0:
            raise RuntimeError(
                f"{name} did not start ({proc.returncode}):\n{proc.stderr}\n" + self.diagnostics()
            )
        pid_file = self.state_dir / "run" / f"{pid_name or name}.pid"
        deadline = time.monotonic() + 20
        while not pid_file.exists():
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name}: no pid file {pid_file}\n" + self.diagnostics())
            time.sleep(0.2)

    # ------------------------------------------------------------------------------- jobs
    def sbatch(self, *args: str, cwd: Path, env: dict[str, str] | None = None) -> int:
        """Submit with `sbatch --parsable ARGS` from `cwd`; return the job id."""
        proc = self.run("sbatch", "--parsable", *args, cwd=cwd, env=env)
        return int(proc.stdout.strip().split(";")[0])

    def job(self, job_id: int) -> Job:
        proc = self.run("scontrol", "show", "job", "-o", str(job_id))
        return Job(job_id, parse_show_job(proc.stdout.strip()))

    def wait(
        self,
        job_id: int,
        until: set[str] | frozenset[str] = TERMINAL_STATES,
        timeout: float = 300,
        poll: float = 1.0,
    ) -> Job:
        """Poll until the job's state is in `until`; on timeout raise with diagnostics."""
        deadline = time.monotonic() + timeout
        while True:
            job = self.job(job_id)
            if job.state in until:
                return job
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"job {job_id} still {job.state} after {timeout:.0f}s (waiting for "
                    f"{sorted(until)})\n" + self.diagnostics(job_id)
                )
            time.sleep(poll)

    def spank_records(self, job_id: int) -> list[dict[str, str]]:
        """The SPANK plugin's lines for one job, in order, as dicts (step, uenv, view, ...)."""
        records = []
        if self.spank_log.exists():
            for line in self.spank_log.read_text().splitlines():
                record = dict(part.split("=", 1) for part in line.split() if "=" in part)
                if record.get("job") == str(job_id):
                    records.append(record)
        return records

    def kill_strays(self, job_id: int) -> list[str]:
        """SIGKILL processes of `job_id` (of this instance) that outlived the job; return them.

        proctrack/pgid loses track of processes that start a session of their own (torchrun's
        workers): if their parent dies they keep running after the job ends, which the cgroup
        tracking on Alps would not allow. Tests call this so strays cannot disturb later jobs.
        """
        marks = (f"SLURM_JOB_ID={job_id}".encode(), f"SLURM_CONF={self.conf}".encode())
        killed = []
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit() or int(proc.name) == os.getpid():
                continue
            try:
                environ = (proc / "environ").read_bytes().split(b"\0")
                if not all(mark in environ for mark in marks):
                    continue
                cmdline = (
                    (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                )
                os.kill(int(proc.name), signal.SIGKILL)
            except (OSError, ValueError):
                continue  # gone, or not ours to read
            killed.append(f"{proc.name}: {cmdline.strip()}")
        return killed

    def diagnostics(self, job_id: int | None = None) -> str:
        """Text to append to a failure: job record, job log, SPANK records, daemon log tails."""
        parts = []
        if job_id is not None:
            try:
                show = self.run("scontrol", "show", "job", str(job_id), check=False, timeout=15)
                parts.append(f"--- scontrol show job {job_id}\n{show.stdout}{show.stderr}")
                out = parse_show_job(" ".join(show.stdout.split())).get("StdOut")
                if out and Path(out).exists():
                    parts.append(f"--- {out} (tail)\n{_tail(Path(out), 12000)}")
            except (subprocess.TimeoutExpired, OSError) as exc:
                parts.append(f"--- scontrol show job {job_id}: {exc!r}")
            lines = [str(r) for r in self.spank_records(job_id)]
            parts.append("--- SPANK records\n" + "\n".join(lines))
        for log in sorted((self.state_dir / "log").glob("*.log")):
            if log.exists():
                parts.append(f"--- {log} (tail)\n{_tail(log, 3000)}")
        return "\n".join(parts)


def _resolvable_node_name(host: str) -> str:
    """The node's name: this host's name if it resolves, else "localhost". Job scripts derive
    MASTER_ADDR from the node list (`scontrol show hostnames`), so the name must resolve."""
    try:
        socket.getaddrinfo(host, None)
    except OSError:
        return "localhost"
    return host


def _dummy_device(path: Path) -> None:
    """A character device with /dev/null's numbers (slurmd wants gres `File=` to be a device)."""
    if path.is_char_device():
        return
    path.unlink(missing_ok=True)
    null = os.stat("/dev/null").st_rdev
    try:
        os.mknod(path, 0o666 | stat.S_IFCHR, null)
    except OSError:  # no CAP_MKNOD: a link to /dev/null stats as the same device
        path.symlink_to("/dev/null")


def _tail(path: Path, chars: int) -> str:
    text = path.read_text(errors="replace")
    return text[-chars:]


def _kill_pid_file(pid_file: Path, name: str, timeout: float = 15) -> None:
    """SIGTERM the process named in pid_file if it is `name`, wait for it, then SIGKILL."""
    try:
        pid = int(pid_file.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return
    try:
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        pid_file.unlink(missing_ok=True)
        return
    if comm != name[:15]:  # a recycled pid: not ours
        pid_file.unlink(missing_ok=True)
        return
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    if Path(f"/proc/{pid}").exists():
        os.kill(pid, signal.SIGKILL)
    pid_file.unlink(missing_ok=True)


def main(argv: list[str], harness: SlurmHarness | None = None, usage: str = __doc__) -> int:
    """`start|stop|status` by hand, for this harness or another one (tests/slurm/two_node.py)."""
    harness = harness if harness is not None else SlurmHarness()
    action = argv[1] if len(argv) > 1 else "status"
    if action == "start":
        try:
            harness.start()
        except HarnessUnavailable as exc:
            print(f"unavailable: {exc}", file=sys.stderr)
            return 2
        (harness.state_dir / "keep").touch()  # test sessions leave it running
        print(f"export SLURM_CONF={harness.conf}")
    elif action == "stop":
        (harness.state_dir / "keep").unlink(missing_ok=True)
        harness._stop_daemons_from_pid_files()
    elif action == "status":
        print("up" if harness.is_up() else "down")
    else:
        print(usage, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
