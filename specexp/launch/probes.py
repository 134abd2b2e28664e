"""Facts read from a node over SSH with standard tools (no Python or specexp needed there):
available memory, free ports, the device, listening sockets, hostname resolution,
addresses per interface, processes, a process's environment, py-spy stacks.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass, field

from specexp.errors import LaunchError
from specexp.launch.ssh import Node

GIB = 1024**3


async def available_gib(node: Node) -> float:
    """``MemAvailable`` from /proc/meminfo: what the kernel says can be had without swapping."""
    out = await node.run(["cat", "/proc/meminfo"], timeout_s=15)
    m = re.search(r"^MemAvailable:\s+(\d+)\s*kB", out.stdout, re.MULTILINE)
    if not out.ok or m is None:
        raise LaunchError(f"{node.target.where}: cannot read available memory from /proc/meminfo")
    return int(m.group(1)) * 1024 / GIB


async def listening_ports(node: Node) -> set[int]:
    out = await node.run(["ss", "-Htln"], timeout_s=15)
    ports: set[int] = set()
    for line in out.stdout.splitlines():
        parts = line.split()
        if len(parts) >= 4 and ":" in parts[3]:
            tail = parts[3].rsplit(":", 1)[1]
            if tail.isdigit():
                ports.add(int(tail))
    return ports


async def free_ports(node: Node, count: int, avoid: set[int] | None = None) -> list[int]:
    """Ports nobody listens on at the node, from above the usual ephemeral range's start."""
    used = await listening_ports(node) | (avoid or set())
    picked: list[int] = []
    while len(picked) < count:
        port = 20000 + secrets.randbelow(30000)
        if port not in used and port not in picked:
            picked.append(port)
    return picked


async def device(node: Node) -> str:
    """``cuda`` when the node's nvidia-smi lists a GPU, else ``cpu``."""
    try:
        out = await node.run(["nvidia-smi", "-L"], timeout_s=20)
    except LaunchError:
        return "cpu"
    return "cuda" if out.ok and "GPU" in out.stdout else "cpu"


@dataclass(frozen=True)
class Listener:
    address: str
    port: int
    processes: tuple[tuple[str, int], ...]  # (name, pid)

    @property
    def loopback(self) -> bool:
        return self.address.startswith("127.") or self.address in ("::1", "[::1]")


_USERS = re.compile(r'\("([^"]*)",pid=(\d+)')


def parse_ss(text: str) -> list[Listener]:
    """``ss -Htlnp`` lines: ``LISTEN 0 128 127.0.0.1:4242 0.0.0.0:* users:(("VLLM::Worker",pid=7,fd=9))``."""
    out = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 4 or ":" not in parts[3]:
            continue
        address, _, port = parts[3].rpartition(":")
        if not port.isdigit():
            continue
        users = tuple((name, int(pid)) for name, pid in _USERS.findall(line))
        out.append(Listener(address.strip("[]"), int(port), users))
    return out


async def listeners(node: Node) -> list[Listener]:
    return parse_ss((await node.run(["ss", "-Htlnp"], timeout_s=15)).stdout)


@dataclass(frozen=True)
class Resolution:
    hostname: str
    addresses: tuple[str, ...]

    @property
    def loopback(self) -> bool:
        return any(a.startswith("127.") for a in self.addresses)


async def hostname_resolution(node: Node) -> Resolution:
    name = (await node.run(["hostname"], timeout_s=15)).stdout.strip()
    out = await node.run(["getent", "ahostsv4", name], timeout_s=15) if name else None
    addresses: list[str] = []
    for line in out.stdout.splitlines() if out is not None else []:
        first = line.split()[0] if line.split() else ""
        if first and first not in addresses:
            addresses.append(first)
    return Resolution(name, tuple(addresses))


async def interfaces(node: Node) -> dict[str, str]:
    """address -> interface name, from ``ip -o -4 addr show``."""
    out = await node.run(["ip", "-o", "-4", "addr", "show"], timeout_s=15)
    found: dict[str, str] = {}
    for line in out.stdout.splitlines():
        m = re.match(r"\d+:\s+(\S+)\s+inet\s+([\d.]+)/", line)
        if m:
            found[m.group(2)] = m.group(1).split("@")[0]
    return found


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    pgid: int
    comm: str
    args: str

    @property
    def is_vllm(self) -> bool:
        return self.comm.startswith("VLLM") or "vllm" in self.args.lower()


async def processes(node: Node) -> list[Proc]:
    out = await node.run(["ps", "-e", "-o", "pid=,ppid=,pgid=,stat=,comm=,args="], timeout_s=15)
    procs = []
    for line in out.stdout.splitlines():
        parts = line.split(None, 5)
        if len(parts) < 5 or not parts[0].isdigit() or parts[3].startswith("Z"):
            continue
        args = parts[5] if len(parts) > 5 else parts[4]
        procs.append(Proc(int(parts[0]), int(parts[1]), int(parts[2]), parts[4], args))
    return procs


async def environ(node: Node, pid: int) -> dict[str, str]:
    out = await node.run(["cat", f"/proc/{pid}/environ"], timeout_s=15)
    env: dict[str, str] = {}
    for item in out.stdout.split("\0"):
        key, sep, value = item.partition("=")
        if sep:
            env[key] = value
    return env


@dataclass
class Stack:
    pid: int
    name: str
    text: str = ""
    error: str | None = None
    frames: list[str] = field(default_factory=list)


async def py_spy_dump(node: Node, py_spy: list[str], pid: int, name: str, timeout_s: float) -> Stack:
    """One process's stacks, native frames included (gloo's C++ wait shows only there)."""
    try:
        out = await node.run([*py_spy, "dump", "--native", "--pid", str(pid)], timeout_s=timeout_s)
    except LaunchError as exc:
        return Stack(pid, name, error=str(exc))
    if not out.ok:
        return Stack(
            pid, name, error=out.stdout.strip().splitlines()[-1][:300] if out.stdout.strip() else "failed"
        )
    frames = [ln.strip() for ln in out.stdout.splitlines() if ln.startswith(" ")]
    return Stack(pid, name, out.stdout, frames=frames)
