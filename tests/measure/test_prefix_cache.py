from __future__ import annotations

from specexp.measure.prefix_cache import hit_rate, parse

BEFORE = """
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 1000.0
vllm:prefix_cache_queries_total{engine="1",model_name="m"} 500.0
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 100.0
vllm:prefix_cache_hits_total{engine="1",model_name="m"} 0.0
"""


def test_the_hit_rate_is_the_ratio_of_the_deltas_summed_over_engines() -> None:
    after = BEFORE.replace("} 1000.0", "} 1600.0").replace("} 500.0", "} 900.0").replace("} 100.0", "} 600.0")
    before_c, after_c = parse(BEFORE), parse(after)
    assert (before_c.queries, before_c.hits) == (1500.0, 100.0)
    assert hit_rate(before_c, after_c) == 0.5  # 500 of 1000 new tokens found


def test_no_lookups_no_counters_or_a_restart_give_no_rate() -> None:
    assert hit_rate(parse(BEFORE), parse(BEFORE)) is None
    assert hit_rate(parse(""), parse("")) is None
    restarted = BEFORE.replace("} 1000.0", "} 10.0").replace("} 100.0", "} 1.0")
    assert hit_rate(parse(BEFORE), parse(restarted)) is None
