"""``python -m specexp ui``: the MLflow UI on specexp's store, opened on the latest sweep.

It starts ``mlflow server`` itself (like ``mlflow ui``) with the settings that work on a
small machine (one worker, background jobs off: 2 processes and ~0.5 GB instead of 10
and ~1.9 GB), waits until it answers, and prints the URL of the latest sweep's compare
page, so the first thing a person sees is the comparison, not MLflow's landing page.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.parse
from pathlib import Path

import httpx
from rich.console import Console

from specexp.config.schema import TrackingConfig
from specexp.errors import LaunchError
from specexp.record.mlflow_sink import artifact_root, tracking_uri
from specexp.record.store import list_sweeps, load_sweep

UI_ENV = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}


def ui_command(tracking: TrackingConfig, host: str, port: int) -> list[str]:
    return [
        *(f"{k}={v}" for k, v in UI_ENV.items()),
        "mlflow",
        "server",
        "--backend-store-uri",
        tracking_uri(tracking),
        "--artifacts-destination",
        str(artifact_root(tracking)),
        "--host",
        host,
        "--port",
        str(port),
        "--workers",
        "1",
    ]


def compare_url(base: str, experiment_id: str, run_ids: list[str]) -> str:
    """MLflow's compare page for ``run_ids`` (its hash-router takes JSON lists)."""
    runs = urllib.parse.quote(json.dumps(run_ids, separators=(",", ":")))
    exps = urllib.parse.quote(json.dumps([experiment_id], separators=(",", ":")))
    return f"{base}/#/compare-runs?runs={runs}&experiments={exps}"


def latest_compare_url(results_root: Path, base: str, uri: str) -> str | None:
    """The compare page of the newest sweep logged to this store, if any."""
    for folder in reversed(list_sweeps(results_root)):
        try:
            sweep = load_sweep(folder)
        except Exception:  # a folder that cannot be read is skipped, not fatal
            continue
        state = sweep.tracking
        if state.uri == uri and state.experiment_id and state.runs:
            return compare_url(base, state.experiment_id, list(state.runs.values()))
    return None


def serve_ui(tracking: TrackingConfig, results_root: Path, host: str, port: int, console: Console) -> int:
    argv = [sys.executable, "-m", *ui_command(tracking, host, port)[len(UI_ENV) :]]
    base = f"http://{host}:{port}"
    # the server's own chatter (access lines, warnings) goes to a file shown only on failure
    log = Path(tempfile.mkstemp(prefix="specexp-mlflow-ui-", suffix=".log")[1])
    with log.open("w") as out:
        proc = subprocess.Popen(
            argv, env={**os.environ, **UI_ENV}, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                last = (log.read_text(errors="replace").strip().splitlines() or ["no output"])[-1]
                raise LaunchError(f"mlflow server exited with code {proc.returncode}: {last[-200:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise LaunchError(f"mlflow server did not answer on {base} within 120 s")
            time.sleep(0.5)
        url = latest_compare_url(results_root, base, tracking_uri(tracking))
        console.print(f"MLflow UI: {base}/#/experiments", highlight=False)
        if url:
            console.print(f"latest sweep, compared: {url}", highlight=False, soft_wrap=True)
        console.print("Ctrl-C stops it.", highlight=False)
        proc.wait()
        return 0
    except KeyboardInterrupt:
        return 0
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.unlink(missing_ok=True)
