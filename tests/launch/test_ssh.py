"""The node command line, run by a local ``sh`` as the node's login shell would run it
(no SSH needed to see what the command does with its stdin and its environment)."""

from __future__ import annotations

import subprocess
import sys
import uuid

import psutil

from specexp.launch.ssh import PGID_PREFIX, server_command

CHILD = (
    "import os, sys; k = os.environ.get('VLLM_API_KEY'); "
    "print('KEY', len(k or ''), k == sys.argv[1][::-1], flush=True); sys.stdin.read()"
)


def test_a_secret_reaches_the_server_through_stdin_and_no_command_line_holds_it() -> None:
    key = f"sk-{uuid.uuid4().hex}"
    argv = (sys.executable, "-c", CHILD, key[::-1])  # the child checks the key it got, reversed
    command = server_command(argv, {"PLAIN": "1"}, 2.0, ("VLLM_API_KEY",))
    assert key not in command
    proc = subprocess.Popen(["sh", "-c", command], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None
    try:
        proc.stdin.write(key.encode() + b"\n")
        proc.stdin.flush()
        assert proc.stdout.readline().decode().startswith(PGID_PREFIX)
        assert proc.stdout.readline().decode().split() == ["KEY", str(len(key)), "True"]
        server = psutil.Process(proc.pid)  # the shell exec'd into the server
        seen = [server, *server.children(recursive=True)]  # and the watchdog with its cat
        assert len(seen) >= 3
        for p in seen:
            assert key not in " ".join(p.cmdline()), p
    finally:
        proc.stdin.close()  # the channel closes: the watchdog ends the group
        proc.wait(timeout=30)
