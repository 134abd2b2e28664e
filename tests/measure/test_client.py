from __future__ import annotations

import asyncio
import json
import time

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from specexp.measure.client import chat_payload, session, stream_chat


def sse(obj: object) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def content(text: str) -> bytes:
    return sse({"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]})


USAGE = sse({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 9}})


def run(events: list[tuple[float, bytes]], status: int = 200):  # type: ignore[no-untyped-def]
    """Serve the events from a real local HTTP server, with real sleeps between them."""

    async def handler(request: web.Request) -> web.StreamResponse:
        await request.read()
        if status != 200:
            return web.Response(status=status, body=b"".join(c for _, c in events))
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        for delay, chunk in events:
            await asyncio.sleep(delay)
            await resp.write(chunk)
        await resp.write_eof()
        return resp

    async def go():  # type: ignore[no-untyped-def]
        app = web.Application()
        app.router.add_post("/v1/chat/completions", handler)
        async with TestServer(app) as server, session(10) as client:
            payload = chat_payload(
                "m", [{"role": "user", "content": "hi"}], max_tokens=8, temperature=0, seed=0
            )
            return await stream_chat(
                client,
                str(server.make_url("/v1/chat/completions")),
                payload,
                index=0,
                t0=time.perf_counter(),
                timeout_s=10,
            )

    return asyncio.run(go())


def test_timing_invariant_and_usage_tokens() -> None:
    rec = run(
        [
            (0.05, b": ping\n\n"),
            (0.0, content("Hel")),
            (0.02, content("lo")),
            (0.03, content(" world")),
            (0.0, sse({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})),
            (0.04, USAGE),  # after the last token: must not extend latency
            (0.0, b"data: [DONE]\n\n"),
        ]
    )
    assert rec.ok and rec.text == "Hello world" and rec.finish_reason == "stop"
    assert rec.output_tokens == 9 and rec.prompt_tokens == 7 and rec.chunks == 3
    assert rec.ttft_s is not None and rec.ttft_s >= 0.045
    assert rec.latency_s is not None
    assert rec.latency_s - rec.ttft_s == pytest.approx(sum(rec.itl_s), abs=1e-9)
    assert len(rec.itl_s) == 2 and rec.itl_s[1] >= 0.025
    assert rec.latency_s < 0.05 + 0.05 + 0.035  # the usage chunk's 40 ms are not in it


def test_error_event_inside_a_200_stream_is_a_failure() -> None:
    rec = run([(0.0, content("a")), (0.0, sse({"error": {"message": "engine died", "code": 500}}))])
    assert not rec.ok and "engine died" in (rec.error or "")


def test_stream_without_content_is_a_failure() -> None:
    rec = run([(0.0, USAGE), (0.0, b"data: [DONE]\n\n")])
    assert not rec.ok and "without any content" in (rec.error or "")


def test_http_error_status_is_recorded() -> None:
    rec = run([(0.0, b'{"error": "bad request"}')], status=400)
    assert not rec.ok and rec.error is not None and rec.error.startswith("HTTP 400")


def test_connection_failure_is_data_not_an_exception() -> None:
    async def go():  # type: ignore[no-untyped-def]
        async with session(2) as client:
            return await stream_chat(
                client,
                "http://127.0.0.1:9/v1/chat/completions",
                {},
                index=3,
                t0=time.perf_counter(),
                timeout_s=2,
            )

    rec = asyncio.run(go())
    assert not rec.ok and rec.index == 3 and "ClientConnectorError" in (rec.error or "")
