"""Pure statistics over trials: summaries, outliers and verdicts against the baseline.

One trial lies (seed 000: a "3.1 tok/s regression" was noise; five trials said 6.7 with
a range of 6.4-10.2), so every figure is a median with its range, MAD and CV; a trial far
from the others is flagged (robust z on the MAD, Iglewicz-Hoaglin) and shown, never dropped.
"""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Iterable, Sequence
from typing import Literal

from specexp.measure.prometheus import ServerWindow
from specexp.record.results import CaseResult, RequestRecord, Summary, VariantResult, Verdict

OUTLIER_Z = 3.5  # Iglewicz & Hoaglin's cut for the modified z-score
OUTLIER_MIN_REL = 0.05  # and at least 5 % from the median: two near-equal trials make MAD tiny
SERVER_GAP_LIMIT = 0.05  # client and server decode speed may differ by this much before it is flagged


def mad(values: Sequence[float]) -> float:
    med = statistics.median(values)
    return statistics.median(abs(v - med) for v in values)


def outlier_indices(
    values: Sequence[float], threshold: float = OUTLIER_Z, min_rel: float = OUTLIER_MIN_REL
) -> list[int]:
    """Indices whose modified z-score exceeds ``threshold`` and that lie at least ``min_rel``
    (relative) from the median (needs at least 3 values).

    z = 0.6745 (x - median) / MAD; when MAD is 0 (most values equal) the mean absolute
    deviation stands in (z = (x - median) / (1.253314 MeanAD)).
    """
    if len(values) < 3:
        return []
    med = statistics.median(values)
    m = mad(values)
    if m > 0:
        scores = [0.6745 * (v - med) / m for v in values]
    else:
        mean_ad = statistics.fmean(abs(v - med) for v in values)
        if mean_ad == 0:
            return []
        scores = [(v - med) / (1.253314 * mean_ad) for v in values]
    far = [abs(v - med) > min_rel * abs(med) for v in values]
    return [i for i, z in enumerate(scores) if abs(z) > threshold and far[i]]


def summarize(values: Iterable[float]) -> Summary | None:
    vals = [v for v in values if v is not None]
    if not vals:
        return None
    mean = statistics.fmean(vals)
    cv = statistics.stdev(vals) / mean if len(vals) >= 2 and mean != 0 else None
    return Summary(
        median=statistics.median(vals),
        min=min(vals),
        max=max(vals),
        n=len(vals),
        mad=mad(vals),
        cv=cv,
        outliers=outlier_indices(vals),
    )


@functools.cache
def _rank_sum_counts(n: int, m: int) -> tuple[int, ...]:
    """How many orderings of n baseline and m variant trials give each Mann-Whitney U."""
    if n == 0 or m == 0:
        return (1,)
    out = [0] * (n * m + 1)
    for u, c in enumerate(_rank_sum_counts(n - 1, m)):
        out[u + m] += c
    for u, c in enumerate(_rank_sum_counts(n, m - 1)):
        out[u] += c
    return tuple(out)


def _trim(n: int, m: int, confidence: float) -> int:
    """Rank k of the interval's ends among the n·m sorted pairwise differences: the
    interval is D(k) … D(nm+1-k) (1-based), the narrowest whose coverage
    1 - 2·P(U <= k-1) is at least ``confidence``; 0 when no interval reaches it.

    D(k) lies above the true shift exactly when at most k-1 differences fall below it,
    which has the null probability P(U <= k-1); so k is one more than the largest d with
    P(U <= d) <= (1 - confidence)/2 (R's ``wilcox.test`` takes the same D(q), q =
    qwilcox(α/2, n, m)). Past 25 x 25 trials the exact table gets large and the normal
    approximation with continuity correction gives the same k."""
    if n * m > 625:
        z = statistics.NormalDist().inv_cdf(1 - (1 - confidence) / 2)
        return max(0, math.floor(n * m / 2 - z * math.sqrt(n * m * (n + m + 1) / 12) + 0.5))
    counts = _rank_sum_counts(n, m)
    total, acc, k = sum(counts), 0, 0
    for c in counts:
        if (acc + c) / total > (1 - confidence) / 2 + 1e-12:  # 1/20 is exactly 5 %: keep it
            break
        acc += c
        k += 1
    return k


