"""The load generator against a local server that records what it received and when.

The server is a fake (aiohttp, in this process): it shows what a real one cannot, the
exact messages of every request and how many were open at once. The replay on real vLLM
is tests/e2e/test_traffic_real_vllm.py.
"""

from __future__ import annotations

import asyncio
import gc
import json
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestServer

from specexp.measure.client import session
from specexp.measure.loadgen import RequestDefaults, Window, build_payload, run_window
from specexp.measure.workload_files import Turn
from specexp.record.results import RequestRecord

DEFAULTS = RequestDefaults(model="served", max_tokens=16, temperature=0.0, seed=7)


def sse(obj: object) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


@dataclass
class Seen:
    body: dict[str, Any]
    received: float  # perf_counter when the body was read
    answered: float = 0.0  # when the last byte went out


@dataclass
class Recorder:
    """Answers each request with 'answer to <last user text>' after ``delay_s``."""

    delay_s: float = 0.0
    fail_on: str | None = None  # a user text answered with HTTP 500
    seen: list[Seen] = field(default_factory=list)
    open_now: int = 0
    most_open: int = 0
    frozen: list[int] = field(default_factory=list)  # gc.get_freeze_count() at each request

    async def handler(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        entry = Seen(body, time.perf_counter())
        self.frozen.append(gc.get_freeze_count())
        self.seen.append(entry)
        self.open_now += 1
        self.most_open = max(self.most_open, self.open_now)
        try:
            last = body["messages"][-1]["content"]
            if last == self.fail_on:
                return web.Response(status=500, text="boom")
            await asyncio.sleep(self.delay_s)
            resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
            await resp.prepare(request)
            await resp.write(sse({"choices": [{"index": 0, "delta": {"content": f"answer to {last}"}}]}))
            await resp.write(sse({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 3}}))
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
            return resp
        finally:
            entry.answered = time.perf_counter()
            self.open_now -= 1


def replay(recorder: Recorder, window: Window) -> list[RequestRecord]:
    async def go() -> list[RequestRecord]:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", recorder.handler)
        async with TestServer(app) as server, session(10) as client:
            url = str(server.make_url("/v1/chat/completions"))
            return await run_window(client, url, window, DEFAULTS, timeout_s=10)

    return asyncio.run(go())


def user(text: str, **labels: Any) -> Turn:
    return Turn(record=0, messages=({"role": "user", "content": text},), **labels)


def test_a_session_replays_as_a_conversation_with_the_live_answers() -> None:
    system = {"role": "system", "content": "Be brief."}
    conv = (
        Turn(record=1, messages=(system, {"role": "user", "content": "q1"}), session="s", slice="todo"),
        user("q2", session="s", slice="todo"),
        # logged with its whole history: the logged answer is replaced by the live one
        Turn(
            record=3,
            messages=(
                {"role": "user", "content": "q1"},
                {"role": "assistant", "content": "a logged answer"},
                {"role": "user", "content": "q3"},
            ),
            session="s",
            slice="todo",
        ),
    )
    rec = Recorder(delay_s=0.05)
    records = replay(rec, Window([conv], concurrency=1))
    assert [r.ok for r in records] == [True, True, True]
    assert [m["content"] for m in rec.seen[2].body["messages"]] == [
        "Be brief.",
        "q1",
        "answer to q1",
        "q2",
        "answer to q2",
        "q3",
    ]
    assert rec.seen[1].body["messages"][2] == {"role": "assistant", "content": "answer to q1"}
    for earlier, later in zip(rec.seen, rec.seen[1:], strict=False):
        assert later.received >= earlier.answered  # each turn only after the previous answer
    assert [(r.turn, r.session, r.slice) for r in records] == [
        (0, "s", "todo"),
        (1, "s", "todo"),
        (2, "s", "todo"),
    ]
    # the later turns were due when the previous answer ended; the first had no schedule
    assert records[0].late_s is None and all(r.late_s is not None and r.late_s >= 0 for r in records[1:])


