"""Pure statistics over trials (reused by compare and tune later)."""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence

from specexp.record.results import RequestRecord, Summary


def summarize(values: Iterable[float]) -> Summary | None:
    vals = [v for v in values if v is not None]
    if not vals:
        return None
    return Summary(median=statistics.median(vals), min=min(vals), max=max(vals), n=len(vals))


def trial_metrics(records: Sequence[RequestRecord], duration_s: float, concurrency: int) -> dict[str, float]:
    """Figures of one measured window; failed requests are counted, not averaged in."""
    ok = [r for r in records if r.ok]
    out: dict[str, float] = {"failed_requests": float(len(records) - len(ok))}
    if not ok or duration_s <= 0:
        return out
    tokens = sum(r.output_tokens for r in ok)
    out["output_tokens"] = float(tokens)
    out["output_tok_s"] = tokens / duration_s
    ttfts = [r.ttft_s for r in ok if r.ttft_s is not None]
    if ttfts:
        out["ttft_ms"] = statistics.median(ttfts) * 1000
        if concurrency > 1 and len(ttfts) > 1:
            out["ttft_spread_ms"] = (max(ttfts) - min(ttfts)) * 1000
    decode = [
        (r.output_tokens - 1) / (r.latency_s - r.ttft_s)
        for r in ok
        if r.latency_s is not None and r.ttft_s is not None and r.latency_s > r.ttft_s and r.output_tokens > 1
    ]
    if decode:
        out["decode_tok_s"] = statistics.median(decode)
    return out