def min_trials(confidence: float = 0.95) -> int:
    """Fewest trials per side (equal sides) for which a verdict is possible at all."""
    n = 2
    while _trim(n, n, confidence) == 0:
        n += 1
    return n


def compare(
    metric: str,
    baseline: Sequence[float],
    variant: Sequence[float],
    *,
    higher_is_better: bool = True,
    confidence: float = 0.95,
) -> Verdict | None:
    """Ratio variant/baseline with an exact distribution-free interval, and what it says.

    The estimate is the Hodges-Lehmann shift of the log values (the median of all pairwise
    log ratios); the interval is the matching Mann-Whitney one, exact for any n, so it
    does not lean on normality and one outlier trial cannot drag it (a percentile
    bootstrap of five medians could: it picks the outlier as the median 6 % of the
    time). "better"/"worse" only when the whole interval is on one side of 1;
    otherwise "no clear difference", a tie that goes to the simpler config. Three
    trials against three can never reach 95 %: the verdict says so instead of guessing.
    """
    b = [math.log(x) for x in baseline if x > 0]
    v = [math.log(x) for x in variant if x > 0]
    if not b or not v or len(b) != len(baseline) or len(v) != len(variant):
        return None
    diffs = sorted(y - x for x in b for y in v)
    k = _trim(len(b), len(v), confidence)
    ratio = math.exp(statistics.median(diffs))
    lo = math.exp(diffs[k - 1]) if k else None  # D(k), 1-based
    hi = math.exp(diffs[-k]) if k else None  # D(nm+1-k)
    verdict: Literal["better", "worse", "no clear difference"] = "no clear difference"
    if lo is not None and lo > 1:
        verdict = "better" if higher_is_better else "worse"
    elif hi is not None and hi < 1:
        verdict = "worse" if higher_is_better else "better"
    return Verdict(
        metric=metric,
        ratio=ratio,
        ci_low=lo,
        ci_high=hi,
        verdict=verdict,
        confidence=confidence,
        n_baseline=len(b),
        n_variant=len(v),
    )


