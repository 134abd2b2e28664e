"""Run PostgreSQL 15 and a real GPUStack server inside a private network namespace.

usage: unshare -n -- python gpustack_netns.py GPUSTACK_BIN WORKDIR SOCKET PASSWORD

GPUStack listens on 0.0.0.0 (two ports) and cannot be told otherwise, so it runs in a
namespace of its own with only ``lo``: nothing outside can reach it and it reaches
nothing. The test talks to it through SOCKET, a Unix socket (a file, so it crosses
network namespaces) relayed here to GPUStack's API port. PostgreSQL listens on the
namespace's loopback only, with its data in WORKDIR. SIGTERM stops GPUStack's process
group, then PostgreSQL (fast shutdown), then this script: the namespace dies with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pwd
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

API_PORT = 30080
PG_PORT = 5432
PG_BIN = Path("/usr/lib/postgresql/15/bin")


def log(msg: str) -> None:
    print(f"[netns] {msg}", flush=True)


def as_postgres(argv: list[str], **kw: object) -> subprocess.Popen[bytes]:
    """PostgreSQL refuses to run as root; run it as the ``postgres`` user, without a
    wrapper process in between (signals then reach the server itself)."""
    pg = pwd.getpwnam("postgres")
    return subprocess.Popen(  # type: ignore[call-overload]
        argv, user=pg.pw_uid, group=pg.pw_gid, extra_groups=[], cwd="/", **kw
    )


def start_postgres(work: Path) -> subprocess.Popen[bytes]:
    pg = pwd.getpwnam("postgres")
    data, sock = work / "pg", work / "pgsock"
    for d in (data, sock):
        d.mkdir(mode=0o700)
        os.chown(d, pg.pw_uid, pg.pw_gid)
    init = as_postgres(
        [str(PG_BIN / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres", "--no-sync"],
        stdout=subprocess.DEVNULL,
    )
    if init.wait() != 0:
        raise SystemExit("initdb failed")
    out = open(work / "postgres.log", "wb")  # noqa: SIM115 - lives as long as the server
    server = as_postgres(
        [
            str(PG_BIN / "postgres"),
            "-D",
            str(data),
            "-p",
            str(PG_PORT),
            "-k",
            str(sock),
            "-c",
            "listen_addresses=127.0.0.1",
            "-c",
            "fsync=off",
            "-c",
            "synchronous_commit=off",
            "-c",
            "full_page_writes=off",
        ],
        stdout=out,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        ready = subprocess.run(
            [str(PG_BIN / "pg_isready"), "-h", "127.0.0.1", "-p", str(PG_PORT), "-q"], check=False
        )
        if ready.returncode == 0:
            break
        if server.poll() is not None:
            raise SystemExit("postgres exited during startup")
        time.sleep(0.2)
    else:
        raise SystemExit("postgres not ready after 60 s")
    created = as_postgres(
        [str(PG_BIN / "createdb"), "-h", "127.0.0.1", "-p", str(PG_PORT), "-U", "postgres", "gpustack"]
    )
    if created.wait() != 0:
        raise SystemExit("createdb failed")
    return server


def start_gpustack(binary: str, work: Path, password: str) -> subprocess.Popen[bytes]:
    out = open(work / "gpustack.log", "wb")  # noqa: SIM115 - lives as long as the server
    return subprocess.Popen(
        [
            binary,
            "start",
            "--data-dir",
            str(work / "gpustack-data"),
            "--database-url",
            f"postgresql://postgres@127.0.0.1:{PG_PORT}/gpustack?sslmode=disable",
            "--gateway-mode",
            "disabled",
            "--api-port",
            str(API_PORT),
            "--advertise-address",
            "127.0.0.1",
            "--disable-update-check",
            "--disable-builtin-observability",
            "--disable-metrics",
            "--system-default-container-registry",
            "docker.io",
            "--bootstrap-password",
            password,
        ],
        stdout=out,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        env={**os.environ, "HOME": str(work), "XDG_CACHE_HOME": str(work / "cache")},
    )


async def relay(socket_path: str) -> None:
    """Unix socket (reachable from outside the namespace) -> GPUStack's API port."""

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()

    async def handle(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            server_r, server_w = await asyncio.open_connection("127.0.0.1", API_PORT)
        except OSError:
            client_w.close()
            return
        await asyncio.gather(pipe(client_r, server_w), pipe(server_r, client_w))

    server = await asyncio.start_unix_server(handle, path=socket_path)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    log("relay ready")
    await stop.wait()
    server.close()


def stop_group(proc: subprocess.Popen[bytes], timeout: float = 15.0) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=timeout)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # what is left of the group (its helpers)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)


def main() -> None:
    binary, work, socket_path, password = sys.argv[1], Path(sys.argv[2]), sys.argv[3], sys.argv[4]
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # unwind through the finally below
    postgres = gpustack = None
    try:
        postgres = start_postgres(work)
        log("postgres ready")
        gpustack = start_gpustack(binary, work, password)
        log(f"gpustack started (pid {gpustack.pid})")
        asyncio.run(relay(socket_path))
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if gpustack is not None:
            stop_group(gpustack)
        if postgres is not None:
            postgres.send_signal(signal.SIGINT)  # fast shutdown
            try:
                postgres.wait(timeout=20)
            except subprocess.TimeoutExpired:
                postgres.kill()
                postgres.wait()
        Path(socket_path).unlink(missing_ok=True)
        shutil.rmtree(work / "pg", ignore_errors=True)
        log("stopped")


if __name__ == "__main__":
    main()
