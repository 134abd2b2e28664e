from __future__ import annotations

import itertools
import math
import random
import statistics

import pytest

from specexp.measure.prometheus import ServerWindow
from specexp.measure.stats import (
    _trim,
    attach_verdicts,
    case_verdict,
    compare,
    jain_index,
    look_confidence,
    metric_verdict,
    min_trials,
    outlier_indices,
    server_metrics,
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


def null_counts(n: int, m: int) -> list[int]:
    """How many rank arrangements of n baseline and m variant trials give each Mann-Whitney
    U: the coefficients of the Gaussian binomial [n+m choose n]_q, built as the product
    of (1 - q^(m+i)) / (1 - q^i), a reference independent of the code's recursion."""
    poly = [1]
    for i in range(1, n + 1):
        shifted = [*poly, *([0] * (m + i))]
        for j, c in enumerate(poly):
            shifted[j + m + i] -= c
        for j in range(i, len(shifted)):  # exact division by (1 - q^i)
            shifted[j] += shifted[j - i]
        poly = shifted[: n * m + 1]
    return poly


def brute_force_counts(n: int, m: int) -> list[int]:
    """The same distribution by enumerating every choice of the baseline's ranks."""
    out = [0] * (n * m + 1)
    for ranks in itertools.combinations(range(n + m), n):
        out[sum(ranks) - n * (n - 1) // 2] += 1  # U of the baseline sample
    return out


def test_reference_distribution_is_the_enumerated_one() -> None:
    for n, m in [(3, 3), (3, 7), (5, 5), (4, 9), (6, 6)]:
        assert null_counts(n, m) == brute_force_counts(n, m)


def _ranks_of_bounds(n: int, m: int, confidence: float = 0.95) -> tuple[list[float], int, int] | None:
    """Run compare on data whose n·m log differences are all distinct and known, and
    return the sorted differences with the 1-based ranks of the interval's ends."""
    xs = [0.1 * i for i in range(n)]
    ys = [0.1 * (j * n + 0.5) for j in range(m)]  # y - x = 0.1 (j·n - i + 0.5): all distinct
    v = compare("x", [math.exp(x) for x in xs], [math.exp(y) for y in ys], confidence=confidence)
    assert v is not None
    if v.ci_low is None or v.ci_high is None:
        return None
    diffs = sorted(y - x for x in xs for y in ys)
    lo, hi = math.log(v.ci_low), math.log(v.ci_high)
    (r_lo,) = [i + 1 for i, d in enumerate(diffs) if math.isclose(d, lo, abs_tol=1e-6)]
    (r_hi,) = [i + 1 for i, d in enumerate(diffs) if math.isclose(d, hi, abs_tol=1e-6)]
    return diffs, r_lo, r_hi


@pytest.mark.parametrize("n", range(3, 13))
def test_exact_interval_covers_at_least_the_stated_confidence(n: int) -> None:
    """Coverage of D(r_lo)…D(r_hi) under no effect is 1 - P(U <= r_lo - 1) - P(U >= r_hi),
    counted over every rank arrangement; it must reach 95 %, and the next narrower
    interval must not (the interval is not wider than it needs to be either)."""
    for m in range(3, 13):
        counts = null_counts(n, m)
        total = sum(counts)

        def below(d: int, counts: list[int] = counts, total: int = total) -> float:
            return sum(counts[: d + 1]) / total  # P(U <= d)

        got = _ranks_of_bounds(n, m)
        if got is None:  # no interval: even the widest one, D(1)…D(nm), misses 95 %
            assert 1 - 2 * below(0) < 0.95, (n, m)
            continue
        _, r_lo, r_hi = got
        assert r_lo + r_hi == n * m + 1, (n, m)  # symmetric ranks
        coverage = 1 - below(r_lo - 1) - below(n * m - r_hi)
        assert coverage >= 0.95 - 1e-12, (n, m, coverage)
        assert 1 - 2 * below(r_lo) < 0.95, (n, m)  # one rank narrower would miss it


def test_bounds_equal_a_brute_force_reference_on_fixed_data() -> None:
    base = [34.3, 34.8, 36.2, 35.0, 34.9]
    var = [36.9, 35.1, 37.4, 36.0, 38.2]
    v = compare("decode_tok_s", base, var)
    assert v is not None and v.ci_low is not None and v.ci_high is not None
    diffs = sorted(math.log(y) - math.log(x) for x in base for y in var)
    counts = brute_force_counts(5, 5)
    total = sum(counts)
    # R: q = qwilcox(0.025, 5, 5) = 3, interval D(3)…D(23): P(U <= 2) = 4/252 <= 2.5 %
    q = 1 + max(d for d in range(26) if sum(counts[: d + 1]) / total <= 0.025)
    assert q == 3
    assert v.ci_low == pytest.approx(math.exp(diffs[q - 1]), rel=1e-12)
    assert v.ci_high == pytest.approx(math.exp(diffs[25 - q]), rel=1e-12)
    assert v.ratio == pytest.approx(math.exp(statistics.median(diffs)), rel=1e-12)
    assert v.ci_low <= v.ratio <= v.ci_high  # the logged point lies inside its own interval


@pytest.mark.parametrize(("n", "m"), [(25, 26), (26, 30), (30, 30), (13, 50)])
def test_normal_approximation_past_625_pairs_keeps_the_coverage(n: int, m: int) -> None:
    counts = null_counts(n, m)
    total = sum(counts)
    k = _trim(n, m, 0.95)
    exact = 1 + max(d for d in range(n * m) if sum(counts[: d + 1]) / total <= 0.025)
    assert abs(k - exact) <= 1
    got = _ranks_of_bounds(n, m)
    assert got is not None
    _, r_lo, r_hi = got
    assert r_lo == k and r_hi == n * m + 1 - k
    assert 1 - 2 * sum(counts[:r_lo]) / total >= 0.95


def _case(values: list[float], looping: int = 0) -> CaseResult:
    trials = [
        TrialRecord(case="c", trial=i, duration_s=1.0, requests=[], metrics={"decode_tok_s": v})
        for i, v in enumerate(values)
    ]
    return CaseResult(case="c", concurrency=1, trials=trials, summary={}, looping_outputs=looping)


def test_a_case_whose_outputs_loop_gets_no_winner_unless_loops_are_trusted() -> None:
    base, fast = [35.0, 35.5, 34.8, 35.2, 35.1], [99.0, 98.0, 101.0, 100.0, 97.0]
    clear = case_verdict(_case(fast), _case(base))
    assert clear is not None and clear.verdict == "better"
    for var, ref in ((_case(fast, looping=2), _case(base)), (_case(fast), _case(base, looping=1))):
        v = case_verdict(var, ref)
        assert v is not None and v.verdict == "not trusted" and "loop" in (v.reason or "")
        assert v.ratio == pytest.approx(clear.ratio)  # the figure is still shown
        trusted = case_verdict(var, ref, trust_loops=True)
        assert trusted is not None and trusted.verdict == "better"
    result = VariantResult(
        label="v", variant_hash="h", is_baseline=False, overrides=[], cases={"c": _case(fast, looping=2)}
    )
    baseline = VariantResult(
        label="b", variant_hash="b", is_baseline=True, overrides=[], cases={"c": _case(base)}
    )
    attach_verdicts(result, baseline)
    assert result.cases["c"].verdict is not None and result.cases["c"].verdict.verdict == "not trusted"
    attach_verdicts(result, baseline, trust_loops=True)
    assert result.cases["c"].verdict is not None and result.cases["c"].verdict.verdict == "better"


def test_server_metrics_compare_totals_of_the_same_requests() -> None:
    records = [rec(0, 0.1, 2.1, 41), rec(1, 0.2, 1.2, 21)]  # 60 decode tokens over 3.0 s on the client
    window = ServerWindow(requests=2, decode_s=2.8, decode_tokens=60, tpot_sum_s=0.1, tpot_count=2)
    m = server_metrics(records, window)
    assert m["server_decode_tok_s"] == pytest.approx(60 / 2.8)
    assert m["server_inv_tpot_tok_s"] == pytest.approx(20.0)
    assert m["client_server_gap"] == pytest.approx((60 / 3.0) / (60 / 2.8) - 1)
    # a window with a request the client did not see finish (or one more): no comparison
    assert server_metrics(records, ServerWindow(3, 2.8, 60, 0.1, 3)) == {}
    assert server_metrics(records, None) == {}


def test_reasoning_tokens_are_summed_per_window() -> None:
    a, b = rec(0, 0.1, 1.1, 21), rec(1, 0.1, 1.1, 21)
    a.reasoning_tokens = 15
    assert trial_metrics([a, b], 1.0, 1)["reasoning_tokens"] == 15
    assert "reasoning_tokens" not in trial_metrics([b], 1.0, 1)


def test_the_logged_ratio_is_the_hodges_lehmann_one_and_lies_inside_its_interval() -> None:
    # medians 10 and 12 (a ratio of 1.2), the pairwise ratios put the estimate at 1.1: the
    # figure to log is the one the table shows and the interval is built around
    base = _case([10.0, 10.0, 10.0, 10.1, 13.0])
    var = _case([11.0, 11.0, 12.0, 12.1, 12.2])
    v = metric_verdict(var, base, "decode_tok_s")
    assert v is not None and v.ci_low is not None and v.ci_high is not None
    assert v.ci_low <= v.ratio <= v.ci_high
    assert v.ratio == pytest.approx(
        statistics.median(y / x for x in [10, 10, 10, 10.1, 13] for y in [11, 11, 12, 12.1, 12.2]), rel=0.01
    )
    verdict = case_verdict(var, base)
    assert verdict is not None and verdict.ratio == v.ratio
