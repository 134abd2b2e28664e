"""``tune`` and ``verify`` on the real CPU build of vLLM with the embedded SmolLM2.

A small study (no speculation and ngram depth 2-4, one stream and four) is interrupted
while a trial measures, then resumed: the finished trial is not run again, the
interrupted one is, and the depth model settles the rest (measured, or never started).
``verify`` runs against a real server started at depth 3. The ngram
replay is checked against vLLM's own proposal function.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import optuna
import psutil
import pytest
from optuna.trial import TrialState

from specexp.config.compose import plan_sweep
from specexp.launch.local import LocalLauncher
from specexp.launch.plan import build_plan, free_port, vllm_python
from specexp.paths import conf_dir
from specexp.tune import greedy
from specexp.tune.replay import NgramIndex, replay
from tests.helpers import REPO, ctrl_c_works, processes_matching, require_vllm, run_cli

pytestmark = pytest.mark.e2e

SMALL = [
    "suite=none",
    "bench=tune_cost",
    "bench.trials=2",
    "bench.cases.c1.num_prompts=2",
    "bench.cases.c1.max_tokens=64",
    "bench.cases.c4.max_tokens=64",
    "tracking.experiment=e2e-tune",
]


def ours(marker: str) -> list[int]:
    """Live processes started with our marker in their environment (servers and workers)."""
    found = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if proc.environ().get("E2E_MARKER") == marker and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc.pid)
        except psutil.Error:
            continue
    return found


def attr(t: optuna.trial.FrozenTrial, key: str) -> object:
    return t.user_attrs.get("specexp." + key)


def test_tune_interrupted_mid_trial_resumes_and_never_reruns_a_finished_trial(workdir: Path) -> None:
    require_vllm()
    marker = uuid.uuid4().hex
    conf = workdir / "conf"
    shutil.copytree(conf_dir(), conf)
    args = [
        sys.executable,
        "-m",
        "specexp",
        "tune",
        "spec=none,ngram",
        "spec.depth=range(2,5)",
        *SMALL,
        f"+server.env.E2E_MARKER={marker}",
        "--study",
        "e2e",
        "--n-trials",
        "4",
        "--write-experiment",
        "e2e_best",
    ]
    env = {**os.environ, "SPECEXP_WORKDIR": str(workdir), "SPECEXP_CONF": str(conf)}
    storage = f"sqlite:///{workdir / 'optuna.db'}"
    proc = subprocess.Popen(
        args,
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=ctrl_c_works,
    )
    try:
        # wait until the second trial's server is up and measuring, then Ctrl-C
        deadline = time.monotonic() + 900
        target: Path | None = None
        while time.monotonic() < deadline and target is None and proc.poll() is None:
            logs = sorted((workdir / "results").glob("e2e-*/01-*/server.log"))
            if logs and "Application startup complete" in logs[0].read_text(errors="replace"):
                target = logs[0]
            time.sleep(0.5)
        assert target is not None, proc.communicate(timeout=60)[0][-3000:]
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, out[-3000:]
    assert ours(marker) == [], "a server outlived the interrupt"
    study = optuna.load_study(study_name="e2e", storage=storage)
    first = {t.number: t for t in study.trials}
    assert first[0].state == TrialState.COMPLETE and attr(first[0], "label") == "baseline"
    assert first[1].state == TrialState.FAIL and attr(first[1], "interrupted") is True
    baseline_result = Path(str(attr(first[0], "folder")), "result.json").read_bytes()

    again = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=1800)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "queued again" in again.stdout
    assert ours(marker) == [] and processes_matching("vllm_entry.py") == []
    study = optuna.load_study(study_name="e2e", storage=storage)
    trials = study.trials
    done = [t for t in trials if t.state == TrialState.COMPLETE]
    # no variant measured twice; the finished trial was not run again (its files untouched)
    assert len({attr(t, "hash") for t in done}) == len(done) >= 2
    assert Path(str(attr(first[0], "folder")), "result.json").read_bytes() == baseline_result
    retried = [t for t in trials if t.system_attrs.get("failed_trial") == 1]
    assert len(retried) == 1 and retried[0].state == TrialState.COMPLETE
    assert attr(retried[0], "hash") == attr(first[1], "hash")
    started = [attr(t, "hash") for t in trials if attr(t, "started")]
    assert len(started) == len(done) + 1  # every measured variant once, plus the interrupted start

    # the depth model: greedy ids from the baseline, the deepest depth to calibrate; every
    # other candidate measured (its prediction beside the measurement) or never started
    # because its prediction was not better by the margin
    folder0 = Path(str(attr(first[0], "folder")))
    outputs = greedy.load(folder0)
    assert outputs is not None and set(outputs) == {"c1", "c4"}
    assert attr(first[1], "label") == "ngram-k4"  # calibration: the deepest depth
    predicted = [t for t in done if attr(t, "predicted")]
    assert all(attr(t, "prediction_error") for t in predicted)
    report = sorted((workdir / "results").glob("e2e-*/tune.md"))[-1].read_text()
    never = (
        report.split("## never started", 1)[1].split("\n## ", 1)[0] if "## never started" in report else ""
    )
    ruled_out = {
        row.split("|")[1].strip(): row.split("|")[2].strip() for row in never.splitlines()[3:] if row
    }
    measured = {str(attr(t, "label")) for t in done}
    assert measured | set(ruled_out) == {"baseline", "ngram-k2", "ngram-k3", "ngram-k4"}
    assert not measured & set(ruled_out) and all(ruled_out.values())  # each with its prediction
    for t in done:
        if attr(t, "label") == "baseline":
            continue
        depth = int(str(attr(t, "label")).rsplit("k", 1)[1])
        result = json.loads(Path(str(attr(t, "folder")), "result.json").read_text())
        for case, outs in outputs.items():
            measured_len = result["cases"][case]["summary"]["acceptance_length"]["median"]
            replayed = replay(outs, depth, 2, 4).mean_length
            # the spec server's own greedy output can differ from the baseline's by rounding
            assert replayed == pytest.approx(measured_len, rel=0.1), (case, depth)

    # MLflow: one parent run for the study, a child run per measured trial, tagged
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{workdir / 'mlflow.db'}")
    exp = client.get_experiment_by_name("e2e-tune")
    assert exp is not None
    runs = client.search_runs([exp.experiment_id])
    parents = [r for r in runs if r.data.tags.get("specexp.kind") == "study"]
    assert len(parents) == 1
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parents[0].info.run_id]
    finished = {int(r.data.tags["specexp.trial"]) for r in children if r.info.status == "FINISHED"}
    assert {t.number for t in done} <= finished
    killed = [r for r in children if r.data.tags["specexp.trial"] == "1"]
    assert killed and killed[0].info.status == "KILLED"
    if predicted:
        assert any("predicted.c1.decode_tok_s" in r.data.metrics for r in children)
    assert any(a.path.startswith("plots") for a in client.list_artifacts(parents[0].info.run_id))

    # the recommendation is an experiment vLLM accepts as it is
    assert (conf / "experiment" / "e2e_best.yaml").is_file()
    dry = run_cli(
        ["sweep", "experiment=e2e_best", "--dry-run"], workdir, timeout=300, env={"SPECEXP_CONF": str(conf)}
    )
    assert dry.returncode == 0, dry.stdout[-2000:] + dry.stderr[-2000:]
    assert "rejected" not in dry.stdout


def test_verify_names_the_drift_of_a_live_server(workdir: Path, tmp_path: Path) -> None:
    require_vllm()
    conf = tmp_path / "conf"
    shutil.copytree(conf_dir(), conf)
    for depth in (3, 5):
        (conf / "experiment" / f"depth{depth}.yaml").write_text(
            f"# @package _global_\ndefaults:\n  - override /spec: ngram\nspec:\n  depth: {depth}\n"
        )
    (variant,) = plan_sweep(["spec=ngram", "spec.depth=3", "suite=none"], with_baseline=False)
    plan = build_plan(variant, port=free_port())
    env = {"SPECEXP_CONF": str(conf)}
    with LocalLauncher(plan, tmp_path / "server.log", ready_timeout_s=600) as launcher:
        url = launcher.wait_ready().base_url
        drift = run_cli(["verify", "--endpoint", url, "--against", "depth5"], workdir, timeout=120, env=env)
        clean = run_cli(["verify", "--endpoint", url, "--against", "depth3"], workdir, timeout=120, env=env)
    assert drift.returncode == 1, drift.stdout + drift.stderr
    flat = " ".join(drift.stdout.split())
    assert "DRIFT: spec.depth 3 (recommended 5)" in flat
    assert "/metrics" in drift.stdout and "/server_info" in drift.stdout  # read live, not from a file
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert "clean" in clean.stdout
    dead = run_cli(["verify", "--endpoint", url, "--against", "depth3"], workdir, timeout=120, env=env)
    assert dead.returncode == 2 and dead.stderr.strip().startswith("specexp: error: endpoint")
    assert processes_matching(f"--port={plan.api_port}") == []


def test_the_replay_proposes_what_vllms_own_ngram_rule_proposes(tmp_path: Path) -> None:
    """3000 random contexts and windows through vLLM's ``_find_longest_matched_ngram_and_
    propose_tokens`` (in its own venv) and through specexp's index."""
    require_vllm()
    rng = random.Random(1)
    cases: list[dict[str, Any]] = []
    for _ in range(3000):
        vocab = rng.choice([2, 3, 4, 6, 10])
        lo = rng.randint(1, 4)
        cases.append(
            {
                "tokens": [rng.randrange(vocab) for _ in range(rng.randint(1, 60))],
                "min": lo,
                "max": rng.randint(lo, 6),
                "k": rng.randint(1, 8),
            }
        )
    script = tmp_path / "propose.py"
    script.write_text(
        "import json, sys\nimport numpy as np\n"
        "from vllm.v1.spec_decode.ngram_proposer import (\n"
        "    _find_longest_matched_ngram_and_propose_tokens as f)\n"
        "cases = json.load(sys.stdin)\n"
        "print(json.dumps([f(np.array(c['tokens'], dtype=np.int32), c['min'], c['max'], 10**6, c['k'])"
        ".tolist()"
        " for c in cases]))\n"
    )
    py = vllm_python()
    assert py is not None
    done = subprocess.run(
        [str(py), str(script)], input=json.dumps(cases), capture_output=True, text=True, timeout=600
    )
    theirs = json.loads(done.stdout.strip().splitlines()[-1])
    for case, proposal in zip(cases, theirs, strict=True):
        tokens = case["tokens"]
        start = NgramIndex(tokens, case["max"]).propose_start(len(tokens), case["min"], case["max"])
        mine = [] if start is None else tokens[start : start + min(case["k"], len(tokens) - start)]
        assert mine == proposal, case
