"""Faults on real vLLM: what the user sees, the MLflow status, that the sweep goes on, that
nothing measured is lost, and that nothing is left behind."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.e2e.leftovers import (
    marker_override,
    new_marker,
    openmp_registrations,
    processes_with,
    stale_openmp,
    temp_leftovers,
)
from tests.helpers import REPO, require_vllm, run_cli

pytestmark = pytest.mark.e2e


def _server_pids(marker: str, base_url: str) -> list[psutil.Process]:
    port = f"--port={base_url.rsplit(':', 1)[1]}"
    out = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if proc.environ().get("SPECEXP_TEST_MARKER") == marker and port in proc.cmdline():
                out.append(proc)
        except psutil.Error:
            continue
    return out


def _watch(sweep_dir: Path, label_part: str, timeout: float) -> dict[str, Any]:
    """The launch.json of a variant once its server answers and a trial has been measured."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for folder in sweep_dir.glob(f"*{label_part}*"):
            log, req = folder / "server.log", folder / "launch.json"
            started = log.exists() and "Application startup complete" in log.read_text()
            if started and req.exists():
                launch = json.loads(req.read_text())
                if not launch["base_url"].endswith(":0"):
                    return launch
        time.sleep(0.2)
    raise AssertionError(f"{label_part} never came up")


def test_a_killed_server_fails_only_its_variant_and_a_dead_store_is_synced_later(workdir: Path) -> None:
    """Interleaved sweep, the store unreachable: k5's server is SIGKILLed after it started
    measuring. k5 fails with the server's own reason and keeps its finished trials; the
    baseline beside it measures everything; one warning about the store; ``sync`` logs it
    all once."""
    require_vllm()
    marker, shm_before = new_marker(), openmp_registrations()
    tmp = workdir / "tmp"
    tmp.mkdir()
    with socket.socket() as s:  # a port nothing listens on: the tracking server is down
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    args = [
        "sweep",
        "spec=ngram",
        "spec.depth=5",
        "bench=smoke",
        "bench.trials=3",
        "bench.order=interleaved",
        "suite=none",
        f"tracking.uri=http://127.0.0.1:{dead}",
        marker_override(marker),
        "--name",
        "faults",
    ]
    env = {**os.environ, "SPECEXP_WORKDIR": str(workdir), "TMPDIR": str(tmp)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "specexp", *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        sweep_dir = workdir / "results" / "faults"
        launch = _watch(sweep_dir, "ngram-k5", 900)
        log = next(sweep_dir.glob("*ngram-k5*/server.log"))
        # warm-up plus one whole trial (6 requests) answered: k5 has measured data to keep
        deadline = time.monotonic() + 300
        while log.read_text().count('"POST /v1/chat/completions HTTP/1.1" 200') < 8:
            assert time.monotonic() < deadline, "k5 never measured a trial"
            time.sleep(0.2)
        victims = _server_pids(marker, launch["base_url"])
        assert victims
        for v in victims:
            v.kill()
        out, err = proc.communicate(timeout=900)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, out[-2000:] + err[-2000:]  # one variant failed
    sweep = json.loads((sweep_dir / "sweep.json").read_text())
    by_label = {v["label"]: v for v in sweep["variants"]}
    k5 = by_label["ngram-k5"]
    assert k5["status"] == "failed" and "vllm serve killed by SIGKILL" in k5["error"], k5["error"]
    assert sorted(by_label) == ["baseline", "ngram-k5"]
    assert by_label["baseline"]["status"] == "ok"
    assert all(len(c["trials"]) == 3 for c in by_label["baseline"]["cases"].values())
    kept = sum(1 for c in k5["cases"].values() for t in c["trials"] if not t.get("error"))
    assert kept >= 1  # what k5 measured before it died is data, not lost
    assert out.count("tracking store unavailable") == 1
    assert sweep["tracking"]["error"] and sweep["tracking"]["synced"] == []
    assert processes_with(marker) == [] and stale_openmp(shm_before) == [] and temp_leftovers(tmp) == []

    synced = run_cli(["sync", "faults"], workdir)
    assert synced.returncode == 0, synced.stderr
    assert "logged 2 variant(s)" in synced.stdout
    assert "nothing was missing" in run_cli(["sync", "faults"], workdir).stdout
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{workdir / 'mlflow.db'}")
    exp = client.get_experiment_by_name("specexp")
    assert exp is not None
    runs = client.search_runs([exp.experiment_id])
    statuses = sorted((r.data.tags.get("specexp.label", "sweep"), r.info.status) for r in runs)
    assert statuses == [
        ("baseline", "FINISHED"),
        ("ngram-k5", "FAILED"),
        ("sweep", "FINISHED"),
    ]


def test_a_frozen_server_times_out_fails_its_variant_and_is_stopped(workdir: Path) -> None:
    require_vllm()
    marker = new_marker()
    args = [
        "sweep",
        "spec=none",
        "--no-baseline",
        "bench=smoke",
        "bench.trials=2",
        "bench.request_timeout_s=8",
        "suite=none",
        "tracking.experiment=frozen",
        marker_override(marker),
        "--name",
        "frozen",
    ]
    env = {**os.environ, "SPECEXP_WORKDIR": str(workdir)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "specexp", *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        launch = _watch(workdir / "results" / "frozen", "baseline", 900)
        log = next((workdir / "results" / "frozen").glob("*/server.log"))
        deadline = time.monotonic() + 300
        # the warm-up answered and a measured stream started: freeze it mid-stream
        while log.read_text().count('"POST /v1/chat/completions HTTP/1.1" 200') < 2:
            assert time.monotonic() < deadline, "no measured request started"
            time.sleep(0.05)
        victims = _server_pids(marker, launch["base_url"])
        for v in victims:
            v.send_signal(signal.SIGSTOP)  # mid-stream: the requests in flight get no more data
        out, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, out[-2000:] + err[-2000:]
    (result_file,) = (workdir / "results" / "frozen").glob("*/result.json")
    result = json.loads(result_file.read_text())
    assert result["status"] == "failed"
    assert result["error"].startswith("the server stopped answering")
    assert "8 s (bench.request_timeout_s)" in result["error"]
    assert processes_with(marker) == []  # a frozen server is stopped too

    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{workdir / 'mlflow.db'}")
    exp = client.get_experiment_by_name("frozen")
    assert exp is not None
    variant = [
        r for r in client.search_runs([exp.experiment_id]) if r.data.tags.get("specexp.kind") == "variant"
    ]
    assert [r.info.status for r in variant] == ["FAILED"]


def test_a_taken_port_and_an_unusable_results_folder_are_one_line_before_anything_starts(
    workdir: Path,
) -> None:
    require_vllm()
    marker = new_marker()
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        out = run_cli(
            [
                "sweep",
                "spec=none",
                "--no-baseline",
                "bench=smoke",
                "suite=none",
                f"server.port={port}",
                "tracking=none",
                marker_override(marker),
                "--name",
                "port",
            ],
            workdir,
        )
    assert out.returncode == 1
    result = json.loads(next((workdir / "results" / "port").glob("*/result.json")).read_text())
    assert result["status"] == "failed" and result["error"].startswith(
        f"port {port} on 127.0.0.1 is taken by "
    )
    assert processes_with(marker) == []

    blocked = workdir / "blocked"
    blocked.write_text("a file where the results folder should be\n")
    bad = run_cli(["sweep", "spec=none", "--no-baseline", f"sweep.results_dir={blocked}/results"], workdir)
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines() == [
        f"specexp: error: results folder {blocked}/results: cannot write in {blocked} (Not a directory)"
    ]
    assert not (workdir / "mlflow.db").exists()
