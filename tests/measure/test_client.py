"""The streaming client: how SSE events fold into a record, and the same over real HTTP.

The fold tests give every event an explicit arrival time, so their timing assertions are
exact. The HTTP tests use a real local server that waits until the client has read each
event before it sleeps and sends the next (it watches the client's arrival clock), so
every bound they check follows from causality, not from how busy the machine is.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from specexp.measure import client as client_module
from specexp.measure.client import _Stream, chat_payload, session, stream_chat
from specexp.record.results import RequestRecord


def sse(obj: object) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def delta(finish: str | None = None, **fields: Any) -> bytes:
    return sse({"choices": [{"index": 0, "delta": fields, "finish_reason": finish}]})


def content(text: str) -> bytes:
    return delta(content=text)


ROLE = delta(role="assistant", content="")  # vLLM's first chunk
FINISH = delta("stop")  # the last step's chunk when its only token is EOS: no text
USAGE = sse({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 9}})
DONE = b"data: [DONE]\n\n"


def fold(events: list[tuple[float, bytes]], sent: float = 0.0) -> RequestRecord:
    """Feed events with explicit arrival times, as stream_chat does after each read."""
    st = _Stream(RequestRecord(index=0, start_s=0.0))
    st.sent = sent
    for now, raw in events:
        for line in raw.split(b"\n"):
            if line.startswith(b"data:"):
                st.event(line[5:].strip(), now)
    st.finish()
    return st.rec


def test_the_window_runs_from_the_first_to_the_last_chunk_carrying_choices() -> None:
    rec = fold(
        [
            (0.050, ROLE),
            (0.050, content("Hel")),
            (0.070, content("lo")),
            (0.100, content(" world")),
            (0.130, FINISH),  # the step that produced EOS: part of the decode window
            (0.170, USAGE),  # not a token
            (0.170, DONE),
        ]
    )
    assert rec.ok and rec.text == "Hello world" and rec.finish_reason == "stop"
    assert rec.output_tokens == 9 and rec.prompt_tokens == 7 and rec.chunks == 3
    assert rec.ttft_s == pytest.approx(0.050)
    assert rec.latency_s == pytest.approx(0.130)  # ends at the finish chunk, not at the usage
    assert rec.itl_s == pytest.approx([0.0, 0.020, 0.030, 0.030])
    assert rec.latency_s is not None and rec.ttft_s is not None
    assert rec.latency_s - rec.ttft_s == pytest.approx(sum(rec.itl_s))


def test_reasoning_deltas_are_tokens_and_are_kept_apart_from_the_answer() -> None:
    usage = sse(
        {
            "choices": [],
            "usage": {
                "prompt_tokens": 5,
                "completion_tokens": 12,
                "completion_tokens_details": {"reasoning_tokens": 8},
            },
        }
    )
    rec = fold(
        [
            (0.040, ROLE),
            (0.040, delta(reasoning="Let me")),  # vLLM >= 0.16
            (0.060, delta(reasoning=" think.")),
            (0.080, delta(reasoning_content=" Twelve.")),  # the older name
            (0.100, content("12")),
            (0.120, delta("stop", content=".")),
            (0.150, usage),
        ]
    )
    assert rec.ok and rec.text == "12." and rec.reasoning_text == "Let me think. Twelve."
    assert rec.ttft_s == pytest.approx(0.040)  # the first thinking token, not the first answer token
    assert rec.latency_s == pytest.approx(0.120)
    assert len(rec.itl_s) == 5 and rec.chunks == 2 and rec.reasoning_chunks == 3
    assert rec.reasoning_tokens == 8 and rec.reasoning_tokens_source == "usage" and rec.answer_tokens == 4


def test_an_answer_that_is_all_reasoning_is_not_a_failure() -> None:
    usage = sse({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 6}})
    rec = fold(
        [
            (0.05, ROLE),
            (0.06, delta(reasoning="hmm hmm")),
            (0.08, delta("length", reasoning=" ok")),
            (0.1, usage),
        ]
    )
    assert rec.ok and rec.text == "" and rec.reasoning_text == "hmm hmm ok"
    # no split from the server: estimated by characters, and marked as an estimate
    assert rec.reasoning_tokens == 6 and rec.reasoning_tokens_source == "estimate"


def test_a_split_that_contradicts_the_text_is_replaced_by_an_estimate() -> None:
    # a text-tag parser (olmo3 on SmolLM2, measured) streams reasoning but counts 0 reasoning tokens
    usage = sse(
        {
            "choices": [],
            "usage": {"completion_tokens": 10, "completion_tokens_details": {"reasoning_tokens": 0}},
        }
    )
    rec = fold([(0.05, delta(reasoning="abcdefgh")), (0.06, delta("stop", content="ab")), (0.07, usage)])
    assert rec.reasoning_tokens == 8 and rec.reasoning_tokens_source == "estimate"


def test_tool_call_deltas_are_tokens() -> None:
    call = {"index": 0, "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    rec = fold([(0.05, ROLE), (0.07, delta(tool_calls=[call])), (0.09, delta("tool_calls")), (0.1, USAGE)])
    assert rec.ok and rec.tool_call_chunks == 1 and rec.finish_reason == "tool_calls"
    assert rec.latency_s == pytest.approx(0.09)


def test_a_stream_that_generates_nothing_is_a_failure() -> None:
    rec = fold([(0.05, ROLE), (0.06, FINISH), (0.07, USAGE), (0.07, DONE)])
    assert not rec.ok and "without any generated text" in (rec.error or "")


# -- over real HTTP -------------------------------------------------------------------------


@dataclass
class Lockstep:
    """The client's arrival stamps, and a way for the server to wait until the next one."""

    stamps: list[float] = field(default_factory=list)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def clock(self, real: Callable[[], float]) -> Callable[[], float]:
        def now() -> float:
            t = real()
            self.stamps.append(t)
            self.changed.set()
            return t

        return now

    async def read_beyond(self, count: int) -> None:
        while len(self.stamps) <= count:
            self.changed.clear()
            await asyncio.wait_for(self.changed.wait(), timeout=30)


