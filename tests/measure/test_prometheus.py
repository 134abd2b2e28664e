from __future__ import annotations

import pytest

from specexp.measure.prometheus import delta, parse_metrics, reset_reason, server_window

# The exposition format vLLM 0.32 (CPU) serves, trimmed; two engines to check summing.
BEFORE = """# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 10.0
vllm:spec_decode_num_drafts_total{engine="1",model_name="m"} 10.0
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 60.0
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 30.0
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 15.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 10.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="2"} 5.0
vllm:spec_decode_num_accepted_tokens_per_pos_created{engine="0",model_name="m",position="0"} 1.79e+09
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="m"} 500.0
"""


def bump(text: str, **new: float) -> str:
    out = text
    for key, value in new.items():
        name, _, label = key.partition("__")
        lines = []
        for ln in out.splitlines():
            if (
                ln.startswith(f"vllm:{name}{{")
                and 'engine="0"' in ln
                and (not label or f'position="{label}"' in ln)
            ):
                ln = ln.rsplit(" ", 1)[0] + f" {value}"
            lines.append(ln)
        out = "\n".join(lines) + "\n"
    return out


def test_parse_sums_engines_and_keeps_positions() -> None:
    snap = parse_metrics(BEFORE)
    assert snap.has_spec and snap.drafts == 20 and snap.draft_tokens == 60 and snap.accepted == 30
    assert snap.accepted_per_pos == {0: 15, 1: 10, 2: 5}
    assert snap.generation_tokens == 500


def test_delta_matches_vllm_bench_definitions() -> None:
    after = bump(
        BEFORE,
        spec_decode_num_drafts_total=30.0,  # +20 drafts
        spec_decode_num_draft_tokens_total=120.0,  # +60 draft tokens
        spec_decode_num_accepted_tokens_total=75.0,  # +45 accepted
        spec_decode_num_accepted_tokens_per_pos_total__0=33.0,
        spec_decode_num_accepted_tokens_per_pos_total__1=25.0,
        spec_decode_num_accepted_tokens_per_pos_total__2=17.0,
    )
    acc = delta(parse_metrics(BEFORE), parse_metrics(after))
    assert acc is not None
    assert (acc.drafts, acc.draft_tokens, acc.accepted) == (20, 60, 45)
    assert acc.rate == pytest.approx(0.75)
    assert acc.mean_length == pytest.approx(1 + 45 / 20)
    assert acc.per_position == pytest.approx((18 / 20, 15 / 20, 12 / 20))


def test_no_speculation_gives_none_and_a_restart_is_an_error() -> None:
    plain = '# TYPE vllm:generation_tokens_total counter\nvllm:generation_tokens_total{engine="0"} 5.0\n'
    assert delta(parse_metrics(plain), parse_metrics(plain)) is None
    restarted = bump(BEFORE, spec_decode_num_accepted_tokens_total=1.0)
    with pytest.raises(ValueError, match="restarted"):
        delta(parse_metrics(BEFORE), parse_metrics(restarted))
    assert "went backwards" in (reset_reason(parse_metrics(BEFORE), parse_metrics(restarted)) or "")


# Trimmed from a real vLLM 0.32 CPU server's /metrics (one finished request after `BEFORE_HIST`).
HIST = """# TYPE process_start_time_seconds gauge
process_start_time_seconds {start}
# TYPE vllm:generation_tokens counter
vllm:generation_tokens_total{{engine="0",model_name="m"}} {gen}
# TYPE vllm:generation_tokens_created gauge
vllm:generation_tokens_created{{engine="0",model_name="m"}} {created}
# TYPE vllm:request_decode_time_seconds histogram
vllm:request_decode_time_seconds_count{{engine="0",model_name="m"}} {n}
vllm:request_decode_time_seconds_sum{{engine="0",model_name="m"}} {decode}
vllm:request_decode_time_seconds_created{{engine="0",model_name="m"}} {created}
# TYPE vllm:request_generation_tokens histogram
vllm:request_generation_tokens_count{{engine="0",model_name="m"}} {n}
vllm:request_generation_tokens_sum{{engine="0",model_name="m"}} {gen}
# TYPE vllm:request_time_per_output_token_seconds histogram
vllm:request_time_per_output_token_seconds_count{{engine="0",model_name="m"}} {n}
vllm:request_time_per_output_token_seconds_sum{{engine="0",model_name="m"}} {tpot}
"""


