from __future__ import annotations

import pytest

from specexp.measure.stats import summarize, trial_metrics
from specexp.record.results import RequestRecord


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
