"""The A/A benchmark's calibration reading: standardized ratios and the false-winner rate
they imply, checked on values worked out by hand and on simulated A/As with a known answer."""

from __future__ import annotations

import math
import random

from benchmarks.aa_false_winners import calibration, standardized
from specexp.measure.stats import compare


def test_a_ratio_at_its_intervals_edge_is_the_normal_quantile() -> None:
    # log interval [0, 0.2] at 95 %: standard error 0.1 / 1.96, so log(ratio) = 0.1 is 1.96 of them
    z = standardized(math.exp(0.1), 1.0, math.exp(0.2), 0.95)
    assert z is not None and math.isclose(z, 1.959964, rel_tol=1e-5)
    assert standardized(1.0, None, 1.1, 0.95) is None  # no interval, no reading


def test_a_spread_of_one_implies_five_percent_and_two_implies_far_more() -> None:
    assert "spread 1.00x" in calibration([1.0, -1.0] * 10)
    assert "implying 5.0% false winners" in calibration([1.0, -1.0] * 10)
    assert "implying 32.7% false winners" in calibration([2.0, -2.0] * 10)
    assert calibration([1.0]) == "too few intervals for a calibration"


def test_simulated_aas_read_close_to_their_true_false_winner_rate() -> None:
    """Identical configs, 5 trials a side: without launch noise the implied rate stays near the
    nominal 5 %; with a launch offset three times the trial noise it reads far higher, as
    counting false winners does."""
    rng = random.Random(7)

    def implied(launch_sd: float) -> float:
        zs = []
        for _ in range(400):
            lb, lv = rng.gauss(0, launch_sd), rng.gauss(0, launch_sd)
            b = [30 * math.exp(lb + rng.gauss(0, 0.01)) for _ in range(5)]
            v = [30 * math.exp(lv + rng.gauss(0, 0.01)) for _ in range(5)]
            r = compare("x", b, v)
            assert r is not None
            z = standardized(r.ratio, r.ci_low, r.ci_high, r.confidence)
            assert z is not None
            zs.append(z)
        return float(calibration(zs).rsplit("implying ", 1)[1].split("%")[0])

    assert implied(0.0) < 6.0
    assert implied(0.03) > 30.0
