"""Streaming chat client: one request, timed with ``perf_counter``, failures returned as data.

Times are taken where they are true, not where Python gets round to them:
- TTFT starts when the request body has been handed to the socket (aiohttp's trace
  hook), so time the client spent queued behind other streams before sending is not
  counted as server time (``send_delay_s`` keeps it, for the record);
- each token's time is the arrival of the network read that carried it, taken before
  any parsing, so decoding one stream's chunk does not delay another's timestamp.
The streams go through aiohttp (C HTTP parser; vLLM's own bench client) rather than
httpx: at 64 streams on one core httpx spent 117 µs of CPU per token against aiohttp's
~37, and that queueing showed up as timing error (benchmarks/client_fidelity.py).

Every event that carries choices is a token event, as in vLLM's own bench client
(``lib/endpoint_request_func.py``): answer text, reasoning (``delta.reasoning``, or the
older ``reasoning_content``), tool-call deltas and the finish chunk alike. TTFT is the
first, each later one adds an ITL, and latency ends at the last, so ``latency − TTFT =
ΣITL`` and the decode window is the server's: ending it at the last *answer* chunk
would leave out the step that produced the finish chunk (with speculation several
tokens at once) and, behind a reasoning parser, every thinking token. The usage event
and ``[DONE]`` are not tokens. Output tokens come from the final usage block (one event
can carry several tokens), reasoning tokens from its ``completion_tokens_details`` when
the server gives them. vLLM can answer HTTP 200 and then send ``{"error": ...}`` inside
the stream: that is a failure, as is a stream that generated no text at all (an answer
that is all reasoning is not such a stream).
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import aiohttp
from aiohttp.abc import AbstractStreamWriter
from aiohttp.payload import BytesPayload

from specexp.record.results import RequestRecord


def chat_payload(
    model: str,
    messages: list[dict[str, str]],
    *,
    max_tokens: int,
    temperature: float,
    seed: int,
    ignore_eos: bool = False,
) -> dict[str, Any]:
    extra = {"ignore_eos": True} if ignore_eos else {}
    return {
        **extra,
        "model": model,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": temperature,
        "seed": seed,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


class _Stream:
    """Folds SSE events into a RequestRecord."""

    def __init__(self, rec: RequestRecord) -> None:
        self.rec = rec
        self.sent: float | None = None
        self.last: float | None = None
        self.parts: list[str] = []
        self.reasoning: list[str] = []
        self.done = False

    def event(self, data: bytes, now: float) -> None:
        rec = self.rec
        if data == b"[DONE]":
            self.done = True
            return
        event = json.loads(data)
        if "error" in event:
            err = event["error"]
            rec.error = str(err.get("message", err) if isinstance(err, dict) else err)[:300]
            self.done = True
            return
        if usage := event.get("usage"):
            rec.output_tokens = int(usage.get("completion_tokens") or 0)
            rec.prompt_tokens = usage.get("prompt_tokens")
            details = usage.get("completion_tokens_details") or {}
            if details.get("reasoning_tokens") is not None:
                rec.reasoning_tokens = int(details["reasoning_tokens"])
        choices = event.get("choices") or []
        if not choices:
            return
        if self.last is None:
            rec.ttft_s = now - (self.sent if self.sent is not None else now)
        else:
            rec.itl_s.append(now - self.last)
        self.last = now
        for choice in choices:
            delta = choice.get("delta") or {}
            if choice.get("finish_reason"):
                rec.finish_reason = choice["finish_reason"]
            if content := delta.get("content"):
                self.parts.append(content)
                rec.chunks += 1
            if reasoning := delta.get("reasoning") or delta.get("reasoning_content"):
                self.reasoning.append(reasoning)
                rec.reasoning_chunks += 1
            if delta.get("tool_calls"):
                rec.tool_call_chunks += 1

    def finish(self) -> None:
        """Text, latency, the reasoning/answer token split, and "generated nothing"."""
        rec = self.rec
        rec.text = "".join(self.parts)
        rec.reasoning_text = "".join(self.reasoning)
        if self.last is not None and self.sent is not None:
            rec.latency_s = self.last - self.sent
        if rec.reasoning_tokens is not None and (rec.reasoning_tokens > 0 or not rec.reasoning_text):
            rec.reasoning_tokens_source = "usage"
        elif rec.reasoning_text and rec.output_tokens:
            # no split from the server, or one that contradicts the text (a parser that
            # splits on text tags counts reasoning by special token ids and finds none):
            # share the tokens by characters, and say so
            share = len(rec.reasoning_text) / (len(rec.reasoning_text) + len(rec.text))
            rec.reasoning_tokens = round(rec.output_tokens * share)
            rec.reasoning_tokens_source = "estimate"
        if rec.error is None and not (rec.chunks or rec.reasoning_chunks or rec.tool_call_chunks):
            rec.error = "stream ended without any generated text"


# asyncio wakes a sleeper up to a millisecond late (epoll's timeout is in whole ms), so
# the last stretch before a due time is waited out by yielding to the loop instead.
SPIN_S = 0.002


async def sleep_until(deadline: float, spin_s: float = SPIN_S) -> None:
    """Sleep until ``deadline`` (``perf_counter`` seconds): asyncio sleep to just before it,
    then yield to the loop until it passes, so other streams keep being read meanwhile."""
    delay = deadline - time.perf_counter()
    if delay > spin_s:
        await asyncio.sleep(delay - spin_s)
    while time.perf_counter() < deadline:  # noqa: ASYNC110 (waiting for a time, not an event)
        await asyncio.sleep(0)


class _DueBody(BytesPayload):
    """A JSON body that aiohttp writes at its due time, not when the request is made.

    aiohttp holds a request's headers until the first body chunk and sends both in one
    write, so a body that waits for its due time lets everything else (URL, headers, a
    pooled or new connection, the writer task) be done beforehand: at the due time only
    the socket write is left. A request made when due spends ~0.7 ms in that set-up on
    this project's 2-core machine (``benchmarks/arrival_fidelity.py``)."""

    def __init__(self, body: bytes, due: float, spin_s: float) -> None:
        super().__init__(body, content_type="application/json")
        self._due, self._spin_s = due, spin_s

    async def write(self, writer: AbstractStreamWriter) -> None:
        await self.write_with_length(writer, None)

    async def write_with_length(self, writer: AbstractStreamWriter, content_length: int | None) -> None:
        await sleep_until(self._due, self._spin_s)
        await super().write_with_length(writer, content_length)


