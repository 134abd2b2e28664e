"""Commands on other machines over SSH (asyncssh), for launchers whose nodes are elsewhere.

Every command is an argv list quoted with ``shlex.join``; nothing user-given is ever
pasted into shell code. A long-running server is started through one constant POSIX
``sh`` script that takes the real command as its positional arguments: it prints its
process id (the server's process group: sshd makes every session a group leader) and
leaves a watchdog in its own session that waits for the SSH channel to close. When the
channel closes without specexp stopping the server first (the connection dropped, the
orchestrator was killed), the watchdog stops the whole group (SIGTERM, then SIGKILL), so
a lost connection never leaves a headless follower running.

The launcher protocol is synchronous; asyncssh is not. ``LoopThread`` runs one event
loop in a background thread that owns the connections, and the launcher hands it
coroutines.
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import shlex
import threading
from collections.abc import Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import asyncssh

from specexp.errors import LaunchError

if TYPE_CHECKING:
    from specexp.config.schema import LauncherConfig

T = TypeVar("T")

# $0 = name, $1 = the watchdog script, $2 = its grace period, then the command.
# (An asynchronous list's stdin is /dev/null before its own redirections: the channel is
# kept on fd 3 for the watchdog.)
_MAIN = (
    'w=$1; g=$2; shift 2; echo "SPECEXP_PGID=$$"; exec 3<&0; '
    'setsid sh -c "$w" specexp-watch "$$" "$g" <&3 >/dev/null 2>&1 3<&- & '
    'exec "$@" </dev/null 3<&- 2>&1'
)
# Runs until the SSH channel's stdin closes; then the group gets SIGTERM, and SIGKILL if any
# of it is left after the grace period ($2 seconds).
_WATCH = (
    'cat >/dev/null; kill -TERM -"$1" 2>/dev/null || exit 0; i=0; '
    'while [ "$i" -lt "$2" ] && kill -0 -"$1" 2>/dev/null; do sleep 1; i=$((i+1)); done; '
    'kill -KILL -"$1" 2>/dev/null; exit 0'
)
PGID_PREFIX = "SPECEXP_PGID="


@dataclass(frozen=True)
class SshTarget:
    """Where one node is and how to log in."""

    name: str
    host: str
    port: int = 22
    user: str | None = None
    key: str | None = None
    known_hosts: str | None = None
    connect_timeout_s: float = 15.0
    keepalive_s: float = 5.0

    @property
    def where(self) -> str:
        return f"{self.name} ({self.host}:{self.port})"


def _expand(path: str | None) -> str | None:
    return str(Path(path).expanduser()) if path else None


def targets(config: LauncherConfig) -> list[SshTarget]:
    ssh = config.ssh
    return [
        SshTarget(
            name=config.node_name(rank),
            host=node.host,
            port=node.port or ssh.port,
            user=node.user or ssh.user,
            key=_expand(node.key or ssh.key),
            known_hosts=_expand(ssh.known_hosts),
            connect_timeout_s=ssh.connect_timeout_s,
            keepalive_s=ssh.keepalive_s,
        )
        for rank, node in enumerate(config.nodes)
    ]


@dataclass(frozen=True)
class Completed:
    returncode: int
    stdout: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0


def remote_command(argv: list[str] | tuple[str, ...], env: dict[str, str] | None = None) -> str:
    """One command line for the remote login shell: ``env K=V ... argv``, each word quoted."""
    words = list(argv)
    if env:
        words = ["env", *[f"{k}={v}" for k, v in env.items()], *words]
    return shlex.join(words)


def server_command(argv: list[str] | tuple[str, ...], env: dict[str, str], grace_s: float) -> str:
    """The command line that runs ``argv`` as a process group guarded by the watchdog."""
    inner = ["env", *[f"{k}={v}" for k, v in env.items()], *argv]
    return shlex.join(["sh", "-c", _MAIN, "specexp-node", _WATCH, str(max(1, round(grace_s))), *inner])


def _describe(exc: BaseException) -> str:
    if isinstance(exc, ConnectionRefusedError):
        return "SSH connection refused"
    if isinstance(exc, asyncssh.HostKeyNotVerifiable):
        return (
            f"host key not verifiable ({exc.reason}); add the node to known_hosts (launcher.ssh.known_hosts)"
        )
    if isinstance(exc, asyncssh.PermissionDenied):
        return "SSH login refused (permission denied: check launcher.ssh.user/key)"
    if isinstance(exc, asyncio.TimeoutError | TimeoutError):
        return "SSH connection timed out"
    if isinstance(exc, asyncssh.Error):
        return f"SSH error: {exc.reason}"
    if isinstance(exc, OSError):
        return f"cannot reach the node: {exc.strerror or exc}"
    return f"{type(exc).__name__}: {exc}"


class Node:
    """One node: an SSH connection and the commands specexp runs there."""

    def __init__(self, target: SshTarget, conn: asyncssh.SSHClientConnection) -> None:
        self.target = target
        self.conn = conn

    @property
    def name(self) -> str:
        return self.target.name

    @classmethod
    async def connect(cls, target: SshTarget) -> Node:
        """Log in; any failure is a LaunchError naming the node and the reason."""
        options: dict[str, Any] = {
            "port": target.port,
            "username": target.user or getpass.getuser(),
            "connect_timeout": target.connect_timeout_s,
            "keepalive_interval": target.keepalive_s,
            "keepalive_count_max": 3,
        }
        if target.key:
            options["client_keys"] = [target.key]
        if target.known_hosts:
            options["known_hosts"] = target.known_hosts
        try:
            conn = await asyncio.wait_for(
                asyncssh.connect(target.host, **options), timeout=target.connect_timeout_s + 5
            )
        except (TimeoutError, OSError, asyncssh.Error) as exc:
            raise LaunchError(f"{target.where}: {_describe(exc)}") from None
        return cls(target, conn)

    async def run(
        self, argv: list[str] | tuple[str, ...], *, timeout_s: float = 30.0, env: dict[str, str] | None = None
    ) -> Completed:
        """A short command; its output (stdout and stderr) and exit status."""
        try:
            done = await self.conn.run(
                remote_command(argv, env), check=False, timeout=timeout_s, stderr=asyncssh.STDOUT
            )
        except (TimeoutError, asyncssh.Error, OSError) as exc:
            raise LaunchError(f"{self.target.where}: {argv[0]}: {_describe(exc)}") from None
        out = done.stdout if isinstance(done.stdout, str) else (done.stdout or b"").decode(errors="replace")
        code = done.returncode if done.returncode is not None else 255
        return Completed(code, out)

    async def spawn(self, argv: tuple[str, ...], env: dict[str, str], grace_s: float) -> RemoteProcess:
        """Start a server process group; returns once its group id is known."""
        try:
            proc = await self.conn.create_process(server_command(argv, env, grace_s), encoding=None)
            first = await asyncio.wait_for(proc.stdout.readline(), timeout=self.target.connect_timeout_s)
        except (TimeoutError, asyncssh.Error, OSError) as exc:
            raise LaunchError(f"{self.target.where}: cannot start {argv[0]}: {_describe(exc)}") from None
        text = first.decode(errors="replace").strip()
        if not text.startswith(PGID_PREFIX):
            proc.close()
            raise LaunchError(
                f"{self.target.where}: the node's shell did not start the server ({text[:200]!r})"
            )
        return RemoteProcess(self, proc, int(text[len(PGID_PREFIX) :]))

    async def signal_group(self, pgid: int, signal_name: str) -> None:
        await self.run(["kill", f"-{signal_name}", "--", f"-{pgid}"], timeout_s=15)

    async def group_alive(self, pgid: int) -> bool:
        """Whether any process of the group is left (zombies do not count)."""
        out = await self.run(["ps", "-e", "-o", "pgid=,stat="], timeout_s=15)
        for line in out.stdout.splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[0] == str(pgid) and not parts[1].startswith("Z"):
                return True
        return False

    async def close(self) -> None:
        self.conn.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.conn.wait_closed(), timeout=5)


class RemoteProcess:
    """A server process group on a node, its output arriving over the SSH channel."""

    def __init__(self, node: Node, proc: asyncssh.SSHClientProcess[bytes], pgid: int) -> None:
        self.node = node
        self.proc = proc
        self.pgid = pgid

    async def readline(self) -> bytes:
        return await self.proc.stdout.readline()

    @property
    def returncode(self) -> int | None:
        """The exit status (negative: killed by that signal); None while it runs."""
        return self.proc.returncode

    async def wait_closed(self, timeout_s: float = 5.0) -> None:
        with contextlib.suppress(asyncio.TimeoutError, asyncssh.Error, OSError):
            await asyncio.wait_for(self.proc.wait_closed(), timeout=timeout_s)

    def close(self) -> None:
        self.proc.close()


class LoopThread:
    """An asyncio loop in a daemon thread; ``call`` runs a coroutine there and waits for it."""

    def __init__(self, name: str = "specexp-ssh") -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def call(self, coro: Coroutine[Any, Any, T], timeout_s: float | None = None) -> T:
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout=timeout_s)
        except TimeoutError:
            future.cancel()
            raise
        except BaseException:
            future.cancel()  # e.g. Ctrl-C while waiting: the coroutine must not run on
            raise

    def close(self) -> None:
        if self.loop.is_closed():
            return

        async def _cancel_all() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(_cancel_all(), self.loop).result(timeout=10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        if not self._thread.is_alive():
            self.loop.close()


async def connect_all(targets_: list[SshTarget]) -> list[Node]:
    """Connect to every node at once; one that fails closes the others and names itself."""
    results = await asyncio.gather(*(Node.connect(t) for t in targets_), return_exceptions=True)
    nodes = [r for r in results if isinstance(r, Node)]
    errors = [r for r in results if isinstance(r, BaseException)]
    if errors:
        for node in nodes:
            await node.close()
        raise errors[0]
    return nodes
