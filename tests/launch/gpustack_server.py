"""A real GPUStack server (with its own PostgreSQL 15) for the tests, in a private network
namespace, reached through a Unix-socket relay on a loopback port of this machine.

``gpustack_server(version)`` starts one, logs in with the bootstrap password, creates the
cluster a fresh server needs before any model (``POST /v2/clusters``) and an API key, and
yields a ``RealGpustack``; leaving the block stops everything and checks nothing is left.
Installed by ``scripts/bootstrap.sh setup`` (``$SPECEXP_HOME/venvs/gpustack-<version>``);
tests skip with the reason when it or namespaces are missing.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil
import pytest

from specexp.paths import home

SUPERVISOR = Path(__file__).parents[1] / "fakes" / "gpustack_netns.py"
PG_BIN = Path("/usr/lib/postgresql/15/bin/postgres")


@dataclass(frozen=True)
class RealGpustack:
    version: str
    url: str  # http://127.0.0.1:<relay port>
    api_key: str
    cluster_id: int
    log: Path  # the server's own log


def gpustack_bin(version: str) -> Path:
    return home() / "venvs" / f"gpustack-{version}" / "bin" / "gpustack"


def skip_reason(version: str) -> str | None:
    if not gpustack_bin(version).exists():
        return f"GPUStack {version} is not installed (scripts/bootstrap.sh setup installs it)"
    if not PG_BIN.exists():
        return "PostgreSQL 15 is not installed (scripts/bootstrap.sh setup installs it)"
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return "private network namespaces need root and unshare"
    probe = subprocess.run(["unshare", "-n", "true"], capture_output=True, check=False)
    if probe.returncode != 0:
        return f"cannot create a network namespace: {probe.stderr.decode().strip()}"
    return None


class _Relay:
    """Loopback TCP port on this machine -> the namespace's Unix socket."""

    def __init__(self, socket_path: str) -> None:
        self.socket_path = socket_path
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.port = int(self.listener.getsockname()[1])
        self._closed = False
        self._thread = threading.Thread(target=self._accept, daemon=True, name="gpustack-relay")
        self._thread.start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            upstream.connect(self.socket_path)
        except OSError:
            client.close()
            upstream.close()
            return

        def pump(src: socket.socket, dst: socket.socket) -> None:
            try:
                while data := src.recv(65536):
                    dst.sendall(data)
            except OSError:
                pass
            finally:
                with contextlib.suppress(OSError):
                    dst.shutdown(socket.SHUT_WR)

        back = threading.Thread(target=pump, args=(upstream, client), daemon=True)
        back.start()
        pump(client, upstream)
        back.join(timeout=60)
        client.close()
        upstream.close()

    def close(self) -> None:
        self._closed = True
        self.listener.close()


def _wait_ready(url: str, proc: subprocess.Popen[bytes], log: Path, deadline_s: float) -> None:
    t0 = time.monotonic()
    with httpx.Client(timeout=3.0) as client:
        while time.monotonic() - t0 < deadline_s:
            if proc.poll() is not None:
                raise RuntimeError(f"the namespace supervisor exited ({proc.returncode}); see {log}")
            try:
                if client.get(f"{url}/readyz").status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
    raise RuntimeError(f"GPUStack not ready after {deadline_s:.0f} s; see {log}")


def _bootstrap(url: str, password: str) -> tuple[str, int]:
    """Log in, create the cluster a fresh server needs, and an API key."""
    with httpx.Client(base_url=url, timeout=30.0) as client:
        client.post("/auth/login", data={"username": "admin", "password": password}).raise_for_status()
        created = client.post("/v2/clusters", json={"name": "default"})
        created.raise_for_status()
        key = client.post("/v2/api-keys", json={"name": "specexp-test"})
        key.raise_for_status()
        return str(key.json()["value"]), int(created.json()["id"])


def _leftovers(pid: int) -> list[psutil.Process]:
    """Processes still running in the namespace the supervisor created."""
    try:
        netns = Path(f"/proc/{pid}/ns/net").readlink()
    except OSError:
        return []
    out = []
    for proc in psutil.process_iter():
        with contextlib.suppress(OSError, psutil.Error):
            if Path(f"/proc/{proc.pid}/ns/net").readlink() == netns and proc.status() != psutil.STATUS_ZOMBIE:
                out.append(proc)
    return out


@contextlib.contextmanager
def gpustack_server(version: str, *, ready_timeout_s: float = 240.0) -> Iterator[RealGpustack]:
    reason = skip_reason(version)
    if reason:
        pytest.skip(reason)
    # PostgreSQL runs as its own user: its folders must not lie under root-only /tmp/pytest-of-root.
    work = Path(tempfile.mkdtemp(prefix=f"specexp-gpustack-{version}-"))
    work.chmod(0o755)
    sock = str(work / "api.sock")
    password = secrets.token_urlsafe(12)
    out = open(work / "supervisor.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [
            "unshare",
            "-n",
            "--",
            sys.executable,
            str(SUPERVISOR),
            str(gpustack_bin(version)),
            str(work),
            sock,
            password,
        ],
        stdout=out,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    relay = _Relay(sock)
    url = f"http://127.0.0.1:{relay.port}"
    inner: list[psutil.Process] = []
    try:
        _wait_ready(url, proc, work / "gpustack.log", ready_timeout_s)
        inner = _leftovers(proc.pid)
        key, cluster_id = _bootstrap(url, password)
        yield RealGpustack(version, url, key, cluster_id, work / "gpustack.log")
    finally:
        inner = inner or _leftovers(proc.pid)
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        relay.close()
        out.close()
        alive = [p for p in inner if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        for p in alive:  # never leave a server behind, even when the supervisor failed
            with contextlib.suppress(psutil.Error):
                p.kill()
        shutil.rmtree(work, ignore_errors=True)
        assert not alive, f"processes left in the GPUStack namespace: {[p.pid for p in alive]}"
