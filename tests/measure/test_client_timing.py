"""The client's timing against a server whose send times are known (tests/fakes/scripted_sse.py).

Two kinds of check. Causality holds on any machine, however loaded: a token cannot
arrive before the server sent it (one monotonic clock for both processes). Accuracy
is a median over every TTFT and gap, with a bound (8 ms) that a busy 2-core machine
meets but that timing the wrong chunk cannot: the scripted gaps are 20 and 40 ms, so
stamping a token on its neighbour's chunk is off by at least 20 ms, most of the time.
benchmarks/client_fidelity.py measures the real figures (well under a millisecond).
"""

from __future__ import annotations

import asyncio
import itertools
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from specexp.measure.client import chat_payload, session, stream_chat
from specexp.record.results import RequestRecord
from tests.fakes.scripted_sse import parse_stamps
from tests.helpers import scripted_sse

ROOT = Path(__file__).resolve().parents[2]
TTFT_MS, GAPS_MS = 30, (20, 40)
TOKENS = 10


@pytest.fixture(scope="module")
def scripted_server() -> Iterator[str]:
    with scripted_sse(str(TTFT_MS), ",".join(map(str, GAPS_MS))) as url:
        yield url


def _stream(base: str, n: int, extra: dict[str, Any]) -> tuple[float, list[RequestRecord]]:
    async def go() -> tuple[float, list[RequestRecord]]:
        async with session(30) as client:
            payload = chat_payload(
                "m", [{"role": "user", "content": "x"}], max_tokens=TOKENS, temperature=0, seed=0
            )
            payload.update(extra)
            t0 = time.perf_counter()
            recs = await asyncio.gather(
                *(
                    stream_chat(client, f"{base}/v1/chat/completions", payload, index=i, t0=t0, timeout_s=30)
                    for i in range(n)
                )
            )
            return t0, list(recs)

    return asyncio.run(go())


@pytest.mark.parametrize("reasoning", [0, 4], ids=["answer", "reasoning-then-answer"])
def test_ttft_and_gaps_match_the_servers_send_times(scripted_server: str, reasoning: int) -> None:
    t0, records = _stream(scripted_server, 4, {"x_reasoning_tokens": reasoning})
    errors_ms: list[float] = []
    for rec in records:
        assert rec.ok and rec.output_tokens == TOKENS
        assert (rec.reasoning_chunks, rec.chunks) == (reasoning, TOKENS - reasoning)
        assert rec.reasoning_tokens == reasoning and rec.reasoning_tokens_source == "usage"
        assert rec.ttft_s is not None and rec.latency_s is not None
        assert rec.latency_s - rec.ttft_s == pytest.approx(sum(rec.itl_s))
        assert rec.send_delay_s > 0  # the trace hook fired (the fallback would give exactly 0)
        stamps = parse_stamps(rec.reasoning_text + rec.text)
        assert stamps is not None
        recv, sends = stamps
        # role chunk (TTFT) and first token, the other tokens, the finish chunk: one gap each
        assert len(rec.itl_s) == TOKENS + 1
        first = t0 + rec.start_s + rec.send_delay_s + rec.ttft_s
        arrivals = list(itertools.accumulate(rec.itl_s[1:TOKENS], initial=first + rec.itl_s[0]))
        for arrived, sent in zip(arrivals, sends, strict=True):
            assert arrived >= sent / 1e9 - 1e-6  # never before the server sent it
        true_ttft = (sends[0] - recv) / 1e9
        assert true_ttft >= TTFT_MS / 1000 - 1e-3
        errors_ms.append(abs(rec.ttft_s - true_ttft) * 1000)
        true_gaps = [(b - a) / 1e9 for a, b in itertools.pairwise(sends)]
        errors_ms += [abs(m - t) * 1000 for m, t in zip(rec.itl_s[1:TOKENS], true_gaps, strict=True)]
    assert statistics.median(errors_ms) < 8.0
