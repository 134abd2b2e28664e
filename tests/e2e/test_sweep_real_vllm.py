"""End to end on the real CPU build of vLLM with the embedded SmolLM2: a keyed, interleaved
depth sweep with its suite and MLflow runs, and Ctrl-C in the middle of a start."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.helpers import REPO, ctrl_c_works, processes_matching, require_vllm, run_cli

pytestmark = pytest.mark.e2e


def test_ctrl_c_stops_the_server_and_marks_runs_killed(workdir: Path) -> None:
    require_vllm()
    env = {**os.environ, "SPECEXP_WORKDIR": str(workdir)}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "specexp",
            "sweep",
            "spec=none",
            "--no-baseline",
            "bench=smoke",
            "tracking.experiment=ctrlc",
            "--name",
            "ctrlc",
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=ctrl_c_works,
    )
    try:
        launch = None
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and launch is None:
            found = list((workdir / "results" / "ctrlc").glob("*/server.log"))
            if found and found[0].stat().st_size > 0:
                launch = json.loads((found[0].parent / "launch.json").read_text())
            time.sleep(0.5)
        assert launch is not None, "the server never started"
        port_flag = next(a for a in launch["nodes"][0]["argv"] if a.startswith("--port="))
        assert processes_matching(port_flag), "server process not found while running"
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.terminate()  # SIGTERM unwinds like Ctrl-C: the sweep stops its server
            proc.wait(timeout=60)
    assert proc.returncode == 130, err
    time.sleep(0.5)
    assert processes_matching(port_flag) == []
    result = json.loads(next((workdir / "results" / "ctrlc").glob("*/result.json")).read_text())
    assert result["status"] == "interrupted"

    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{workdir / 'mlflow.db'}")
    exp = client.get_experiment_by_name("ctrlc")
    assert exp is not None
    statuses = sorted(r.info.status for r in client.search_runs([exp.experiment_id]))
    assert statuses == ["KILLED", "KILLED"]


def _server_states(stop: threading.Event, seen: list[tuple[float, float, str, str]]) -> None:
    """Sample every vLLM API server's state (ps STAT: T = stopped) with its --port, 20 times a
    second. Each sample carries the times before and after ``ps`` ran: on a loaded machine ps
    takes long enough that one stamp cannot say when the state was read."""
    while not stop.is_set():
        before = time.time()
        lines = processes_matching("vllm_entry.py serve")
        after = time.time()
        for line in lines:
            _pid, stat, *args = line.split()
            port = next((a for a in args if a.startswith("--port=")), None)
            if port:
                seen.append((before, after, port.removeprefix("--port="), stat))
        time.sleep(0.05)


def test_a_keyed_interleaved_depth_sweep_runs_real_vllm_and_logs_to_mlflow(workdir: Path) -> None:
    """The README's keyed sweep on real vLLM, interleaved, suite and MLflow on: one sweep for
    what each of them must show, since every server start costs a minute here.

    - the sweep: every prompt of the smoke workload answered (12 in the concurrent case),
      exact-length prompts, acceptance, vllm-bench records, the suite judged against the
      baseline, the server logs, the MLflow runs and artifacts;
    - interleaved: each server runs only during its own trials and is frozen (ps STAT T)
      during the other's;
    - ``launcher.api_key_env``: vLLM gets the key as VLLM_API_KEY (its own variable for
      ``--api-key``) and refuses /v1 requests without it; the warm-up, the suite and every
      measured stream send it. The key is in no file the sweep wrote (results, logs, the
      MLflow store and its artifacts), not in its output, and not on a command line."""
    from mlflow.tracking import MlflowClient

    from tests.e2e.leftovers import marker_override, new_marker, processes_with

    require_vllm()
    key, marker = f"sk-e2e-{new_marker()}", new_marker()
    seen: list[tuple[float, float, str, str]] = []
    stop = threading.Event()
    sampler = threading.Thread(target=_server_states, args=(stop, seen), daemon=True)
    sampler.start()
    try:
        out = run_cli(
            [
                # the README's command as written, then this test's budget, order and marker
                *["sweep", "spec.depth=3", "bench=smoke", "launcher.api_key_env=SPECEXP_KEY"],
                "bench.cases.concurrent4.num_prompts=12",
                "bench.order=interleaved",
                "tracking.experiment=e2e",
                marker_override(marker),
                "--name",
                "e2e",
            ],
            workdir,
            timeout=1200,
            env={"SPECEXP_KEY": key},
        )
    finally:
        stop.set()
        sampler.join()
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "no MTP layers" in out.stdout and "specexp sweep" in out.stdout
    sweep = json.loads((workdir / "results" / "e2e" / "sweep.json").read_text())
    base, k3 = sweep["variants"]
    assert [base["label"], k3["label"]] == ["baseline", "ngram-k3"]
    for v in (base, k3):
        assert v["status"] == "ok", v.get("error")
        assert 5 < v["ready_s"] < 600 and v["startup_phases"]["weight_load_s"] > 0
        for case in v["cases"].values():
            assert case["failed_requests"] == 0  # thawed and keyed servers answer
            assert case["looping_outputs"] == 0, "the default workload must not make the model loop"
            assert len(case["trials"]) == 2
            assert case["summary"]["output_tok_s"]["median"] > 0
    assert "acceptance_rate" not in base["cases"]["single"]["summary"]
    # the exact-length prompt is exactly that long as the server counts it
    for v in (base, k3):
        long_input = v["cases"]["long_input"]
        assert {q["prompt_tokens"] for t in long_input["trials"] for q in t["requests"]} == {256}
        assert long_input["summary"]["prompt_tokens_mismatch"]["max"] == 0
    acc = k3["cases"]["concurrent4"]["summary"]
    assert 0 < acc["acceptance_rate"]["median"] <= 1 and acc["acceptance_length"]["median"] > 1
    assert '"method":"ngram"' in " ".join(k3["launch"]["nodes"][0]["argv"])
    # vllm-bench-compatible records, one folder per serve x bench combination
    bench = json.loads(
        (
            workdir / "results" / "e2e" / "vllm-bench" / "SERVE-ngram-k3-BENCH-concurrent4" / "summary.json"
        ).read_text()
    )
    assert len(bench) == 2 and bench[0]["completed"] == 12 and bench[0]["max_concurrency"] == 4
    assert 0 < bench[0]["spec_decode_acceptance_rate"] <= 100 and bench[0]["output_throughput"] > 0
    # the functional suite ran on both, before the benchmarks; the variant is judged against the baseline
    for v in (base, k3):
        cases = {c["name"]: c for c in v["suite"]["cases"]}
        assert len(cases) == 17
        assert cases["tool_call_weather"]["passed"] is None  # the server has no tool parser: not run
        assert cases["code_add_function"]["passed"] is not None  # the sandbox exists here
        assert all(c["output"] or c["passed"] is None for c in cases.values())
        assert not [c["name"] for c in cases.values() if "401" in (c.get("reason") or "")]
    k3_cases = k3["suite"]["cases"]
    judged = [c for c in k3_cases if c["equivalent"] is not None]
    assert len(judged) == 16 and all(c["divergence_unit"] == "token" for c in judged)
    for c in k3_cases:
        assert c["regression"] == (c["baseline_passed"] is True and c["passed"] is False)
    assert "functional suite regression17" in out.stdout
    # the server log of each variant is kept
    logs = sorted((workdir / "results" / "e2e").glob("*/server.log"))
    assert len(logs) == 2 and "Application startup complete" in logs[0].read_text()
    assert processes_matching("vllm_entry.py") == [] and processes_with(marker) == []

    # interleaved: a server measures only in its own trials and is frozen in the other's
    windows: dict[str, list[tuple[float, float]]] = {}
    for v in (base, k3):
        port = v["launch"]["base_url"].rsplit(":", 1)[1]
        trials = [t for c in v["cases"].values() for t in c["trials"]]
        windows[port] = [(t["started_at"], t["started_at"] + t["duration_s"]) for t in trials]
    assert len(windows) == 2 and all(len(w) == 6 for w in windows.values())
    for port, mine in windows.items():
        other = next(p for p in windows if p != port)
        states = [(t0, t1, stat) for t0, t1, p, stat in seen if p == port]
        # a sample counts for a trial only if its whole ps call lay inside the trial
        during_mine = [stat for t0, t1, stat in states if any(b + 0.1 < t0 and t1 < e - 0.1 for b, e in mine)]
        during_other = [
            stat for t0, t1, stat in states if any(b + 0.1 < t0 and t1 < e - 0.1 for b, e in windows[other])
        ]
        assert during_mine and not [s for s in during_mine if s.startswith("T")], (port, during_mine)
        assert during_other and all(s.startswith("T") for s in during_other), (port, during_other)

    # the key: guarded server, never written or printed
    assert key not in out.stdout + out.stderr
    for v in (base, k3):
        assert v["effective"]["process.env.VLLM_API_KEY"] == "***"  # the server was guarded
        assert not any("--api-key" in a for a in v["launch"]["nodes"][0]["argv"])
    searched = [p for p in workdir.rglob("*") if p.is_file()]
    assert {"mlflow.db", "server.log"} <= {p.name for p in searched}
    assert any("mlruns" in p.parts for p in searched)  # the MLflow artifacts
    for path in searched:
        assert key.encode() not in path.read_bytes(), path

    client = MlflowClient(f"sqlite:///{workdir / 'mlflow.db'}")
    exp = client.get_experiment_by_name("e2e")
    assert exp is not None
    runs = client.search_runs([exp.experiment_id])
    parents = [r for r in runs if r.data.tags.get("specexp.kind") == "sweep"]
    children = [r for r in runs if r.data.tags.get("specexp.kind") == "variant"]
    assert len(parents) == 1 and len(children) == 2
    assert all(r.info.status == "FINISHED" for r in runs)
    k3_run = next(r for r in children if r.data.tags["specexp.label"] == "ngram-k3")
    assert k3_run.data.metrics["concurrent4.acceptance_rate"] > 0
    assert "single.decode_tok_s.vs_baseline" in k3_run.data.metrics
    assert k3_run.data.metrics["regression.passed"] == sum(1 for c in k3_cases if c["passed"])
    assert k3_run.data.metrics["regression.regressions"] == sum(1 for c in k3_cases if c["regression"])
    assert 0 <= k3_run.data.metrics["equivalence.rate"] <= 1
    names = {a.path for a in client.list_artifacts(k3_run.info.run_id)}
    expected = {"config.yaml", "launch.json", "result.json", "suite.json", "requests.jsonl", "logs"}
    assert expected <= names
    assert [a.path for a in client.list_artifacts(k3_run.info.run_id, "logs")] == ["logs/server.log"]
