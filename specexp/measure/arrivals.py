"""Open-loop arrival schedules: when each conversation of a window is due, in seconds from
the window's start.

A fixed number of streams (closed loop) never lets requests pile up: a slow server just
gets fewer requests. Production traffic arrives whether or not the server is done, and
seed 000's fairness problem appeared only when long prompts arrived while others were
decoding, so a case can instead set a request rate. Gaps follow vLLM's ``vllm bench
serve`` exactly: gamma-distributed with shape ``burstiness`` and mean ``1/rate`` (1 is a
Poisson process; below 1 burstier, above 1 more even; ``inf`` a constant gap), then scaled
so the last request is due at ``n/rate``, so every seed offers the same load. Or a trace's
own timestamps are replayed, shifted to start at zero.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Sequence


def rate_offsets(n: int, rate: float, burstiness: float, rng: random.Random) -> list[float]:
    """Due times of ``n`` requests at ``rate`` per second with gamma(``burstiness``) gaps."""
    if n < 1:
        return []
    if not (rate > 0 and burstiness > 0):
        raise ValueError(f"rate={rate} and burstiness={burstiness} must be > 0")
    if math.isinf(rate):
        return [0.0] * n
    if math.isinf(burstiness):
        gaps = [1.0 / rate] * n
    else:
        scale = 1.0 / (rate * burstiness)
        gaps = [rng.gammavariate(burstiness, scale) for _ in range(n)]
    due = list(itertools.accumulate(gaps))
    # the sum of n draws misses n/rate by a few percent; scaled, every seed offers the same load
    factor = (n / rate) / due[-1] if due[-1] > 0 else 1.0
    return [d * factor for d in due]


def trace_offsets(timestamps: Sequence[float | None]) -> list[float]:
    """A trace's timestamps shifted so the earliest is zero (a missing one counts as zero)."""
    known = [t for t in timestamps if t is not None]
    start = min(known) if known else 0.0
    return [(t - start) if t is not None else 0.0 for t in timestamps]


def window_rng(seed: int, case: str, trial: int) -> random.Random:
    """The schedule's generator: the same for every variant in trial ``trial`` (paired
    comparisons see the same bursts), different between trials (the figure covers the
    arrival process, not one draw of it)."""
    return random.Random(f"{seed}/{case}/{trial}")
