"""The trial schedule against a live fake server: adaptive batches and their stopping rule."""

from __future__ import annotations

import asyncio
from pathlib import Path

from specexp.config.compose import plan_sweep
from specexp.launch.local import LocalLauncher
from specexp.measure.runner import measure
from specexp.record.results import CaseResult, TrialRecord, VariantResult
from tests.launch.test_local import fake_plan


def _bench(*overrides: str):  # type: ignore[no-untyped-def]
    (variant,) = plan_sweep(
        [
            "spec=none",
            "bench.cases.single.num_prompts=1",
            "bench.cases.concurrent4.num_prompts=4",
            *overrides,
        ],
        with_baseline=False,
    )
    return variant.config.bench


def _baseline(value: float, trials: int, cases: dict[str, int]) -> VariantResult:
    def case(name: str, concurrency: int) -> CaseResult:
        key = "decode_tok_s" if concurrency == 1 else "output_tok_s"
        recs = [
            TrialRecord(case=name, trial=i, duration_s=1.0, requests=[], metrics={key: value + i * 1e-3})
            for i in range(trials)
        ]
        return CaseResult(case=name, concurrency=concurrency, trials=recs, summary={})

    return VariantResult(
        label="base",
        variant_hash="b",
        is_baseline=True,
        overrides=[],
        cases={n: case(n, c) for n, c in cases.items()},
    )


def _run(tmp_path: Path, bench, baseline: VariantResult | None) -> dict[str, CaseResult]:  # type: ignore[no-untyped-def]
    with LocalLauncher(fake_plan("serve"), tmp_path / "server.log", ready_timeout_s=30) as launcher:
        endpoint = launcher.wait_ready()
        return asyncio.run(measure(endpoint, bench, None, baseline))


def test_adaptive_trials_add_batches_while_the_verdict_is_unclear(tmp_path: Path) -> None:
    bench = _bench("bench.trials=2", "bench.max_trials=5", "bench.warmup_requests=0")
    cases = {name: c.concurrency for name, c in bench.cases.items()}
    # two baseline trials can never give a 95 % verdict, so every look stays unclear:
    # batches of 2 until the cap (2, 4, then 5)
    results = _run(tmp_path, bench, _baseline(50.0, 2, cases))
    assert {len(c.trials) for c in results.values()} == {5}
    assert [t.trial for t in results["single"].trials] == [0, 1, 2, 3, 4]


def test_adaptive_trials_stop_at_the_first_clear_verdict(tmp_path: Path) -> None:
    bench = _bench("bench.trials=5", "bench.max_trials=15", "bench.warmup_requests=0")
    cases = {name: c.concurrency for name, c in bench.cases.items()}
    # a baseline a million times faster than anything the fake can do: "worse" at once
    results = _run(tmp_path, bench, _baseline(1e9, 5, cases))
    assert {len(c.trials) for c in results.values()} == {5}


def test_without_a_baseline_trials_are_not_extended(tmp_path: Path) -> None:
    bench = _bench("bench.trials=2", "bench.max_trials=6", "bench.warmup_requests=1")
    results = _run(tmp_path, bench, None)
    assert {len(c.trials) for c in results.values()} == {2}
    started = [t.started_at for c in results.values() for t in c.trials]
    assert all(s > 0 for s in started)
