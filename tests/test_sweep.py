from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path

import pytest
from rich.console import Console

from specexp import sweep
from specexp.config.compose import plan_sweep
from specexp.errors import ValidationFailed
from specexp.launch.plan import LaunchPlan
from specexp.launch.validate import ValidationResult
from specexp.sweep import VariantRun
from tests.launch.test_local import alive, fake_plan, worker_pid


def test_a_server_error_mid_measurement_fails_the_variant_not_the_sweep(tmp_path: Path) -> None:
    (variant,) = plan_sweep(["spec=none", "suite=none", "bench.warmup_requests=0"], with_baseline=False)
    plan = fake_plan("metrics500")
    messages: list[str] = []
    run = VariantRun(variant, plan, tmp_path / "v", None, messages.append)
    run.execute(None)
    result = run.result
    assert result.status == "failed"
    assert result.error is not None and result.error.startswith("HTTPStatusError")
    assert result.ready_s is not None  # it got as far as ready
    saved = json.loads((tmp_path / "v" / "result.json").read_text())
    assert saved["status"] == "failed"
    assert not alive(worker_pid(tmp_path / "v" / "server.log"))
    assert {"config.yaml", "launch.json", "server.log", "result.json"} <= {
        p.name for p in (tmp_path / "v").iterdir()
    }


def test_a_reused_sweep_name_never_overwrites_earlier_results(workdir: Path) -> None:
    from rich.console import Console

    from specexp.sweep import run_sweep

    first = workdir / "results" / "same"
    first.mkdir(parents=True)
    (first / "sweep.json").write_text("{}")
    (variant,) = plan_sweep(
        [
            "spec=none",
            "tracking=none",
            "model.path=/nonexistent/model",
            "launcher.vllm_command=[/nonexistent/vllm]",
        ],
        with_baseline=False,
    )
    outcome = run_sweep([variant], Console(file=open("/dev/null", "w")), name="same")  # noqa: SIM115
    assert outcome.directory.name == "same-2" and outcome.result.name == "same-2"
    assert (first / "sweep.json").read_text() == "{}"
    assert outcome.result.variants[0].status == "failed"  # the launch itself failed, and says why
    assert "cannot start /nonexistent/vllm" in (outcome.result.variants[0].error or "")


def test_interleaved_sweep_takes_one_trial_of_each_variant_per_round(tmp_path: Path) -> None:
    from specexp.sweep import _run_interleaved

    variants = plan_sweep(
        [
            "spec=ngram",
            "bench.trials=3",
            "bench.order=interleaved",
            "suite=none",
            "bench.warmup_requests=0",
            "bench.cases.single.num_prompts=1",
            "bench.cases.concurrent4.num_prompts=4",
        ]
    )
    assert [v.is_baseline for v in variants] == [True, False]
    runs = [
        VariantRun(v, fake_plan("serve"), tmp_path / str(i), None, lambda _m: None)
        for i, v in enumerate(variants)
    ]
    finished: list[str] = []
    _run_interleaved(runs, lambda run: finished.append(run.variant.label))
    assert finished == [v.label for v in variants]
    base, spec = (run.result for run in runs)
    assert base.status == spec.status == "ok"
    for case in ("single", "concurrent4"):
        a = [t.started_at for t in base.cases[case].trials]
        b = [t.started_at for t in spec.cases[case].trials]
        assert len(a) == len(b) == 3
        assert a[0] < b[0] < a[1] < b[1] < a[2] < b[2]  # round-robin, baseline first in each round
    assert spec.cases["single"].verdict is not None  # judged against the baseline's trials
    for i in range(2):
        lines = (tmp_path / str(i) / "requests.jsonl").read_text().splitlines()
        assert len(lines) == 3 * (1 + 4) and json.loads(lines[0])["case"] == "single"
        assert not alive(worker_pid(tmp_path / str(i) / "server.log"))


def _alive_stamps(log: Path) -> list[float]:
    return [float(m[1]) for m in re.finditer(r"^ALIVE (\d+\.\d+)$", log.read_text(), re.M)]


def test_interleaved_sweep_on_cpu_freezes_every_server_but_the_one_measuring(tmp_path: Path) -> None:
    from specexp.sweep import _run_interleaved

    variants = plan_sweep(
        [
            "spec=ngram",
            "bench.trials=2",
            "bench.order=interleaved",
            "suite=none",
            "bench.warmup_requests=1",
            "bench.cases.single.num_prompts=2",
            "bench.cases.concurrent4.num_prompts=4",
        ]
    )
    assert variants[0].config.bench.freeze_idle == "auto"  # and the fake plans run on "cpu"
    runs = [
        VariantRun(v, fake_plan("serve"), tmp_path / str(i), None, lambda _m: None)
        for i, v in enumerate(variants)
    ]
    _run_interleaved(runs, lambda _run: None)
    assert [run.result.status for run in runs] == ["ok", "ok"]
    assert all(c.failed_requests == 0 for run in runs for c in run.result.cases.values())  # after thaws too
    windows = {
        i: [(t.started_at, t.started_at + t.duration_s) for c in run.result.cases.values() for t in c.trials]
        for i, run in enumerate(runs)
    }
    for me, other in ((0, 1), (1, 0)):
        mine, theirs = _alive_stamps(tmp_path / str(me) / "server.log"), windows[other]
        assert len(theirs) == 4
        for begin, end in theirs:  # frozen while the other measured (20 ms margin for the signal)
            assert not [t for t in mine if begin + 0.02 < t < end - 0.02], (me, begin, end)
        assert any(begin < t < end for t in mine for begin, end in windows[me])  # alive in its own turn
        assert not alive(worker_pid(tmp_path / str(me) / "server.log"))