def look_confidence(trials: int, max_trials: int, confidence: float = 0.95) -> float:
    """Per-look confidence when trials are added in batches of ``trials`` up to ``max_trials``.

    Looking again after every batch and stopping at the first clear answer would, at a
    plain 95 % per look, name a false winner far more often than 5 % of the time; a
    Bonferroni split over the planned looks keeps the overall rate at or under 5 %.
    """
    looks = 1 + max(0, -(-(max_trials - trials) // trials)) if max_trials > trials else 1
    return 1 - (1 - confidence) / looks


def jain_index(values: Sequence[float]) -> float:
    """Jain's fairness index (Σx)² / (n·Σx²): 1 when all streams get the same, 1/n when one gets all."""
    total, squares = sum(values), sum(v * v for v in values)
    return total * total / (len(values) * squares) if squares > 0 else 1.0


def trial_metrics(records: Sequence[RequestRecord], duration_s: float, concurrency: int) -> dict[str, float]:
    """Figures of one measured window; failed requests are counted, not averaged in."""
    ok = [r for r in records if r.ok]
    out: dict[str, float] = {"failed_requests": float(len(records) - len(ok))}
    if not ok or duration_s <= 0:
        return out
    tokens = sum(r.output_tokens for r in ok)
    out["output_tokens"] = float(tokens)
    out["output_tok_s"] = tokens / duration_s
    out["looping_outputs"] = float(sum(1 for r in ok if r.looping))
    ttfts = [r.ttft_s for r in ok if r.ttft_s is not None]
    if ttfts:
        out["ttft_ms"] = statistics.median(ttfts) * 1000
        if concurrency > 1 and len(ttfts) > 1:
            # fairness: TTFT is timed from each request's own start (after any client-side
            # queueing for a concurrency slot), so the spread is the server's, not the client's
            out["ttft_spread_ms"] = (max(ttfts) - min(ttfts)) * 1000
            out["ttft_max_ms"] = max(ttfts) * 1000
    if concurrency > 1:
        per_stream = [r.output_tokens / r.latency_s for r in ok if r.latency_s and r.output_tokens > 0]
        if len(per_stream) > 1:
            out["jain_index"] = jain_index(per_stream)
    decode = [
        (r.output_tokens - 1) / (r.latency_s - r.ttft_s)
        for r in ok
        if r.latency_s is not None and r.ttft_s is not None and r.latency_s > r.ttft_s and r.output_tokens > 1
    ]
    if decode:
        out["decode_tok_s"] = statistics.median(decode)
    reasoning = [r.reasoning_tokens for r in ok if r.reasoning_tokens is not None]
    if reasoning:
        out["reasoning_tokens"] = float(sum(reasoning))
    return out


def server_metrics(records: Sequence[RequestRecord], window: ServerWindow | None) -> dict[str, float]:
    """The server's own decode speed over the window, and how far the client's is from it.

    Both sides are totals over the window's requests, Σ(tokens − 1) / Σ decode time: the
    server's from its histograms (first to last token of each request), the client's from
    its windows (first to last chunk carrying choices). Compared only when every request
    of the window, and nothing else, finished inside it: otherwise the totals are not of
    the same requests.
    """
    ok = [r for r in records if r.ok and r.ttft_s is not None and r.latency_s is not None]
    if window is None or window.requests != len(ok) or not ok:
        return {}
    out: dict[str, float] = {}
    server = window.decode_tok_s
    if server is not None:
        out["server_decode_tok_s"] = server
    if window.inverse_mean_tpot is not None:
        out["server_inv_tpot_tok_s"] = window.inverse_mean_tpot
    client_s = sum(r.latency_s - r.ttft_s for r in ok if r.latency_s is not None and r.ttft_s is not None)
    client_tokens = sum(max(r.output_tokens - 1, 0) for r in ok)
    if server and client_s > 0:
        out["client_server_gap"] = client_tokens / client_s / server - 1
    return out


def primary_metric(case: CaseResult) -> str:
    """The figure a case is about: decode speed for one stream, aggregate output for several
    (unless the case names its own, as an open-loop case does)."""
    if case.primary_metric:
        return case.primary_metric
    return "decode_tok_s" if case.concurrency == 1 else "output_tok_s"


def attach_verdicts(
    result: VariantResult, baseline: VariantResult | None, confidence: float = 0.95, trust_loops: bool = False
) -> None:
    """Set each case's verdict against the same case of the baseline (trial values, not medians)."""
    if baseline is None:
        return
    for name, case in result.cases.items():
        base = baseline.cases.get(name)
        if base is not None:
            case.verdict = case_verdict(case, base, confidence, trust_loops)


def case_verdict(
    case: CaseResult, base: CaseResult, confidence: float = 0.95, trust_loops: bool = False
) -> Verdict | None:
    """A case's main figure against the same case of the baseline, trial by trial.

    Failed trials (windows that are not measurements) take no part. When the outputs of
    either side loop, prompt lookup "accepts" the repetition and the speed-up is not
    real, so no winner is named ("not trusted"), whatever the interval says;
    ``trust_loops`` (``bench.trust_loops``) is for workloads that loop on purpose.
    """
    verdict = metric_verdict(case, base, primary_metric(case), confidence)
    if verdict is not None and not trust_loops and (case.looping_outputs or base.looping_outputs):
        verdict.verdict = "not trusted"
        verdict.reason = (
            f"outputs loop ({case.looping_outputs} here, {base.looping_outputs} at the baseline): "
            "speed and acceptance are inflated"
        )
    return verdict


def metric_verdict(
    case: CaseResult, base: CaseResult, metric: str, confidence: float = 0.95, higher_is_better: bool = True
) -> Verdict | None:
    """Any per-trial figure of a case against the baseline's, over the trials that are
    measurements: the Hodges-Lehmann ratio and its interval, as the table shows them (the
    ratio to log as ``<case>.<metric>.vs_baseline``, not a ratio of medians, which can
    fall outside its own interval)."""
    b = [t.metrics[metric] for t in base.trials if t.ok and metric in t.metrics]
    v = [t.metrics[metric] for t in case.trials if t.ok and metric in t.metrics]
    return compare(metric, b, v, higher_is_better=higher_is_better, confidence=confidence)
