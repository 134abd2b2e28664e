"""Shared helpers: run the CLI as a user would, and find stray server processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from specexp.launch.plan import vllm_python

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
