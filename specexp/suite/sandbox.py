"""Execute model-written code in the jail of ``sandbox_exec.py`` and report what happened."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

LAUNCHER = Path(__file__).with_name("sandbox_exec.py")
NO_JAIL = 97


@dataclass(frozen=True)
class CodeRun:
    returncode: int
    stdout: str
    stderr: str

    @property
    def timed_out(self) -> bool:
        return self.returncode == 124

    @property
    def jailed(self) -> bool:
        return self.returncode != NO_JAIL


def run_python(code: str, timeout_s: float = 10.0) -> CodeRun:
    """Run ``code`` with ``python -I`` in a jail: no network, read-only filesystem but a
    private /tmp, its own PID namespace, limits, and ``timeout_s`` of wall time."""
    proc = subprocess.Popen(
        [sys.executable, "-I", str(LAUNCHER), str(timeout_s)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(code.encode(), timeout=timeout_s + 10)
    except subprocess.TimeoutExpired:  # the launcher enforces the limit; this is the backstop
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        return CodeRun(124, out.decode(errors="replace"), err.decode(errors="replace"))
    return CodeRun(
        proc.returncode, out.decode(errors="replace")[-20000:], err.decode(errors="replace")[-20000:]
    )
