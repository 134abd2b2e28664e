from __future__ import annotations

import random

import pytest

from specexp.measure.stats import (
    attach_verdicts,
    compare,
    jain_index,
    look_confidence,
    min_trials,
    outlier_indices,
    summarize,
    trial_metrics,
)
from specexp.record.results import CaseResult, RequestRecord, TrialRecord, VariantResult


def rec(i: int, ttft: float, latency: float, tokens: int, error: str | None = None) -> RequestRecord:
    return RequestRecord(
        index=i, start_s=0.0, ttft_s=ttft, latency_s=latency, output_tokens=tokens, error=error
    )


def test_summary_is_median_min_max() -> None:
    s = summarize([6.7, 3.1, 6.4, 10.2, 6.9])
    assert s is not None and (s.median, s.min, s.max, s.n) == (6.7, 3.1, 10.2, 5)
    assert summarize([]) is None


def test_trial_metrics_count_failures_and_use_usage_tokens() -> None:
    records = [rec(0, 0.1, 1.1, 21), rec(1, 0.3, 2.3, 41), rec(2, 0.2, 0.0, 0, error="boom")]
    m = trial_metrics(records, duration_s=2.5, concurrency=4)
    assert m["failed_requests"] == 1
    assert m["output_tok_s"] == pytest.approx(62 / 2.5)
    assert m["ttft_ms"] == pytest.approx(200)
    assert m["ttft_spread_ms"] == pytest.approx(200)
    assert m["decode_tok_s"] == pytest.approx(20.0)  # (21-1)/1.0 and (41-1)/2.0


def test_all_failed_gives_only_the_count() -> None:
    assert trial_metrics([rec(0, 0.1, 1.0, 5, error="x")], 1.0, 1) == {"failed_requests": 1.0}


def test_seed_000_single_trial_3_1_is_flagged_not_dropped() -> None:
    # the seed's five-trial read (6.4–10.2, median 6.7) plus the lone 3.1 that looked like a regression
    s = summarize([6.7, 6.4, 6.8, 10.2, 6.6, 3.1])
    assert s is not None and s.n == 6 and s.min == 3.1  # kept
    assert set(s.outliers) == {3, 5}  # 10.2 and 3.1 sit far from the others
    assert s.mad == pytest.approx(0.2) and s.cv is not None and s.cv > 0.3


def test_outliers_need_three_values_and_handle_zero_mad() -> None:
    assert outlier_indices([1.0, 100.0]) == []
    assert outlier_indices([5.0, 5.0, 5.0, 5.0, 5.0, 9.0]) == [5]  # MAD 0: mean abs deviation stands in
    assert outlier_indices([5.0, 5.0, 5.0]) == []


def test_verdicts_clear_effect_tie_and_regression() -> None:
    base = [34.3, 34.8, 36.2, 35.0, 34.9]
    better = compare("decode_tok_s", base, [92.5, 95.5, 99.6, 94.0, 97.1])
    assert better is not None and better.verdict == "better"
    assert better.ci_low is not None and better.ci_low > 1 and better.n_baseline == better.n_variant == 5
    tie = compare("decode_tok_s", base, [33.9, 35.1, 36.0, 34.5, 35.3])
    assert tie is not None and tie.verdict == "no clear difference"
    assert tie.ci_low is not None and tie.ci_high is not None and tie.ci_low <= 1 <= tie.ci_high
    worse = compare("decode_tok_s", base, [30.1, 30.5, 31.0, 29.8, 30.7])
    assert worse is not None and worse.verdict == "worse"
    latency = compare(
        "ttft_ms", [100.0, 101.0, 99.0, 100.5], [80.0, 81.0, 79.0, 80.5], higher_is_better=False
    )
    assert latency is not None and latency.verdict == "better"
    assert compare("x", [], [1.0]) is None


