"""Nodes for multi-node tests: Linux network namespaces on this machine, each with its own
address, hostname, /etc/hosts and SSH server.

Layout: a "switch" namespace holds a bridge; every node namespace is joined to it by a
veth pair (``eth0`` inside the node), and so is this machine, whose side gets the
subnet's ``.254`` so the orchestrator (the test process) reaches the nodes' SSH servers
and the head's API. The subnet is a free 192.168.X.0/24: above 127.x, which the seed's
loopback hang needs. No namespace has a default route, so nothing leaves them. Each
node's sshd runs under ``unshare --uts --mount`` with the node's hostname and its own
hosts file (and any other bind mounts a test asks for, e.g. a fake /proc/meminfo or a
different checkpoint folder), key-only login, host keys in a known_hosts file of its
own. ``close()`` kills every process left in the namespaces and deletes them.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import asyncssh
import psutil
import pytest

SSHD = Path("/usr/sbin/sshd")
# $1 hostname, $2 sshd config, then pairs of (source, target) bind mounts.
_NODE_SETUP = (
    'hostname "$1"; cfg=$2; shift 2; '
    'while [ $# -gt 1 ]; do mount --bind "$1" "$2" || exit 1; shift 2; done; '
    'exec /usr/sbin/sshd -D -e -f "$cfg"'
)


def _ip(*args: str, ns: str | None = None) -> None:
    cmd = ["ip", *(["-n", ns] if ns else []), *args]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {out.stderr.strip()}")


def require_namespaces() -> None:
    """Skip (fail in CI) where this machine cannot make network namespaces with sshd in them."""
    reason = None
    if os.geteuid() != 0:
        reason = "network namespaces need root"
    elif not SSHD.exists():
        reason = "no /usr/sbin/sshd (scripts/bootstrap.sh setup installs openssh-server)"
    elif not shutil.which("ip") or not shutil.which("unshare"):
        reason = "no ip/unshare (scripts/bootstrap.sh setup installs iproute2, util-linux)"
    else:
        probe = f"sxprobe{secrets.token_hex(3)}"
        out = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
        if out.returncode != 0:
            reason = f"cannot create a network namespace: {out.stderr.strip()}"
        else:
            subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    if reason:
        if os.environ.get("CI") and os.geteuid() == 0:
            pytest.fail(f"CI: {reason}")
        pytest.skip(reason)


def _free_subnet() -> int:
    used = subprocess.run(["ip", "-o", "-4", "addr"], capture_output=True, text=True).stdout
    used += subprocess.run(["ip", "-4", "route"], capture_output=True, text=True).stdout
    for _ in range(200):
        x = 100 + secrets.randbelow(100)
        if f"192.168.{x}." not in used:
            return x
    raise RuntimeError("no free 192.168.X.0/24 subnet")


@dataclass
class SimNode:
    name: str  # hostname and node name
    ns: str
    address: str
    dir: Path
    hosts_file: Path
    sshd: subprocess.Popen[str] | None = None
    binds: list[tuple[str, str]] = field(default_factory=list)
    ifname: str = "eth0"

    def pids(self) -> list[int]:
        """Every live process in this node's network namespace."""
        out = subprocess.run(["ip", "netns", "pids", self.ns], capture_output=True, text=True).stdout
        alive = []
        for tok in out.split():
            with contextlib.suppress(psutil.Error):
                if psutil.Process(int(tok)).status() != psutil.STATUS_ZOMBIE:
                    alive.append(int(tok))
        return alive

    def leftovers(self) -> list[str]:
        """Processes on the node other than its SSH server: what a launch left behind."""
        keep = {self.sshd.pid} if self.sshd else set()
        out = []
        for pid in self.pids():
            if pid in keep:
                continue
            with contextlib.suppress(psutil.Error):
                p = psutil.Process(pid)
                cmd = " ".join(p.cmdline())[:160]
                if cmd.startswith("sshd:") and "[listener]" in cmd:
                    continue
                out.append(f"{pid} {cmd}")
        return out