def run(
    monkeypatch: pytest.MonkeyPatch,
    events: list[tuple[float, bytes]],
    status: int = 200,
    payload: dict[str, Any] | None = None,
) -> tuple[RequestRecord, Lockstep, list[float]]:
    """Serve the events from a real local HTTP server: before each, a real sleep of its delay,
    started only once the client has read the previous event. Returns the record, the
    client's arrival stamps and the server's write times (the same monotonic clock)."""
    lock = Lockstep()
    monkeypatch.setattr(client_module, "arrival", lock.clock(time.perf_counter))
    written: list[float] = []

    async def handler(request: web.Request) -> web.StreamResponse:
        await request.read()
        if status != 200:
            return web.Response(status=status, body=b"".join(c for _, c in events))
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        for delay, chunk in events:
            await asyncio.sleep(delay)
            seen = len(lock.stamps)
            written.append(time.perf_counter())
            await resp.write(chunk)
            await lock.read_beyond(seen)
        with contextlib.suppress(ConnectionError):  # the client may close first, after [DONE]
            await resp.write_eof()
        return resp

    async def go() -> RequestRecord:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", handler)
        async with TestServer(app) as server, session(10) as client:
            body = payload or chat_payload(
                "m", [{"role": "user", "content": "hi"}], max_tokens=8, temperature=0, seed=0
            )
            return await stream_chat(
                client,
                str(server.make_url("/v1/chat/completions")),
                body,
                index=0,
                t0=time.perf_counter(),
                timeout_s=10,
            )

    return asyncio.run(go()), lock, written


