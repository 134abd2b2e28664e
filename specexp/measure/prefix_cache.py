"""Prefix-cache hit rate of a measured window, from vLLM's own ``/metrics`` counters.

Multi-turn traffic is where prefix caching pays: each turn resends the conversation so
far. vLLM counts, in tokens, how many prompt tokens it looked up in the cache
(``vllm:prefix_cache_queries_total``) and how many it found (``…_hits_total``); like the
acceptance counters they are cumulative, so the rate of a window is the ratio of the two
deltas around it, summed over engines.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

QUERIES = "vllm:prefix_cache_queries_total"
HITS = "vllm:prefix_cache_hits_total"


@dataclass(frozen=True)
class PrefixCacheCounters:
    queries: float = 0.0
    hits: float = 0.0
    present: bool = False  # the server exposes the counters at all


def parse(text: str) -> PrefixCacheCounters:
    sums = {QUERIES: 0.0, HITS: 0.0}
    present = False
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in sums:
                sums[sample.name] += sample.value
                present = True
    return PrefixCacheCounters(sums[QUERIES], sums[HITS], present)


def hit_rate(before: PrefixCacheCounters, after: PrefixCacheCounters) -> float | None:
    """Share of the window's looked-up prompt tokens found in the cache; None without lookups
    or when the counters went backwards (the server restarted mid-window)."""
    if not (before.present and after.present):
        return None
    queries, hits = after.queries - before.queries, after.hits - before.hits
    if queries <= 0 or hits < 0:
        return None
    return hits / queries
