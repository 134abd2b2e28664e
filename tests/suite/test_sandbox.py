"""Hostile code against the jail: none of it may see or reach anything outside."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from specexp.suite import sandbox
from specexp.suite.sandbox import run_python

CHECKOUT_FILE = Path(__file__).resolve()


def test_the_root_holds_only_the_interpreter_and_system_libraries() -> None:
    run = run_python("import os, sys; print(sorted(os.listdir('/'))); print(sys.prefix)")
    assert run.returncode == 0, run.stderr
    listed_line, prefix = run.stdout.splitlines()
    listed = set(eval(listed_line))
    allowed = {"dev", "proc", "tmp", "usr", "bin", "lib", "lib32", "lib64", Path(prefix).parts[1]}
    assert {"dev", "proc", "tmp"} <= listed <= allowed
    assert not listed & {"etc", "root", "home", "var", "opt"} - {Path(prefix).parts[1]}


def test_code_cannot_read_a_file_of_the_checkout() -> None:
    folder, file = str(CHECKOUT_FILE.parent), str(CHECKOUT_FILE)
    run = run_python(f"import os\nprint(os.path.exists({folder!r}))\nopen({file!r}).read()")
    assert run.stdout.strip() == "False"
    assert run.returncode != 0 and "FileNotFoundError" in run.stderr
    passwd = run_python("print(open('/etc/passwd').read())")
    assert passwd.returncode != 0 and "root:" not in passwd.stdout


@pytest.fixture
def process_with_a_secret() -> Iterator[tuple[int, str]]:
    """A process whose command line holds a secret, as ``vllm serve --api-key`` would."""
    secret = f"sk-{uuid.uuid4().hex}"
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()", f"--api-key={secret}"],
                            stdin=subprocess.PIPE)  # fmt: skip
    try:
        assert secret in " ".join(psutil.Process(proc.pid).cmdline())  # visible on the host
        yield proc.pid, secret
    finally:
        proc.kill()
        proc.wait()


def test_code_cannot_read_another_process_command_line(process_with_a_secret: tuple[int, str]) -> None:
    pid, secret = process_with_a_secret
    run = run_python(
        "import os\n"
        "print('own:', open('/proc/self/cmdline', 'rb').read().split(b'\\0')[:2])\n"  # /proc works
        "seen = []\n"
        "for p in os.listdir('/proc'):\n"
        "    if p.isdigit():\n"
        "        seen.append(open(f'/proc/{p}/cmdline', 'rb').read().decode(errors='replace'))\n"
        "print('pids:', len(seen))\n"
        "print('\\n'.join(seen))\n"
        f"print('direct:', os.path.exists('/proc/{pid}'))\n"
    )
    assert run.returncode == 0, run.stderr
    assert "own: [b'" in run.stdout and "b'-I'" in run.stdout
    assert secret not in run.stdout
    assert "direct: False" in run.stdout
    pids = int(run.stdout.split("pids: ")[1].split()[0])
    assert 1 <= pids <= 3  # bwrap's init, the code, perhaps a helper: nothing of the host


def test_code_cannot_write_outside_its_temp_dir() -> None:
    # a folder anyone may write to, outside /tmp: the jail does not hold it at all
    base = Path("/var/tmp") if Path("/var/tmp").is_dir() else Path(__file__).parent
    folder = Path(tempfile.mkdtemp(dir=base, prefix="specexp-sandbox-target-"))
    folder.chmod(0o777)
    try:
        target = folder / "escaped.txt"
        run = run_python(f"open({str(target)!r}, 'w').write('x')")
        assert run.returncode != 0 and not target.exists()
    finally:
        shutil.rmtree(folder)
    usr = run_python("open('/usr/specexp-escaped', 'w').write('x')")
    assert "Read-only file system" in usr.stderr and not Path("/usr/specexp-escaped").exists()
    inside = run_python("open('/tmp/inside.txt', 'w').write('ok'); print(open('/tmp/inside.txt').read())")
    assert inside.returncode == 0 and inside.stdout.strip() == "ok"
    assert not Path("/tmp/inside.txt").exists()  # its /tmp was private and is gone


def test_code_has_no_network() -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.setblocking(False)
    port = server.getsockname()[1]
    try:
        run = run_python(
            "import socket\n"
            "print(sorted(name for _, name in socket.if_nameindex()))\n"
            f"socket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
        )
        with pytest.raises(BlockingIOError):
            server.accept()  # a connection would be queued by now: nothing ever arrived
    finally:
        server.close()
    assert run.stdout.strip() == "['lo']"  # a loopback of its own, no other interface
    assert run.returncode != 0 and "ConnectionRefusedError" in run.stderr


def _jailed(marker: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        if marker in " ".join(proc.info["cmdline"] or []):
            found.append(proc)
    return found


DAEMON = (
    "import os, sys\n"
    "if os.fork() == 0:\n"
    "    os.setsid()\n"
    "    if os.fork() == 0:\n"
    "        os.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(600)', '{marker}'])\n"
    "    os._exit(0)\n"
    "print('started a daemon', flush=True)\n"
)


def test_daemons_started_by_the_code_die_with_it() -> None:
    marker = f"daemon-{uuid.uuid4().hex}"
    run = run_python(DAEMON.format(marker=marker), timeout_s=5)
    assert run.returncode == 0 and "started a daemon" in run.stdout
    _, alive = psutil.wait_procs(_jailed(marker), timeout=10)
    assert alive == []


def test_code_is_killed_at_its_time_limit_sleeping_or_spinning_with_its_daemons() -> None:
    for body in ("while True: pass", "import time\nwhile True: time.sleep(1)"):
        marker = f"daemon-{uuid.uuid4().hex}"
        t0 = time.monotonic()
        run = run_python(DAEMON.format(marker=marker) + body, timeout_s=1.5)
        assert run.timed_out and "started a daemon" in run.stdout
        assert time.monotonic() - t0 < 15  # far below "never": the code itself never ends
        _, alive = psutil.wait_procs(_jailed(marker), timeout=10)
        assert alive == []


def test_code_cannot_remount_or_gain_privileges() -> None:
    run = run_python(
        "import ctypes, os\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "MS_REMOUNT, MS_BIND = 32, 4096\n"
        "r = libc.mount(b'none', b'/usr', None, MS_REMOUNT | MS_BIND, None)\n"
        "print('mount', r, os.strerror(ctypes.get_errno()))\n"
        "print('caps', [l for l in open('/proc/self/status') if l.startswith('CapEff')])\n"
        "try:\n"
        "    os.setuid(0)\n"
        "except OSError:\n"
        "    print('setuid refused')\n"
        "print('uid', os.getuid())\n"
    )
    assert run.returncode == 0, run.stderr
    assert "mount -1 Operation not permitted" in run.stdout
    assert "CapEff:\\t0000000000000000" in run.stdout
    assert "setuid refused" in run.stdout and "uid 65534" in run.stdout


def test_an_output_flood_stops_at_the_file_size_limit() -> None:
    run = run_python("import sys\nwhile True: sys.stdout.write('x' * (1 << 20))", timeout_s=20)
    assert not run.timed_out and run.returncode != 0 and "File too large" in run.stderr
    assert len(run.stdout) <= sandbox.KEEP_CHARS


def test_without_bubblewrap_the_code_is_not_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # neither bwrap nor prlimit on PATH
    marker = tmp_path / "ran-unjailed"
    run = run_python(f"open({str(marker)!r}, 'w')")
    assert not run.jailed and "no sandbox here" in run.stderr and not marker.exists()


@pytest.fixture
def public_dir() -> Iterator[Path]:
    """A folder uid nobody may enter (the jail is started as nobody when the tests run as root)."""
    base = Path("/var/tmp") if Path("/var/tmp").is_dir() else None
    folder = Path(tempfile.mkdtemp(dir=base, prefix="specexp-fake-bwrap-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder)


def test_a_jail_bwrap_cannot_build_is_not_run(public_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # fake: a bwrap that fails as it does where user namespaces are off (cannot be made for real here)
    fake = public_dir / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{public_dir}:/usr/bin:/bin")
    run = run_python("print('hi')")
    assert not run.jailed and run.stderr == "no sandbox here: bwrap: No permissions to create new namespace"
