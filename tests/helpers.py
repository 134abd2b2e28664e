"""Shared helpers: run the CLI as a user would, find stray server processes, start the
scripted SSE server."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from specexp.launch.plan import free_port, vllm_python

REPO = Path(__file__).resolve().parent.parent


def run_cli(
    args: list[str], workdir: Path, timeout: float = 600, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SPECEXP_WORKDIR": str(workdir), **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "specexp", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def require_vllm() -> None:
    """Skip where vLLM's CPU venv was never set up; in CI its absence is a failure."""
    if vllm_python() is None:
        if os.environ.get("CI"):
            pytest.fail("CI: no vLLM venv; scripts/bootstrap.sh setup should have built it")
        pytest.skip("vLLM CPU venv not set up (scripts/bootstrap.sh setup)")


def processes_matching(text: str) -> list[str]:
    out = subprocess.run(["ps", "-ww", "-eo", "pid,stat,args"], capture_output=True, text=True).stdout
    return [ln for ln in out.splitlines()[1:] if text in ln and " Z" not in ln and "ps -eo" not in ln]


def ctrl_c_works() -> None:
    """``preexec_fn`` for a child that a test stops with SIGINT: a shell that starts jobs in
    the background (a CI runner may) hands them SIGINT ignored, and Python keeps it so."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@contextlib.contextmanager
def scripted_sse(*args: str) -> Iterator[str]:
    """``tests.fakes.scripted_sse`` on a free port (``args`` after the port: TTFT, gaps,
    flags), ready when it says so; yields its base URL and stops it."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.fakes.scripted_sse", str(port), *args],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().startswith("READY")
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)
