"""The startup-hang doctor: why a multi-node vLLM start stopped making progress.

Seed 003's silent hang: every rank stopped during initialization with no error in any
log. py-spy showed gloo waiting in ``Pair::waitUntilConnected``; the workers listened
only on 127.0.0.1, because the container's /etc/hosts mapped the hostname to a loopback
address and Gloo took its address from the hostname (``GLOO_SOCKET_IFNAME`` was unset;
``NCCL_SOCKET_IFNAME`` does not help Gloo). The doctor reads the same evidence on every
node at once, within its own deadline:

- py-spy stacks (``--native``) of the server's processes;
- the TCP addresses they listen on (``ss``); with ``nnodes > 1``, a vLLM process that
  listens only on 127.x is the misconfiguration;
- what the node's hostname resolves to;
- whether the server's environment has ``GLOO_SOCKET_IFNAME``, and which interface holds
  the node's address (the value to set).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from specexp.errors import LaunchError
from specexp.launch import probes
from specexp.launch.probes import Listener, Proc, Resolution, Stack
from specexp.launch.ssh import Node

GLOO_WAIT = ("waitUntilConnected", "connectFullMesh")
_DUMPABLE = ("VLLM", "python", "vllm", "pt_")


@dataclass
class NodeReport:
    name: str
    where: str
    address: str
    hostname: Resolution | None = None
    servers: list[Proc] = field(default_factory=list)
    listeners: dict[int, list[Listener]] = field(default_factory=dict)  # pid -> its listeners
    env: dict[str, str] | None = None
    interface: str | None = None  # the interface holding the node's address
    stacks: list[Stack] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Finding:
    node: str
    text: str


@dataclass
class Diagnosis:
    nnodes: int
    nodes: list[NodeReport]
    findings: list[Finding] = field(default_factory=list)
    cause: str | None = None  # the misconfiguration, when the evidence names one
    elapsed_s: float = 0.0
    timed_out: bool = False

    def render(self) -> str:
        lines = [f"specexp doctor: {len(self.nodes)} node(s), nnodes={self.nnodes}, {self.elapsed_s:.1f}s"]
        if self.timed_out:
            lines.append("  (deadline reached: what was read by then)")
        for rep in self.nodes:
            lines.append(f"[{rep.name}] {rep.where}")
            if rep.hostname is not None:
                to = ", ".join(rep.hostname.addresses) or "nothing"
                lines.append(f"  hostname {rep.hostname.hostname} resolves to {to}")
            if rep.env is not None:
                gloo = rep.env.get("GLOO_SOCKET_IFNAME")
                lines.append(f"  GLOO_SOCKET_IFNAME={gloo}" if gloo else "  GLOO_SOCKET_IFNAME is not set")
            if rep.interface:
                lines.append(f"  {rep.address} is on interface {rep.interface}")
            if not rep.servers:
                lines.append("  no vLLM server process")
            for proc in rep.servers:
                listen = rep.listeners.get(proc.pid, [])
                where = ", ".join(f"{ln.address}:{ln.port}" for ln in listen) or "no TCP port"
                lines.append(f"  pid {proc.pid} {proc.comm}: listens on {where}")
            for stack in rep.stacks:
                if stack.error:
                    lines.append(f"  py-spy pid {stack.pid}: {stack.error}")
                    continue
                top = [f for f in stack.frames if any(w in f for w in GLOO_WAIT)] or stack.frames[:4]
                lines.append(f"  stack of pid {stack.pid} ({stack.name}):")
                lines += [f"      {frame}" for frame in top[:6]]
            lines += [f"  error: {e}" for e in rep.errors]
        lines.append("findings:" if self.findings else "findings: none")
        lines += [f"  - {f.node}: {f.text}" for f in self.findings]
        if self.cause:
            lines.append(f"cause: {self.cause}")
        return "\n".join(lines)


async def _examine(
    node: Node, address: str, pgid: int | None, py_spy: list[str], deadline: float
) -> NodeReport:
    rep = NodeReport(node.name, node.target.where, address)
    try:
        procs = await probes.processes(node)
        if pgid is not None:
            rep.servers = [p for p in procs if p.pgid == pgid]
        else:
            rep.servers = [p for p in procs if p.is_vllm]
        rep.hostname = await probes.hostname_resolution(node)
        rep.interface = (await probes.interfaces(node)).get(address)
        pids = {p.pid for p in rep.servers}
        for listener in await probes.listeners(node):
            for _, pid in listener.processes:
                if pid in pids:
                    rep.listeners.setdefault(pid, []).append(listener)
        leader = next((p for p in rep.servers if p.pid == pgid), None) or next(
            (p for p in rep.servers if p.comm.startswith(_DUMPABLE) or "python" in p.args), None
        )
        if leader is not None:
            rep.env = await probes.environ(node, leader.pid)
        for proc in rep.servers:
            if not (proc.comm.startswith(_DUMPABLE) or "python" in proc.args):
                continue
            left = deadline - time.monotonic()
            if left < 2:
                rep.errors.append(f"no time left to dump pid {proc.pid}")
                break
            rep.stacks.append(await probes.py_spy_dump(node, py_spy, proc.pid, proc.comm, min(30.0, left)))
    except LaunchError as exc:
        rep.errors.append(str(exc))
    return rep


def _judge(diag: Diagnosis) -> None:
    multi = diag.nnodes > 1
    causes: list[str] = []
    for rep in diag.nodes:
        waiting = [s for s in rep.stacks if any(w in s.text for w in GLOO_WAIT)]
        if waiting:
            frames = " <- ".join(
                dict.fromkeys(f.split(" (")[0] for f in waiting[0].frames if any(w in f for w in GLOO_WAIT))
            )
            diag.findings.append(
                Finding(rep.name, f"gloo waits for a peer to connect (pid {waiting[0].pid}: {frames})")
            )
        loopback_only = [
            (proc, rep.listeners[proc.pid])
            for proc in rep.servers
            if rep.listeners.get(proc.pid) and all(ln.loopback for ln in rep.listeners[proc.pid])
        ]
        for proc, listen in loopback_only if multi else []:
            where = ", ".join(f"{ln.address}:{ln.port}" for ln in listen)
            diag.findings.append(
                Finding(
                    rep.name,
                    f"{proc.comm} (pid {proc.pid}) listens only on {where}: with nnodes={diag.nnodes} "
                    "no other node can connect to it",
                )
            )
        resolves_loopback = rep.hostname is not None and rep.hostname.loopback
        if resolves_loopback:
            assert rep.hostname is not None
            diag.findings.append(
                Finding(
                    rep.name,
                    f"hostname {rep.hostname.hostname} resolves to {', '.join(rep.hostname.addresses)} "
                    "(a loopback address; Gloo takes its address from the hostname)",
                )
            )
        no_gloo = multi and rep.env is not None and not rep.env.get("GLOO_SOCKET_IFNAME")
        if no_gloo:
            diag.findings.append(
                Finding(rep.name, "GLOO_SOCKET_IFNAME is not set in the server's environment")
            )
        if multi and loopback_only and (resolves_loopback or no_gloo or waiting):
            proc, listen = loopback_only[0]
            why = []
            if resolves_loopback:
                assert rep.hostname is not None
                why.append(f"its hostname {rep.hostname.hostname} resolves to {rep.hostname.addresses[0]}")
            if no_gloo:
                why.append("GLOO_SOCKET_IFNAME is unset")
            iface = rep.interface or "<the interface holding the node's address>"
            causes.append(
                f"{rep.name}: Gloo bound to a loopback address ({'; '.join(why) or 'see findings'}): "
                f"{proc.comm} listens only on {listen[0].address}:{listen[0].port}, so the other nodes "
                f"can never connect. Fix: set GLOO_SOCKET_IFNAME={iface} on {rep.name} "
                f"(launcher.nodes[].env), or map its hostname to {rep.address} in /etc/hosts"
            )
    diag.cause = "; ".join(causes) or None


async def diagnose(
    nodes: list[Node],
    addresses: list[str],
    *,
    nnodes: int,
    pgids: list[int | None] | None = None,
    py_spy: list[str] | None = None,
    timeout_s: float = 60.0,
) -> Diagnosis:
    """Examine every node at once; whatever was read by the deadline is judged."""
    t0 = time.monotonic()
    deadline = t0 + timeout_s
    groups = pgids or [None] * len(nodes)
    tasks = [
        asyncio.ensure_future(_examine(n, a, g, py_spy or ["py-spy"], deadline))
        for n, a, g in zip(nodes, addresses, groups, strict=True)
    ]
    done, pending = await asyncio.wait(tasks, timeout=timeout_s)
    for task in pending:
        task.cancel()
    reports = []
    for node, address, task in zip(nodes, addresses, tasks, strict=True):
        if task in done and task.exception() is None:
            reports.append(task.result())
        else:
            reports.append(
                NodeReport(node.name, node.target.where, address, errors=["not examined before the deadline"])
            )
    diag = Diagnosis(nnodes, reports, timed_out=bool(pending))
    _judge(diag)
    diag.elapsed_s = round(time.monotonic() - t0, 2)
    return diag
