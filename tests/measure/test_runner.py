"""The trial schedule against live fake servers: adaptive batches and their stopping rule,
what a measured window contains, and windows that are not measurements."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from specexp.config.compose import plan_sweep
from specexp.config.schema import BenchConfig, CaseConfig
from specexp.launch.base import Endpoint
from specexp.launch.local import LocalLauncher
from specexp.measure import runner
from specexp.measure.runner import VariantBench, _case_result, measure
from specexp.measure.stats import case_verdict
from specexp.measure.traffic import plan_cases
from specexp.record.results import CaseResult, RequestRecord, TrialRecord, VariantResult
from tests.helpers import scripted_sse
from tests.launch.test_local import fake_plan

ROOT = Path(__file__).resolve().parents[2]


def _bench(*overrides: str) -> BenchConfig:
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


def _run(tmp_path: Path, bench: BenchConfig, baseline: VariantResult | None) -> dict[str, CaseResult]:
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


def _spread_baseline(trials: int, cases: dict[str, int]) -> VariantResult:
    """Baseline trials spread over eight orders of magnitude around anything the fake
    server does: no verdict against it, and an interval ~10^4 wide."""
    base = _baseline(1.0, trials, cases)
    for case in base.cases.values():
        for i, t in enumerate(case.trials):
            t.metrics = dict.fromkeys(t.metrics, 10.0 ** (2 * i - 3))
    return base


@pytest.mark.parametrize(("target_width", "trials"), [(None, 15), (1e-6, 15), (1e9, 5)])
def test_target_width_stops_adding_batches_once_the_interval_is_that_narrow(
    tmp_path: Path, target_width: float | None, trials: int
) -> None:
    extra = [] if target_width is None else [f"bench.target_width={target_width}"]
    bench = _bench("bench.trials=5", "bench.max_trials=15", "bench.warmup_requests=0", *extra)
    cases = {name: c.concurrency for name, c in bench.cases.items()}
    results = _run(tmp_path, bench, _spread_baseline(5, cases))
    assert {len(c.trials) for c in results.values()} == {trials}
    verdict = case_verdict(results["single"], _spread_baseline(5, cases).cases["single"])
    assert verdict is not None and verdict.verdict == "no clear difference"


def _case(values: list[float]) -> CaseResult:
    trials = [
        TrialRecord(case="single", trial=i, duration_s=1.0, requests=[], metrics={"decode_tok_s": v})
        for i, v in enumerate(values)
    ]
    return CaseResult(case="single", concurrency=1, trials=trials, summary={})


def test_undecided_counts_a_narrow_interval_as_an_answer_only_with_a_target_width() -> None:
    base = {"single": _case([100.0, 101.0, 99.0, 100.5, 99.5])}
    tight = {"single": _case([100.2, 100.9, 99.2, 100.4, 99.8])}  # no difference, ±1 %
    loose = {"single": _case([80.0, 120.0, 95.0, 110.0, 90.0])}  # no difference, ±20 %
    faster = {"single": _case([150.0, 151.0, 149.0, 150.5, 149.5])}
    assert runner.undecided(tight, base, 0.95) == ["single"]
    assert runner.undecided(tight, base, 0.95, target_width=0.10) == []
    assert runner.undecided(loose, base, 0.95, target_width=0.10) == ["single"]
    assert (
        runner.undecided(faster, base, 0.95) == runner.undecided(faster, base, 0.95, target_width=1e-9) == []
    )
    # too few trials for any interval: more trials, whatever the target
    assert runner.undecided({"single": _case([100.0, 100.1])}, base, 0.95, target_width=10.0) == ["single"]


# -- against the scripted server: its /metrics are computed from its own send times ---------


@pytest.fixture(scope="module")
def scripted() -> Iterator[str]:
    """Stops by itself (an EOS step one gap after the last text), like vLLM at natural stops."""
    with scripted_sse("30", "20,40", "--eos-step") as url:
        yield url


def _scripted_bench(**bench: Any) -> BenchConfig:
    case = CaseConfig(concurrency=1, num_prompts=2, max_tokens=12)
    return BenchConfig(**{"trials": 1, "warmup_requests": 0, "cases": {"single": case}, **bench})


def _trials(base_url: str, bench: BenchConfig, rounds: int = 1) -> list[TrialRecord]:
    async def go() -> list[TrialRecord]:
        async with VariantBench(Endpoint(base_url=base_url, model="scripted"), bench) as vb:
            for _ in range(rounds):
                await vb.run_trial(rounds)
            return vb.trials["single"]

    return asyncio.run(go())


def _single_result(bench: BenchConfig, trials: list[TrialRecord]) -> CaseResult:
    return _case_result(plan_cases(bench, None)["single"], bench, trials)


def test_client_decode_speed_matches_the_servers_own(scripted: str) -> None:
    (trial,) = _trials(scripted, _scripted_bench())
    m = trial.metrics
    assert trial.ok and m["server_decode_tok_s"] > 0 and m["server_inv_tpot_tok_s"] > 0
    # the last step makes only EOS: a window ending at the last text chunk would leave out one
    # of 11 gaps (20-40 ms of ~330 ms) and read ~9 % fast
    assert abs(m["client_server_gap"]) < 0.05
    case = _single_result(_scripted_bench(), [trial])
    assert case.server_disagreements == 0


def test_a_counter_reset_inside_a_window_fails_that_trial_only(scripted: str) -> None:
    bench = _scripted_bench()
    httpx.post(f"{scripted}/x/restart", timeout=5).raise_for_status()  # the next request "restarts" it
    first, second = _trials(scripted, bench, rounds=2)
    assert not first.ok and "restarted" in (first.error or "") and first.metrics == {}
    assert second.ok and second.metrics["decode_tok_s"] > 0
    case = _single_result(bench, [first, second])
    assert case.failed_trials == 1 and case.summary["decode_tok_s"].n == 1
    # statistics and verdicts skip it: a 1e9 tok/s "window" would otherwise decide the verdict
    first.metrics = {"decode_tok_s": 1e9}
    base = CaseResult(case="single", concurrency=1, trials=[second] * 4, summary={})
    var = CaseResult(case="single", concurrency=1, trials=[first, second, second, second, second], summary={})
    verdict = case_verdict(var, base)
    assert verdict is not None and verdict.n_variant == 4


def test_the_loop_check_runs_after_the_window_is_timed(
    scripted: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    order: list[str] = []

    class Clock:
        @staticmethod
        def perf_counter() -> float:
            order.append("clock")
            return time.perf_counter()

        time = staticmethod(time.time)

    def looping(text: str) -> bool:
        order.append("loop check")
        return False

    monkeypatch.setattr(runner, "time", Clock)
    monkeypatch.setattr(runner, "is_looping", looping)
    _trials(scripted, _scripted_bench())
    # t0, the window's end, then one check per request
    assert order == ["clock", "clock", "loop check", "loop check"]


def test_reasoning_text_goes_through_the_loop_guard(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[str] = []

    def looping(text: str) -> bool:
        seen.append(text)
        return True

    monkeypatch.setattr(runner, "is_looping", looping)
    rec = RequestRecord(index=0, start_s=0, reasoning_text="think think", text="answer")
    runner.check_loops([rec])
    assert rec.looping and "think think" in seen[0] and "answer" in seen[0]


def test_trust_loops_is_a_bench_key_and_decides_whether_a_looping_case_gets_more_trials() -> None:
    assert _bench("bench.trust_loops=true").trust_loops is True
    assert _bench().trust_loops is False

    def case(values: list[float], looping: int) -> CaseResult:
        trials = [
            TrialRecord(case="c", trial=i, duration_s=1.0, requests=[], metrics={"decode_tok_s": v})
            for i, v in enumerate(values)
        ]
        return CaseResult(case="c", concurrency=1, trials=trials, summary={}, looping_outputs=looping)

    base = {"c": case([10.0, 11.0, 12.0, 11.5], 0)}
    unclear = {"c": case([10.5, 11.2, 11.9, 11.0], 3)}
    assert runner.undecided(unclear, base, 0.95) == []  # not trusted: more trials cannot help
    assert runner.undecided(unclear, base, 0.95, trust_loops=True) == ["c"]


@pytest.mark.parametrize(("drafts_from", "warm_ups"), [(0, 1), (2, 3), (9, 4)])
def test_the_warm_up_goes_on_until_the_server_has_drafted(drafts_from: int, warm_ups: int) -> None:
    """The first draft compiles vLLM's ngram proposer: until the counters show one, the
    warm-up sends longer requests (at most EXTRA_WARMUPS more), and then stops."""
    with scripted_sse("5", "2", f"--drafts-from={drafts_from}") as base_url:
        bench = _scripted_bench(warmup_requests=1)
        seen: list[str] = []

        async def go() -> None:
            async with VariantBench(Endpoint(base_url=base_url, model="scripted"), bench, seen.append):
                pass

        asyncio.run(go())
        metrics = httpx.get(f"{base_url}/metrics", timeout=5).text
        served = next(
            ln for ln in metrics.splitlines() if ln.startswith("vllm:request_generation_tokens_count")
        )
        assert float(served.rsplit(" ", 1)[1]) == warm_ups  # requests 0..drafts_from, capped
        assert ("no draft yet" in " ".join(seen)) == (drafts_from > 0)
        assert ("made no draft" in " ".join(seen)) == (warm_ups == 1 + runner.EXTRA_WARMUPS)


def test_without_speculation_the_warm_up_is_what_was_asked(scripted: str) -> None:
    before = httpx.get(f"{scripted}/metrics", timeout=5).text

    def served(text: str) -> float:
        line = next(ln for ln in text.splitlines() if ln.startswith("vllm:request_generation_tokens_count"))
        return float(line.rsplit(" ", 1)[1])

    async def go() -> None:
        async with VariantBench(
            Endpoint(base_url=scripted, model="scripted"), _scripted_bench(warmup_requests=2)
        ):
            pass

    asyncio.run(go())
    assert served(httpx.get(f"{scripted}/metrics", timeout=5).text) - served(before) == 2