def test_timing_over_http_follows_the_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    rec, lock, written = run(
        monkeypatch,
        [
            (0.05, b": ping\n\n"),
            (0.0, ROLE),
            (0.0, content("Hel")),
            (0.02, content("lo")),
            (0.03, content(" world")),
            (0.01, FINISH),
            (0.04, USAGE),
            (0.0, DONE),
        ],
    )
    assert rec.ok and rec.text == "Hello world" and rec.output_tokens == 9 and rec.chunks == 3
    # one read per event: the stamps of the role, three content and the finish chunks
    role, *_, finish = lock.stamps[1:6]
    assert rec.ttft_s is not None and rec.latency_s is not None
    assert rec.latency_s - rec.ttft_s == pytest.approx(finish - role, abs=1e-9)
    assert rec.itl_s == pytest.approx(
        [b - a for a, b in zip(lock.stamps[1:5], lock.stamps[2:6], strict=True)]
    )
    assert rec.ttft_s >= 0.05  # the server slept 50 ms after reading the request
    assert rec.itl_s[1] >= 0.02 and rec.itl_s[2] >= 0.03 and rec.itl_s[3] >= 0.01  # at least the sleeps
    usage_written = written[6]
    assert finish < usage_written  # the window closed before the usage was even sent


def test_reasoning_stream_over_http(monkeypatch: pytest.MonkeyPatch) -> None:
    usage = sse(
        {
            "choices": [],
            "usage": {"completion_tokens": 4, "completion_tokens_details": {"reasoning_tokens": 3}},
        }
    )
    rec, _, _ = run(
        monkeypatch,
        [
            (0.0, ROLE),
            (0.0, delta(reasoning="a")),
            (0.0, delta(reasoning="b")),
            (0.0, delta("stop", reasoning="c")),
            (0.0, usage),
        ],
    )
    assert rec.ok and rec.reasoning_text == "abc" and rec.text == "" and rec.reasoning_tokens == 3


def test_error_event_inside_a_200_stream_is_a_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    rec, _, _ = run(
        monkeypatch, [(0.0, content("a")), (0.0, sse({"error": {"message": "engine died", "code": 500}}))]
    )
    assert not rec.ok and "engine died" in (rec.error or "")


def test_stream_without_content_is_a_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    rec, _, _ = run(monkeypatch, [(0.0, USAGE), (0.0, DONE)])
    assert not rec.ok and "without any generated text" in (rec.error or "")


def test_http_error_status_is_recorded(monkeypatch: pytest.MonkeyPatch) -> None:
    rec, _, _ = run(monkeypatch, [(0.0, b'{"error": "bad request"}')], status=400)
    assert not rec.ok and rec.error is not None and rec.error.startswith("HTTP 400")


def test_connection_failure_is_data_not_an_exception() -> None:
    async def go() -> RequestRecord:
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


def test_a_request_with_a_due_time_is_set_up_before_it_and_sent_at_it() -> None:
    """A raw server records when the client connected, when the request's first byte came
    and when its body was complete: connecting happens ahead, not a byte goes out early."""
    seen: dict[str, Any] = {}

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen["connected"] = time.perf_counter()
        first = await reader.read(1)
        seen["first_byte"] = time.perf_counter()
        head = first + await reader.readuntil(b"\r\n\r\n")
        length = next(
            int(line.split(b":")[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length")
        )
        seen["body"] = json.loads(await reader.readexactly(length))["messages"][0]["content"]
        stream = ROLE + content("ok") + FINISH + USAGE + DONE
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n"
            + f"content-length: {len(stream)}\r\n\r\n".encode()
            + stream
        )
        await writer.drain()
        writer.close()

    async def go() -> tuple[float, float, RequestRecord]:
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server, session(10) as client:
            payload = chat_payload(
                "m", [{"role": "user", "content": "due"}], max_tokens=4, temperature=0, seed=0
            )
            t0 = time.perf_counter()
            due = t0 + 1.0
            rec = await stream_chat(
                client,
                f"http://127.0.0.1:{port}/v1/chat/completions",
                payload,
                index=0,
                t0=t0,
                timeout_s=10,
                due=due,
            )
            return t0, due, rec

    t0, due, rec = asyncio.run(go())
    assert rec.ok and rec.text == "ok" and seen["body"] == "due"
    assert seen["connected"] < due <= seen["first_byte"]  # set up ahead; headers held with the body
    assert rec.start_s == pytest.approx(due - t0)  # the record starts when it was due
    assert rec.send_delay_s >= 0 and t0 + rec.start_s + rec.send_delay_s <= seen["first_byte"]