def test_interleaved_sweep_goes_on_when_one_server_fails_to_start(tmp_path: Path) -> None:
    from specexp.sweep import _run_interleaved

    variants = plan_sweep(
        [
            "spec=ngram",
            "bench.trials=1",
            "bench.order=interleaved",
            "suite=none",
            "bench.warmup_requests=0",
            "bench.cases.single.num_prompts=1",
            "bench.cases.concurrent4.num_prompts=4",
        ]
    )
    runs = [
        VariantRun(variants[0], fake_plan("serve"), tmp_path / "0", None, lambda _m: None),
        VariantRun(variants[1], fake_plan("crash"), tmp_path / "1", None, lambda _m: None),
    ]
    _run_interleaved(runs, lambda _run: None)
    assert runs[0].result.status == "ok" and len(runs[0].result.cases["single"].trials) == 1
    assert runs[1].result.status == "failed" and "KV cache" in (runs[1].result.error or "")
    assert json.loads((tmp_path / "1" / "result.json").read_text())["status"] == "failed"


def test_fail_fast_stops_a_regressing_variant_before_its_benchmarks(tmp_path: Path) -> None:
    overrides = [
        "spec=ngram",
        "bench.trials=1",
        "bench.warmup_requests=0",
        "bench.cases.single.num_prompts=1",
        "bench.cases.concurrent4.num_prompts=4",
        "suite.fail_fast=true",
    ]
    base_v, spec_v = plan_sweep(overrides)
    for v in (base_v, spec_v):  # a one-case suite (Hydra cannot replace a typed dict from the CLI)
        v.config.suite.cases = {
            "capital": {
                "messages": [{"role": "user", "content": "capital?"}],
                "check": {"kind": "exact", "expected": "Paris"},
            }
        }
    base = VariantRun(base_v, fake_plan("serve"), tmp_path / "0", None, lambda _m: None)
    base.execute(None)
    assert base.result.status == "ok" and base.result.suite is not None and base.result.suite.passed == 1
    spec = VariantRun(spec_v, fake_plan("serve-wrong"), tmp_path / "1", None, lambda _m: None)
    spec.execute(base.result)
    assert spec.result.status == "failed" and spec.result.cases == {}
    assert spec.result.error == (
        "suite regression17: 1 regression(s) (capital); benchmarks skipped (suite.fail_fast=true)"
    )
    saved = json.loads((tmp_path / "1" / "suite.json").read_text())
    assert saved["cases"][0]["regression"] is True and saved["cases"][0]["output"] == "Lyon"
    assert saved["cases"][0]["first_divergence"] == 0


def _quiet() -> Console:
    return Console(file=open(os.devnull, "w"))


def _validate_while_a_fake_server_starts(
    workdir: Path, monkeypatch: pytest.MonkeyPatch, *, ok: bool
) -> tuple[Path, dict[str, int]]:
    """Every plan is a fake server; the validator finds it already starting (its worker pid
    goes into the returned dict) and accepts the plan or rejects it for ``--bogus``."""
    temp = workdir / "tmp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    plan = fake_plan("serve")
    monkeypatch.setattr(sweep, "_plans", lambda variants, resolve_model: [plan])
    seen: dict[str, int] = {}

    def validate(plans: list[LaunchPlan]) -> list[ValidationResult]:
        (log,) = temp.glob("specexp-server-*.log")  # the server is already starting
        seen["worker"] = worker_pid(log)
        error = None if ok else "unrecognized arguments: --bogus"
        return [ValidationResult(plans[0].label, ok, error=error)]

    monkeypatch.setattr(sweep, "validate_plans", validate)
    return temp, seen


def test_validation_overlaps_the_first_server_start_and_its_log_is_kept_whole(
    workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    temp, seen = _validate_while_a_fake_server_starts(workdir, monkeypatch, ok=True)
    (variant,) = plan_sweep(
        [
            "spec=none",
            "suite=none",
            "tracking=none",
            "bench.trials=1",
            "bench.warmup_requests=0",
            "bench.cases.single.num_prompts=1",
            "bench.cases.concurrent4.num_prompts=4",
        ],
        with_baseline=False,
    )
    outcome = sweep.run_sweep([variant], _quiet(), name="early")
    result = outcome.result.variants[0]
    assert result.status == "ok", result.error
    assert any("started while vLLM validated" in n for n in result.notes)
    (vdir,) = [p for p in outcome.directory.iterdir() if p.is_dir() and p.name != "vllm-bench"]
    log = (vdir / "server.log").read_text()
    # one log from the first line to the shutdown, though it began before the folder existed
    assert log.startswith(f"WORKER_PID={seen['worker']}\n") and "Application startup complete" in log
    assert "REQUEST" in log  # lines written after the move land in the same file
    assert not alive(seen["worker"])
    assert list(temp.iterdir()) == []


def test_a_sweep_rejected_by_validation_stops_the_early_server_and_leaves_nothing(
    workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    temp, seen = _validate_while_a_fake_server_starts(workdir, monkeypatch, ok=False)
    (variant,) = plan_sweep(["spec=none", "suite=none"], with_baseline=False)
    with pytest.raises(ValidationFailed, match="--bogus"):
        sweep.run_sweep([variant], _quiet(), name="bad")
    assert not alive(seen["worker"])
    assert sorted(p.name for p in workdir.iterdir()) == ["tmp"]  # no results, no mlflow.db
    assert list(temp.iterdir()) == []
