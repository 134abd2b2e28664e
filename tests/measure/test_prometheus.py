from __future__ import annotations

import pytest

from specexp.measure.prometheus import delta, parse_metrics

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


def test_empty_window_has_no_rates() -> None:
    acc = delta(parse_metrics(BEFORE), parse_metrics(BEFORE))
    assert acc is not None and acc.rate is None and acc.mean_length is None and acc.per_position == ()
