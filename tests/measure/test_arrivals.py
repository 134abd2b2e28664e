from __future__ import annotations

import itertools
import math
import statistics

import pytest

from specexp.measure.arrivals import rate_offsets, trace_offsets, window_rng


def _gaps(due: list[float]) -> list[float]:
    return [b - a for a, b in itertools.pairwise([0.0, *due])]


def test_the_load_offered_is_exactly_the_rate_asked() -> None:
    due = rate_offsets(500, 50.0, 1.0, window_rng(0, "c", 0))
    assert due == sorted(due) and due[0] > 0
    assert due[-1] == pytest.approx(500 / 50.0)  # vllm bench serve's normalisation


@pytest.mark.parametrize(("burstiness", "cv"), [(1.0, 1.0), (4.0, 0.5), (0.25, 2.0)])
def test_burstiness_is_the_gamma_shape(burstiness: float, cv: float) -> None:
    gaps = _gaps(rate_offsets(20000, 10.0, burstiness, window_rng(1, "c", 0)))
    assert statistics.fmean(gaps) == pytest.approx(0.1, rel=1e-9)
    # the coefficient of variation of gamma(k) gaps is 1/sqrt(k): 1 for a Poisson process
    assert statistics.stdev(gaps) / statistics.fmean(gaps) == pytest.approx(cv, rel=0.1)


def test_infinite_burstiness_is_a_constant_gap_and_infinite_rate_is_all_at_once() -> None:
    assert _gaps(rate_offsets(4, 2.0, math.inf, window_rng(0, "c", 0))) == pytest.approx([0.5] * 4)
    assert rate_offsets(3, math.inf, 1.0, window_rng(0, "c", 0)) == [0.0, 0.0, 0.0]


def test_schedules_are_seeded_per_trial_and_shared_by_variants() -> None:
    a = rate_offsets(50, 5.0, 1.0, window_rng(0, "case", 2))
    assert a == rate_offsets(50, 5.0, 1.0, window_rng(0, "case", 2))  # every variant, trial 2
    assert a != rate_offsets(50, 5.0, 1.0, window_rng(0, "case", 3))  # the next trial
    assert a != rate_offsets(50, 5.0, 1.0, window_rng(1, "case", 2))  # another bench.seed


def test_bad_rates_are_refused() -> None:
    with pytest.raises(ValueError):
        rate_offsets(3, 0.0, 1.0, window_rng(0, "c", 0))
    with pytest.raises(ValueError):
        rate_offsets(3, 1.0, -1.0, window_rng(0, "c", 0))


def test_a_trace_starts_at_zero() -> None:
    assert trace_offsets([12.5, 13.0, None, 20.0]) == [0.0, 0.5, 0.0, 7.5]
