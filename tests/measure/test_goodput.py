from __future__ import annotations

import pytest

from specexp.measure.goodput import Slo, goodput_metrics, is_good, mean_itl_s
from specexp.record.results import RequestRecord


def rec(ttft_ms: float, latency_ms: float, tokens: int, error: str | None = None) -> RequestRecord:
    return RequestRecord(
        index=0,
        start_s=0,
        ttft_s=ttft_ms / 1000,
        latency_s=latency_ms / 1000,
        output_tokens=tokens,
        error=error,
    )


def test_the_inter_token_figure_is_the_requests_mean_gap_as_vllm_tpot() -> None:
    assert mean_itl_s(rec(100, 1100, 11)) == pytest.approx(0.1)  # (1100 - 100) / (11 - 1) ms
    assert mean_itl_s(rec(100, 100, 1)) == 0.0  # no gap: vLLM counts it as 0


def test_a_request_is_good_only_within_every_objective() -> None:
    slo = Slo(ttft_ms=200, itl_ms=50)
    assert is_good(rec(200, 700, 11), slo)  # both exactly at the objective
    assert not is_good(rec(201, 700, 11), slo)  # TTFT over
    assert not is_good(rec(100, 1100, 11), slo)  # 100 ms gaps
    assert not is_good(rec(10, 20, 2, error="HTTP 500"), slo)  # failed requests never count
    assert is_good(rec(5000, 5500, 11), Slo(itl_ms=50))  # only the objectives that are set


def test_goodput_is_good_requests_per_second_of_the_window() -> None:
    records = [rec(100, 600, 11), rec(300, 800, 11), rec(100, 2100, 11), rec(100, 600, 11, error="x")]
    out = goodput_metrics(records, 2.0, Slo(ttft_ms=200, itl_ms=60))
    assert out == {"goodput_req_s": 0.5, "good_fraction": 0.25}
    assert goodput_metrics(records, 2.0, Slo()) == {}  # no objectives, no goodput
