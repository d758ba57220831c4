"""A real Slurm cluster of two compute nodes on one machine, each node its own network namespace.

`TwoNodeHarness` is the single-node harness (harness.py: munged, slurmctld, the SPANK plugin,
the Alps-shaped nodes, locking, job queries) with two slurmd, one per node:

- a Linux bridge `alps2n-br` (10.217.42.1/24 on this host, where slurmctld listens) and, per node,
  a network namespace named after the node with a veth pair: `eth0` (10.217.42.11, .12, ...)
  inside, `<node>v` on the bridge outside. Traffic stays on that bridge: no route, no NAT;
- each slurmd runs as `nsenter --net=/run/netns/<node> unshare --uts` with its own host name
  (`ip netns exec` would remount /sys, and slurmd then fails its cgroup set-up), so job steps see
  the node's name and address; munged and the file system are shared;
- `%n` in slurmd's spool, pid and log paths; `ProctrackType=proctrack/pgid` and
  `JobAcctGatherType=jobacct_gather/none` as in the single-node harness;
- the node names resolve through lines that this module adds to /etc/hosts (marked with
  `# alps-slurm-2node <state dir>`) and removes again when the cluster stops;
- `SlurmdTimeout=20`: a node whose slurmd stops answering is DOWN (and its jobs NODE_FAIL)
  within about 30 s, instead of 5 minutes.

A separate state directory (/tmp/alps-slurm-2node) and ports (17817, 17818) from the single-node
harness (/tmp/alps-slurm-harness, 16817): both can run at once. `stop()` (the last user) stops the
daemons, kills whatever still runs in the node namespaces, deletes the namespaces, the veths and
the bridge, and removes its /etc/hosts lines.

Faults, for tests: `cut_link(node)` / `restore_link(node)` take the node's veth down/up (a node
that vanished from the network: its processes keep running), `kill_node(node)` SIGKILLs every
process in the node's namespace (slurmd and the job's tasks: a crashed node), `start_slurmd(node)`
brings a killed node back.

Command line (for debugging by hand):  python3 tests/slurm/two_node.py start|stop|status
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

if __package__:  # imported by the tests as slurm.two_node: share slurm.harness's classes
    from .harness import HarnessUnavailable, SlurmHarness, _kill_pid_file
    from .harness import main as harness_main
    from .harness import unavailable_reason as single_node_unavailable_reason
else:  # run as a script
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from harness import HarnessUnavailable, SlurmHarness, _kill_pid_file
    from harness import main as harness_main
    from harness import unavailable_reason as single_node_unavailable_reason

STATE_DIR = Path(os.environ.get("ALPS_SLURM_2NODE_STATE_DIR", "/tmp/alps-slurm-2node"))
CTLD_PORT = int(os.environ.get("ALPS_SLURM_2NODE_CTLD_PORT", "17817"))
# a private /24 that exists only on our bridge (first three octets)
SUBNET = os.environ.get("ALPS_SLURM_2NODE_SUBNET", "10.217.42")
BRIDGE = "alps2n-br"
NODES = ("alps2n-1", "alps2n-2")
HOSTS_FILE = Path("/etc/hosts")
HOSTS_MARK = "# alps-slurm-2node"
NET_COMMANDS = ("ip", "nsenter", "unshare")


def unavailable_reason() -> str | None:
    reason = single_node_unavailable_reason()
    if reason:
        return reason
    missing = [cmd for cmd in NET_COMMANDS if shutil.which(cmd) is None]
    if missing:
        missing_text = ", ".join(missing)
        return f"two-node Slurm harness: missing {missing_text}; run tests/slurm/install.sh"
    return None


class TwoNodeHarness(SlurmHarness):
    """Start, reuse, query, break and stop the two-node cluster (see the module docstring)."""

    JOB_IDS = (200_000, 299_999)  # not the single-node cluster's (SlurmHarness.JOB_IDS)

    def __init__(self, state_dir: Path = STATE_DIR, ctld_port: int = CTLD_PORT) -> None:
        super().__init__(state_dir, ctld_port)
        self.nodes = list(NODES)
        self.node = self.nodes[0]  # the first node: the batch script runs there
        self.bridge_addr = f"{SUBNET}.1"
        self.addresses = {node: f"{SUBNET}.{11 + i}" for i, node in enumerate(self.nodes)}

    # ------------------------------------------------------------ configuration (harness hooks)
    def _description(self) -> str:
        return "two Alps-like GH200 nodes, each in its own network namespace"

    def _ctld_addr(self) -> str:
        return self.bridge_addr

    def _node_addresses(self) -> dict[str, str]:
        return dict(self.addresses)

    def _slurmd_path(self, sub: str, suffix: str) -> str:
        # %n: the node name, so that the two slurmd on this machine do not share files
        if suffix:
            return f"{self.state_dir}/{sub}/slurmd-%n{suffix}"
        return f"{self.state_dir}/{sub}/%n"

    def _slurmd_timeout(self) -> int:
        return 20

    # ----------------------------------------------------------------------------- life cycle
    def start(self, timeout: float = 90) -> TwoNodeHarness:
        reason = unavailable_reason()
        if reason:
            raise HarnessUnavailable(reason)
        super().start(timeout)
        return self

    def _before_daemons(self) -> None:
        self._network_up()

    def _start_slurmds(self) -> None:
        for node in self.nodes:
            self.start_slurmd(node)

    def start_slurmd(self, node: str) -> None:
        """slurmd of `node` in the node's network namespace, with the node's host name."""
        (self.state_dir / "slurmd-spool" / node).mkdir(parents=True, exist_ok=True)
        set_name_and_run = 'hostname "$1" && exec slurmd -f "$2" -N "$1"'
        cmd = ["nsenter", f"--net=/run/netns/{node}", "unshare", "--uts"]
        cmd += ["sh", "-c", set_name_and_run, "sh", node, str(self.conf)]
        self._daemon(f"slurmd on {node}", cmd, pid_name=f"slurmd-{node}")

    def _stop_daemons_from_pid_files(self) -> None:
        run = self.state_dir / "run"
        for node in self.nodes:
            _kill_pid_file(run / f"slurmd-{node}.pid", "slurmd")
        super()._stop_daemons_from_pid_files()
        self._network_down()

    # --------------------------------------------------------------------------------- network
    def _network_up(self) -> None:
        self._network_down()  # a stale one from a killed session
        _ip("link", "add", BRIDGE, "type", "bridge")
        _ip("addr", "add", f"{self.bridge_addr}/24", "dev", BRIDGE)
        _ip("link", "set", BRIDGE, "up")
        for node, addr in self.addresses.items():
            _ip("netns", "add", node)
            _ip("link", "add", _veth(node), "type", "veth", "peer", "name", "eth0", "netns", node)
            _ip("link", "set", _veth(node), "master", BRIDGE, "up")
            _ip("-n", node, "addr", "add", f"{addr}/24", "dev", "eth0")
            _ip("-n", node, "link", "set", "eth0", "up")
            _ip("-n", node, "link", "set", "lo", "up")
        self._hosts_lines(add=True)

    def _network_down(self) -> None:
        for node in self.nodes:
            if Path(f"/run/netns/{node}").exists():
                self.kill_node(node)
                _ip("netns", "del", node, check=False)
            _ip("link", "del", _veth(node), check=False, quiet=True)
        _ip("link", "del", BRIDGE, check=False, quiet=True)
        self._hosts_lines(add=False)

    def _hosts_lines(self, add: bool) -> None:
        """Add (or remove) our node names to /etc/hosts; only lines with our mark are touched.
        Rewritten in place: /etc/hosts may be a bind mount that a rename would not replace."""
        mark = f"{HOSTS_MARK} {self.state_dir}"
        with open(HOSTS_FILE, "r+") as hosts:
            text = hosts.read()
            kept = [line for line in text.splitlines() if not line.endswith(mark)]
            if add:
                kept += [f"{addr} {node}  {mark}" for node, addr in self.addresses.items()]
            new = "".join(line + "\n" for line in kept)
            if new != text:
                hosts.seek(0)
                hosts.write(new)
                hosts.truncate()

    # ---------------------------------------------------------------------------------- faults
    def pids_in(self, node: str) -> list[int]:
        """Processes whose network namespace is `node`'s (slurmd, the job's tasks)."""
        try:
            inode = os.stat(f"/run/netns/{node}").st_ino
        except OSError:
            return []
        pids = []
        for proc in Path("/proc").iterdir():
            if proc.name.isdigit():
                try:
                    if os.readlink(proc / "ns" / "net") == f"net:[{inode}]":
                        pids.append(int(proc.name))
                except OSError:
                    continue  # gone
        return pids

    def kill_node(self, node: str) -> list[int]:
        """SIGKILL everything running on `node` (a crashed node); return the pids."""
        pids = self.pids_in(node)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 10
        while self.pids_in(node) and time.monotonic() < deadline:
            time.sleep(0.1)
        return pids

    def cut_link(self, node: str) -> None:
        """`node` vanishes from the network; its processes keep running (a lost node)."""
        _ip("link", "set", _veth(node), "down")

    def restore_link(self, node: str) -> None:
        _ip("link", "set", _veth(node), "up")

    def node_state(self, node: str) -> str:
        proc = self.run("sinfo", "-h", "-N", "-n", node, "-o", "%T", check=False, timeout=15)
        return (proc.stdout.split() or ["unknown"])[0]  # one line per partition

    def resume_node(self, node: str, timeout: float = 60) -> None:
        """Return a DOWN node to service once its slurmd answers again, as an admin does."""
        deadline = time.monotonic() + timeout
        while True:
            state = self.node_state(node).rstrip("*$~#")
            if state in {"idle", "mixed", "allocated"}:
                return
            if state.startswith(("down", "drain")):
                self.run("scontrol", "update", f"NodeName={node}", "State=RESUME", check=False)
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"{node} still {state} after {timeout:.0f}s\n{self.diagnostics()}"
                )
            time.sleep(1)


def _veth(node: str) -> str:
    return f"{node}v"  # the host side of the node's link (at most 15 characters)


def _ip(*args: str, check: bool = True, quiet: bool = False) -> None:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, check=False, timeout=30)
    if check and proc.returncode != 0:
        raise HarnessUnavailable(f"ip {' '.join(args)}: {proc.stderr.strip()}")


def main(argv: list[str]) -> int:
    return harness_main(argv, TwoNodeHarness(), __doc__)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
