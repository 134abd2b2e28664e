"""Interrupt a real sweep, resume it, then read it back: compare, plots, and the MLflow UI
in a real browser (the README's commands as written)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.leftovers import (
    marker_override,
    new_marker,
    openmp_registrations,
    processes_with,
    stale_openmp,
    temp_leftovers,
)
from tests.helpers import REPO, ctrl_c_works, require_vllm, run_cli

pytestmark = pytest.mark.e2e
SCREENSHOTS = REPO / "test-output"


def _digest(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def _wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.5)


def test_interrupted_sweep_resumes_reusing_what_finished_and_reads_back(workdir: Path) -> None:
    require_vllm()
    marker, shm_before = new_marker(), openmp_registrations()
    tmp = workdir / "tmp"
    tmp.mkdir()
    env = {**os.environ, "SPECEXP_WORKDIR": str(workdir), "TMPDIR": str(tmp)}
    overrides = [
        "spec=ngram",
        "spec.depth=3,5",
        "bench=smoke",
        "bench.trials=2",
        "suite=none",
        "tracking.experiment=resume",
        marker_override(marker),
    ]
    first = subprocess.Popen(
        [sys.executable, "-m", "specexp", "sweep", *overrides, "--name", "res"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=ctrl_c_works,
    )
    sweep_dir = workdir / "results" / "res"
    try:

        def second_variant_measuring() -> bool:
            logs = list(sweep_dir.glob("01-*/server.log"))
            return bool(logs) and "Application startup complete" in logs[0].read_text()

        _wait_for(second_variant_measuring, 900, "the second variant's server")
        first.send_signal(signal.SIGINT)
        _, err = first.communicate(timeout=120)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == 130, err
    assert processes_with(marker) == []
    done_before = {p.name: _digest(p) for p in sweep_dir.glob("00-*")}
    (base_name,) = done_before
    assert json.loads((sweep_dir / base_name / "result.json").read_text())["status"] == "ok"
    parent = json.loads((sweep_dir / "sweep.json").read_text())["tracking"]["parent_run_id"]

    # a plan that differs is refused in one line naming the difference
    other = run_cli(["sweep", *overrides[:1], "spec.depth=3,4", *overrides[2:], "--resume"], workdir)
    assert other.returncode == 2 and len(other.stderr.strip().splitlines()) == 1
    assert "variants differ (not in this plan: ngram-k5=" in other.stderr

    again = run_cli(["sweep", *overrides, "--resume"], workdir, timeout=900, env={"TMPDIR": str(tmp)})
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert re.search(r"reused baseline: measured in an earlier attempt of res", again.stdout)
    sweep = json.loads((sweep_dir / "sweep.json").read_text())
    labels = [v["label"] for v in sweep["variants"]]
    assert labels == ["baseline", "ngram-k3", "ngram-k5"] and all(
        v["status"] == "ok" for v in sweep["variants"]
    )
    assert sweep["reused"] == [sweep["variants"][0]["variant_hash"]]
    assert {p.name: _digest(p) for p in sweep_dir.glob("00-*")} == done_before  # byte-identical
    assert sweep["tracking"]["parent_run_id"] == parent

    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{workdir / 'mlflow.db'}")
    exp = client.get_experiment_by_name("resume")
    assert exp is not None
    runs = client.search_runs([exp.experiment_id])  # deleted runs are not listed
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent]
    assert sorted(r.data.tags["specexp.label"] for r in children) == labels
    assert {r.info.status for r in children} == {"FINISHED"}
    assert [r.info.run_id for r in runs if r.data.tags.get("specexp.kind") == "sweep"] == [parent]
    assert processes_with(marker) == [] and stale_openmp(shm_before) == []
    assert temp_leftovers(tmp) == []

    # read back: the table (terminal, Markdown, CSV) and the plots
    table = run_cli(["compare"], workdir)
    assert table.returncode == 0, table.stderr
    for label in labels:
        assert label in table.stdout
    md = run_cli(["compare", "res", "--md"], workdir)
    assert md.stdout.count("| single |") == len(labels) and "ngram-k5" in md.stdout  # a row per variant
    csv_out = run_cli(["compare", "--csv"], workdir).stdout.splitlines()
    assert csv_out[0].startswith("case,variant,sweep,metric,median") and len(csv_out) == 1 + 3 * 3
    for plot in ("throughput.png", "acceptance.png", "fairness.png"):
        assert (sweep_dir / "plots" / plot).read_bytes()[:4] == b"\x89PNG"
    _ui_shows_the_sweep(workdir, sweep, labels)


def _chromium(url: str, out: Path, screenshot: Path) -> str:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        if os.environ.get("CI"):
            pytest.fail("CI: chromium missing; scripts/bootstrap.sh setup installs it")
        pytest.skip("chromium not installed (scripts/bootstrap.sh setup)")
    flags = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={out / 'profile'}",
        "--virtual-time-budget=20000",
        "--window-size=1600,1200",
    ]
    subprocess.run([browser, *flags, f"--screenshot={screenshot}", url], capture_output=True, timeout=180)
    dom = subprocess.run([browser, *flags, "--dump-dom", url], capture_output=True, text=True, timeout=180)
    shutil.rmtree(out / "profile", ignore_errors=True)
    return dom.stdout


def _ui_shows_the_sweep(workdir: Path, sweep: dict[str, Any], labels: list[str]) -> None:
    """``python -m specexp ui`` as the README writes it: the compare page of the latest sweep
    shows the variants, the param that differs, a metric; the parent run shows the plots."""
    SCREENSHOTS.mkdir(exist_ok=True)
    ui = subprocess.Popen(
        [sys.executable, "-m", "specexp", "ui"],
        cwd=REPO,
        env={**os.environ, "SPECEXP_WORKDIR": str(workdir)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=ctrl_c_works,
    )
    try:
        assert ui.stdout is not None
        url = None
        deadline = time.monotonic() + 180
        while url is None and time.monotonic() < deadline:
            line = ui.stdout.readline()
            if not line:
                break
            if line.startswith("latest sweep, compared: "):
                url = line.split(": ", 1)[1].strip()
        assert url is not None and url.startswith("http://127.0.0.1:5000/#/compare-runs?runs=")
        dom = _chromium(url, workdir, SCREENSHOTS / "mlflow-compare.png")
        for label in labels:
            assert label in dom
        assert "spec.num_speculative_tokens" in dom
        assert "single.decode_tok_s" in dom
        exp, parent = sweep["tracking"]["experiment_id"], sweep["tracking"]["parent_run_id"]
        page = f"http://127.0.0.1:5000/#/experiments/{exp}/runs/{parent}/artifacts"
        artifacts = _chromium(page, workdir, SCREENSHOTS / "mlflow-parent-artifacts.png")
        assert "plots" in artifacts and "sweep.json" in artifacts
    finally:
        ui.send_signal(signal.SIGINT)
        ui.wait(timeout=60)
    assert ui.returncode == 0