def test_ratio_is_the_median_pairwise_ratio_and_one_outlier_cannot_flip_it() -> None:
    v = compare("x", [1.0, 2.0], [2.0, 4.0])  # pairwise ratios 2, 4, 1, 2 -> median 2
    assert v is not None and v.ratio == pytest.approx(2.0)
    base = [100.0, 101.0, 99.0, 100.5, 99.5]
    faster = [110.0, 111.0, 109.0, 110.5, 66.0]  # +10 %, one trial collapsed (seed 000's slow trial)
    verdict = compare("x", base, faster)
    assert verdict is not None and verdict.ratio == pytest.approx(1.1, rel=0.01)


def test_three_trials_against_three_cannot_give_a_95_percent_verdict() -> None:
    v = compare("x", [10.0, 10.1, 10.2], [20.0, 20.1, 20.2])
    assert v is not None and v.verdict == "no clear difference" and v.ci_low is None and v.ci_high is None
    assert min_trials(0.95) == 4


def test_false_winners_stay_at_or_under_five_percent_under_no_effect() -> None:
    rng = random.Random(7)
    runs, wrong = 400, 0
    for _ in range(runs):
        b = [100 * (1 + rng.gauss(0, 0.1)) for _ in range(5)]
        v = [100 * (1 + rng.gauss(0, 0.1)) for _ in range(5)]
        verdict = compare("x", b, v)
        assert verdict is not None
        wrong += verdict.verdict != "no clear difference"
    assert wrong / runs <= 0.06  # exact test: 5 % in expectation, binomial noise on 400 runs


def test_look_confidence_splits_five_percent_over_the_planned_looks() -> None:
    assert look_confidence(5, 0) == pytest.approx(0.95)
    assert look_confidence(5, 5) == pytest.approx(0.95)
    assert look_confidence(5, 20) == pytest.approx(1 - 0.05 / 4)  # looks at 5, 10, 15, 20
    assert look_confidence(5, 12) == pytest.approx(1 - 0.05 / 3)  # 5, 10, 12


def test_verdicts_attach_to_every_case_from_trial_values() -> None:
    def case(values: list[float], concurrency: int) -> CaseResult:
        key = "decode_tok_s" if concurrency == 1 else "output_tok_s"
        trials = [
            TrialRecord(case="c", trial=i, duration_s=1.0, requests=[], metrics={key: v})
            for i, v in enumerate(values)
        ]
        return CaseResult(case="c", concurrency=concurrency, trials=trials, summary={})

    def variant(cases: dict[str, CaseResult]) -> VariantResult:
        return VariantResult(label="v", variant_hash="h", is_baseline=False, overrides=[], cases=cases)

    base = variant({"single": case([10, 11, 12, 11], 1), "c4": case([40, 41, 42, 41], 4)})
    var = variant({"single": case([20, 21, 22, 21], 1), "c4": case([40, 42, 41, 41], 4)})
    attach_verdicts(var, base)
    assert var.cases["single"].verdict is not None and var.cases["single"].verdict.verdict == "better"
    c4 = var.cases["c4"].verdict
    assert c4 is not None and c4.metric == "output_tok_s" and c4.verdict == "no clear difference"


def test_small_deviation_is_not_an_outlier_even_when_mad_is_tiny() -> None:
    assert outlier_indices([107.0, 104.1, 104.05]) == []  # 3 % away: noise, not an outlier
    assert outlier_indices([6.4, 6.7, 10.2]) == [2]


def test_jain_index_and_fairness_figures() -> None:
    assert jain_index([10.0, 10.0, 10.0, 10.0]) == pytest.approx(1.0)
    assert jain_index([40.0, 0.0, 0.0, 0.0]) == pytest.approx(0.25)
    records = [rec(0, 0.1, 2.1, 41), rec(1, 0.9, 2.9, 41)]
    m = trial_metrics(records, duration_s=3.0, concurrency=2)
    assert m["ttft_max_ms"] == pytest.approx(900) and m["ttft_spread_ms"] == pytest.approx(800)
    assert 0.9 < m["jain_index"] < 1.0
    assert m["looping_outputs"] == 0