def arrival() -> float:
    """The clock read when a network read returns (its own name so a test can watch it)."""
    return time.perf_counter()


# Reuse an idle connection for less time than vLLM keeps it (VLLM_HTTP_TIMEOUT_KEEP_ALIVE,
# 5 s): a server frozen between interleaved trials closes expired connections only once
# thawed, racing the next request on them.
KEEPALIVE_S = 2.0


def session(timeout_s: float, headers: dict[str, str] | None = None) -> aiohttp.ClientSession:
    """One session per measured variant: unlimited connections (the case's semaphore is the
    limit), the trace hook that tells each request when its body went out, and ``headers``
    (the endpoint's bearer token) on every request."""
    trace = aiohttp.TraceConfig()

    async def sent(_s: aiohttp.ClientSession, ctx: Any, _params: Any) -> None:
        stream = ctx.trace_request_ctx.get("stream") if ctx.trace_request_ctx else None
        if isinstance(stream, _Stream):
            stream.sent = time.perf_counter()

    trace.on_request_headers_sent.append(sent)
    trace.on_request_chunk_sent.append(sent)
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=KEEPALIVE_S),
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=timeout_s),
        trace_configs=[trace],
        headers=headers,
    )


async def stream_chat(
    client: aiohttp.ClientSession,
    url: str,
    payload: dict[str, Any],
    *,
    index: int,
    t0: float,
    timeout_s: float,
    due: float | None = None,
    spin_s: float = SPIN_S,
) -> RequestRecord:
    """One streamed request. With ``due`` (``perf_counter`` seconds) the request is made
    now and its body goes on the socket at ``due``: the record starts at ``due`` (or now,
    if later), and ``send_delay_s`` is what the client took beyond it."""
    start = time.perf_counter()
    rec = RequestRecord(index=index, start_s=start - t0)
    st = _Stream(rec)
    content: dict[str, Any] = {"json": payload}
    if due is not None:
        content = {"data": _DueBody(json.dumps(payload).encode(), due, spin_s)}
        start = max(start, due)
        rec.start_s = start - t0
    try:
        async with client.post(url, **content, trace_request_ctx={"stream": st}) as resp:
            if st.sent is None:  # no trace from this session: fall back to the start
                st.sent = start
            rec.send_delay_s = st.sent - start
            if resp.status != 200:
                body = (await resp.read()).decode(errors="replace")
                rec.error = f"HTTP {resp.status}: {body[:300]}"
                return rec
            buf = b""
            async for raw in resp.content.iter_any():
                now = arrival()  # of this read, before any parsing
                buf += raw
                *events, buf = buf.replace(b"\r\n", b"\n").split(b"\n\n")
                for ev in events:
                    for line in ev.split(b"\n"):
                        if line.startswith(b"data:"):
                            st.event(line[5:].strip(), now)
                    if st.done:
                        break
                if st.done:
                    break
    except (aiohttp.ClientError, TimeoutError, json.JSONDecodeError, ValueError) as exc:
        rec.error = f"{type(exc).__name__}: {exc}"[:300]
    st.finish()
    return rec