def hist(start: float = 1.796e9, created: float = 1.796e9 + 50, **values: float) -> str:
    return HIST.format(start=start, created=created, **{"gen": 0, "n": 0, "decode": 0, "tpot": 0, **values})


def test_a_server_restart_between_scrapes_is_caught_even_when_counters_regrew() -> None:
    before = parse_metrics(hist(gen=500, n=10, decode=20.0, tpot=0.4))
    # restarted, then served more than before: every difference is positive and wrong
    regrown = parse_metrics(hist(start=1.796e9 + 600, created=1.796e9 + 650, gen=900, n=12, decode=30.0))
    assert "restarted" in (reset_reason(before, regrown) or "")
    # no process collector (another exporter): the *_created samples still tell
    no_start = parse_metrics(hist(created=1.796e9 + 650, gen=900, n=12).replace("process_start", "x_start"))
    assert "recreated" in (
        reset_reason(parse_metrics(hist(gen=500).replace("process_start", "x_start")), no_start) or ""
    )
    same = parse_metrics(hist(gen=600, n=12, decode=25.0, tpot=0.5))
    assert reset_reason(before, same) is None


def test_server_window_is_the_servers_own_decode_speed() -> None:
    before = parse_metrics(hist(gen=500, n=10, decode=20.0, tpot=0.4))
    after = parse_metrics(hist(gen=691, n=13, decode=25.5, tpot=0.49))  # 3 requests, 191 tokens, 5.5 s
    window = server_window(before, after)
    assert window is not None and window.requests == 3
    assert window.decode_tok_s == pytest.approx((191 - 3) / 5.5)
    assert window.inverse_mean_tpot == pytest.approx(3 / 0.09)
    assert server_window(parse_metrics(BEFORE), parse_metrics(BEFORE)) is None  # no histograms: no check


def test_mean_length_must_equal_one_plus_the_per_position_rates() -> None:
    good = bump(
        BEFORE,
        spec_decode_num_drafts_total=30.0,
        spec_decode_num_accepted_tokens_total=75.0,
        spec_decode_num_accepted_tokens_per_pos_total__0=33.0,
        spec_decode_num_accepted_tokens_per_pos_total__1=25.0,
        spec_decode_num_accepted_tokens_per_pos_total__2=17.0,
    )
    acc = delta(parse_metrics(BEFORE), parse_metrics(good))
    assert acc is not None and acc.consistent and acc.inconsistency is None
    # per-position counts off by a data-parallel size of 2 (speculators#1095)
    doubled = bump(
        BEFORE,
        spec_decode_num_drafts_total=30.0,
        spec_decode_num_accepted_tokens_total=75.0,
        spec_decode_num_accepted_tokens_per_pos_total__0=51.0,
        spec_decode_num_accepted_tokens_per_pos_total__1=40.0,
        spec_decode_num_accepted_tokens_per_pos_total__2=29.0,
    )
    acc = delta(parse_metrics(BEFORE), parse_metrics(doubled))
    assert acc is not None and not acc.consistent and "1 + Σ per-position" in (acc.inconsistency or "")
    # a per-position parse that found nothing
    no_pos = "\n".join(ln for ln in good.splitlines() if "per_pos" not in ln) + "\n"
    before = "\n".join(ln for ln in BEFORE.splitlines() if "per_pos" not in ln) + "\n"
    acc = delta(parse_metrics(before), parse_metrics(no_pos))
    assert acc is not None and not acc.consistent and "no per-position" in (acc.inconsistency or "")


def test_empty_window_has_no_rates() -> None:
    acc = delta(parse_metrics(BEFORE), parse_metrics(BEFORE))
    assert acc is not None and acc.rate is None and acc.mean_length is None and acc.per_position == ()