class Cluster:
    """``with Cluster(2) as c:`` two nodes reachable over SSH; ``c.launcher_overrides()``."""

    def __init__(
        self,
        n: int = 2,
        *,
        loopback_hostname: tuple[int, ...] = (),
        binds: dict[int, list[tuple[str, str]]] | None = None,
        tmp: Path | None = None,
    ) -> None:
        self.id = secrets.token_hex(3)
        self.n = n
        self.subnet = 0  # picked in _create, under a lock shared by every test process
        self.dir = Path(tmp or "/tmp") / f"cluster-{self.id}"
        self.switch = f"sx{self.id}sw"
        self.root_if = f"sxr{self.id}"
        self.nodes: list[SimNode] = []
        self.loopback_hostname = loopback_hostname
        self.binds = binds or {}
        self.key = self.dir / "id_ed25519"
        self.known_hosts = self.dir / "known_hosts"

    @property
    def orchestrator_address(self) -> str:
        return f"192.168.{self.subnet}.254"

    def __enter__(self) -> Cluster:
        try:
            self._create()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _create(self) -> None:
        self.dir.mkdir(parents=True)
        Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege separation folder
        key = asyncssh.generate_private_key("ssh-ed25519")
        key.write_private_key(str(self.key))
        self.key.chmod(0o600)
        authorized = self.dir / "authorized_keys"
        authorized.write_bytes(key.export_public_key())
        _ip("netns", "add", self.switch)
        _ip("link", "add", "br0", "type", "bridge", ns=self.switch)
        _ip("link", "set", "br0", "up", ns=self.switch)
        peer = f"sxp{self.id}"
        _ip("link", "add", self.root_if, "type", "veth", "peer", "name", peer)
        _ip("link", "set", peer, "netns", self.switch)
        _ip("link", "set", peer, "master", "br0", "up", ns=self.switch)
        # Picking a free subnet and taking its address is one step for every process at once
        # (pytest-xdist workers make clusters side by side): they lock this module's own file.
        with open(__file__, "rb") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            self.subnet = _free_subnet()
            _ip("addr", "add", f"{self.orchestrator_address}/24", "dev", self.root_if)
        _ip("link", "set", self.root_if, "up")
        known = []
        for i in range(self.n):
            name = f"node{i}"
            node = SimNode(
                name=name,
                ns=f"sx{self.id}n{i}",
                address=f"192.168.{self.subnet}.{i + 1}",
                dir=self.dir / name,
                hosts_file=self.dir / name / "hosts",
                binds=list(self.binds.get(i, [])),
            )
            self.nodes.append(node)
            node.dir.mkdir()
            _ip("netns", "add", node.ns)
            inner, outer = f"sxn{self.id}{i}", f"sxb{self.id}{i}"
            _ip("link", "add", inner, "type", "veth", "peer", "name", outer)
            _ip("link", "set", inner, "netns", node.ns)
            _ip("link", "set", outer, "netns", self.switch)
            _ip("link", "set", outer, "master", "br0", "up", ns=self.switch)
            _ip("link", "set", inner, "name", node.ifname, ns=node.ns)
            _ip("addr", "add", f"{node.address}/24", "dev", node.ifname, ns=node.ns)
            _ip("link", "set", node.ifname, "up", ns=node.ns)
            _ip("link", "set", "lo", "up", ns=node.ns)
            own = "127.0.0.1" if i in self.loopback_hostname else node.address
            lines = ["127.0.0.1 localhost", f"{own} {name}"]
            lines += [f"{o.address} {o.name}" for o in self.nodes if o is not node]
            node.hosts_file.write_text("\n".join(lines) + "\n")
            host_key = asyncssh.generate_private_key("ssh-ed25519")
            host_key.write_private_key(str(node.dir / "host_key"))
            (node.dir / "host_key").chmod(0o600)
            known.append(f"{node.address} {host_key.export_public_key().decode().strip()}")
            (node.dir / "sshd_config").write_text(
                "\n".join(
                    [
                        "Port 22",
                        f"ListenAddress {node.address}",
                        f"HostKey {node.dir / 'host_key'}",
                        "PidFile none",
                        f"AuthorizedKeysFile {authorized}",
                        "PasswordAuthentication no",
                        "KbdInteractiveAuthentication no",
                        "PubkeyAuthentication yes",
                        "PermitRootLogin prohibit-password",
                        "StrictModes no",
                        "UsePAM no",
                        "Subsystem sftp internal-sftp",
                        "MaxSessions 64",
                        "MaxStartups 64:30:128",
                        "LogLevel INFO",
                    ]
                )
                + "\n"
            )
        self.known_hosts.write_text("\n".join(known) + "\n")
        for node in self.nodes:
            self.start_sshd(node)

    def start_sshd(self, node: SimNode) -> None:
        binds = [str(node.hosts_file), "/etc/hosts"]
        for src, dst in node.binds:
            binds += [src, dst]
        argv = [
            "ip", "netns", "exec", node.ns, "unshare", "--uts", "--mount", "--propagation", "private",
            "sh", "-c", _NODE_SETUP, "node-setup", node.name, str(node.dir / "sshd_config"), *binds,
        ]  # fmt: skip
        node.sshd = subprocess.Popen(argv, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
        listening = threading.Event()
        log = node.dir / "sshd.log"

        def pump(stream: subprocess.Popen[str]) -> None:
            assert stream.stderr is not None
            with open(log, "a") as fh:
                for line in stream.stderr:
                    fh.write(line)
                    fh.flush()
                    if "Server listening on" in line:
                        listening.set()

        threading.Thread(target=pump, args=(node.sshd,), daemon=True).start()
        if not listening.wait(timeout=20):
            raise RuntimeError(f"sshd on {node.name} did not start: {log.read_text()[-500:]}")

    def stop_sshd(self, node: SimNode) -> None:
        """Take a node's SSH server away (its connections too): logins are then refused."""
        if node.sshd is not None:
            for pid in node.pids():
                with contextlib.suppress(psutil.Error):
                    p = psutil.Process(pid)
                    if p.name() == "sshd":
                        p.kill()
            node.sshd.wait(timeout=10)
            node.sshd = None

    def node_dicts(self, env: dict[int, dict[str, str]] | None = None) -> list[dict[str, object]]:
        return [
            {
                "host": n.address,
                "name": n.name,
                "env": {"GLOO_SOCKET_IFNAME": n.ifname, **(env or {}).get(i, {})},
            }
            for i, n in enumerate(self.nodes)
        ]

    def overrides(self, *, gloo: bool = True, env: dict[int, dict[str, str]] | None = None) -> list[str]:
        """Hydra overrides that point launcher=multinode at these nodes."""
        nodes = []
        for i, n in enumerate(self.nodes):
            node_env = {"GLOO_SOCKET_IFNAME": n.ifname} if gloo else {}
            node_env.update((env or {}).get(i, {}))
            env_text = ", ".join(f"{k}: '{v}'" for k, v in node_env.items())
            nodes.append(f"{{host: '{n.address}', name: {n.name}, env: {{{env_text}}}}}")
        return [
            "launcher=multinode",
            f"launcher.nodes=[{', '.join(nodes)}]",
            f"launcher.ssh.key={self.key}",
            f"launcher.ssh.known_hosts={self.known_hosts}",
            "launcher.ssh.user=root",
            "server.host=0.0.0.0",
        ]

    def close(self) -> None:
        for node in self.nodes:
            for pid in node.pids():
                with contextlib.suppress(psutil.Error):
                    psutil.Process(pid).kill()
            if node.sshd is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    node.sshd.wait(timeout=10)
        for ns in [n.ns for n in self.nodes] + [self.switch]:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        subprocess.run(["ip", "link", "del", self.root_if], capture_output=True)
        shutil.rmtree(self.dir, ignore_errors=True)


def wait_until(predicate: object, timeout_s: float = 20.0, what: str = "condition") -> None:
    """Poll a condition (a process gone, a line logged) until it holds or the deadline passes."""
    assert callable(predicate)
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g}s waiting for {what}")
        time.sleep(0.1)


@contextlib.contextmanager
def cluster(
    n: int = 2,
    *,
    loopback_hostname: tuple[int, ...] = (),
    binds: dict[int, list[tuple[str, str]]] | None = None,
) -> Iterator[Cluster]:
    require_namespaces()
    with Cluster(n, loopback_hostname=loopback_hostname, binds=binds) as c:
        yield c