def test_closed_loop_keeps_at_most_its_streams_open() -> None:
    rec = Recorder(delay_s=0.05)
    records = replay(rec, Window([(user(f"q{i}"),) for i in range(6)], concurrency=2))
    assert len(records) == 6 and all(r.ok for r in records)
    assert rec.most_open == 2
    assert all(r.late_s is None and r.scheduled_s is None for r in records)  # nothing was scheduled


def test_open_loop_sends_on_schedule_whether_or_not_earlier_requests_finished() -> None:
    rec = Recorder(delay_s=0.4)
    due = [0.0, 0.05, 0.1, 0.15]
    records = replay(rec, Window([(user(f"q{i}"),) for i in range(4)], due_s=due))
    assert all(r.ok for r in records)
    assert rec.most_open == 4  # the last went out before the first was answered
    assert [s.body["messages"][-1]["content"] for s in sorted(rec.seen, key=lambda s: s.received)] == [
        "q0",
        "q1",
        "q2",
        "q3",
    ]
    for r, d in zip(records, due, strict=True):
        assert r.scheduled_s == d
        assert r.late_s is not None and r.late_s >= 0  # never early


def test_a_cap_on_open_requests_makes_the_late_one_wait_and_says_so() -> None:
    rec = Recorder(delay_s=0.2)
    records = replay(rec, Window([(user("q0"),), (user("q1"),)], due_s=[0.0, 0.01], concurrency=1))
    assert rec.most_open == 1
    assert records[1].late_s is not None and records[1].late_s >= 0.2 - 0.01  # waited for the slot


def test_a_trace_turn_waits_for_its_own_timestamp_too() -> None:
    rec = Recorder()
    conv = (user("q1", session="s", timestamp_s=10.0), user("q2", session="s", timestamp_s=10.3))
    records = replay(rec, Window([conv], due_s=[0.0], trace_start_s=10.0))
    assert records[1].scheduled_s is not None and records[1].scheduled_s >= 0.3
    assert records[1].start_s + records[1].send_delay_s >= 0.3  # on the socket no earlier


def test_a_failed_turn_ends_its_conversation_and_the_rest_is_recorded_not_sent() -> None:
    rec = Recorder(fail_on="q2")
    conv = (user("q1", session="s"), user("q2", session="s"), user("q3", session="s"))
    records = replay(rec, Window([conv, (user("other"),)], concurrency=2))
    assert [r.error is None for r in records] == [True, False, False, True]
    assert records[1].error is not None and records[1].error.startswith("HTTP 500")
    assert records[2].error == "not sent: turn 2 of its conversation failed"
    assert len(rec.seen) == 3  # q3 never reached the server
    assert [r.index for r in records] == [0, 1, 2, 3]


def test_the_records_own_fields_win_and_specexp_sets_model_and_streaming() -> None:
    turn = Turn(
        record=1,
        messages=({"role": "user", "content": "hi"},),
        fields={"temperature": 0.8, "max_completion_tokens": 9, "tools": [{"type": "function"}]},
    )
    body = build_payload(turn, [], DEFAULTS)
    assert body["temperature"] == 0.8 and body["seed"] == 7
    assert body["max_completion_tokens"] == 9 and "max_tokens" not in body
    assert body["tools"] == [{"type": "function"}]
    assert (body["model"], body["stream"], body["stream_options"]) == (
        "served",
        True,
        {"include_usage": True},
    )
    plain = build_payload(user("hi"), [], DEFAULTS)
    assert (plain["max_tokens"], plain["temperature"]) == (16, 0.0)


def test_the_collector_leaves_older_objects_alone_during_the_window_only() -> None:
    rec = Recorder()
    replay(rec, Window([(user("q0"),), (user("q1"),)], due_s=[0.0, 0.01]))
    assert all(n > 0 for n in rec.frozen)
    assert gc.get_freeze_count() == 0
