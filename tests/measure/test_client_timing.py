"""The client's timing against a server whose send times are known (tests/fakes/scripted_sse.py)."""

from __future__ import annotations

import asyncio
import itertools
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from specexp.launch.plan import free_port
from specexp.measure.client import chat_payload, session, stream_chat
from specexp.record.results import RequestRecord
from tests.fakes.scripted_sse import parse_stamps

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def scripted_server() -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.fakes.scripted_sse", str(port), "30", "5,10"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().startswith("READY")
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _stream(base: str, n: int, tokens: int) -> list[RequestRecord]:
    async def go() -> list[RequestRecord]:
        async with session(30) as client:
            payload = chat_payload(
                "m", [{"role": "user", "content": "x"}], max_tokens=tokens, temperature=0, seed=0
            )
            t0 = time.perf_counter()
            return list(
                await asyncio.gather(
                    *(
                        stream_chat(
                            client, f"{base}/v1/chat/completions", payload, index=i, t0=t0, timeout_s=30
                        )
                        for i in range(n)
                    )
                )
            )

    return asyncio.run(go())


def test_ttft_and_gaps_match_the_servers_send_times(scripted_server: str) -> None:
    records = _stream(scripted_server, 4, 20)
    errors_ms: list[float] = []
    for rec in records:
        assert rec.ok and rec.output_tokens == 20 and rec.chunks == 20
        assert rec.ttft_s is not None and rec.latency_s is not None
        assert rec.latency_s - rec.ttft_s == pytest.approx(sum(rec.itl_s))
        assert rec.send_delay_s > 0  # the trace hook fired (the fallback would give exactly 0)
        stamps = parse_stamps(rec.text)
        assert stamps is not None
        recv, sends = stamps
        true_ttft = (sends[0] - recv) / 1e9
        assert true_ttft >= 0.029  # the script's 30 ms
        errors_ms.append(abs(rec.ttft_s - true_ttft) * 1000)
        true_gaps = [(b - a) / 1e9 for a, b in itertools.pairwise(sends)]
        errors_ms += [abs(m - t) * 1000 for m, t in zip(rec.itl_s, true_gaps, strict=True)]
    # generous bounds for a busy CI machine; benchmarks/client_fidelity.py measures the real figures
    assert statistics.median(errors_ms) < 2.0
    assert max(errors_ms) < 50.0
