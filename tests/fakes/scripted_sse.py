"""A scripted-timing OpenAI-style SSE server: known TTFT and inter-token gaps, and every
token carries the server's own send time, so a client's timing error can be measured
exactly (the clocks are the same: ``perf_counter`` is CLOCK_MONOTONIC in every process).

Each chunk's content is ``"<send_ns> "``; the first is ``"<recv_ns>:<send_ns> "`` where
``recv_ns`` is when the request was fully read. Chunked HTTP/1.1 with keep-alive, like
uvicorn. Also answers /health, /metrics (empty) and /reset_prefix_cache.

    python -m tests.fakes.scripted_sse PORT [TTFT_MS] [GAP_MS,GAP_MS,...]
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Sequence

DEFAULT_TTFT_S = 0.040
DEFAULT_GAPS_S = (0.008, 0.012, 0.016, 0.024)


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _event(obj: object) -> bytes:
    return _chunk(b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n")


async def _read_request(reader: asyncio.StreamReader) -> tuple[str, str, bytes] | None:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    method, path, _ = lines[0].split(" ", 2)
    length = 0
    for line in lines[1:]:
        if line.lower().startswith("content-length:"):
            length = int(line.split(":", 1)[1])
    body = await reader.readexactly(length) if length else b""
    return method, path, body


def _plain(status: str, body: bytes = b"") -> bytes:
    return f"HTTP/1.1 {status}\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body


async def _stream(
    writer: asyncio.StreamWriter, body: bytes, recv_ns: int, ttft_s: float, gaps_s: Sequence[float]
) -> None:
    req = json.loads(body or b"{}")
    tokens = max(1, int(req.get("max_tokens") or req.get("max_completion_tokens") or 16))
    writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
    start = recv_ns / 1e9
    due = start + ttft_s
    for i in range(tokens):
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        send_ns = time.perf_counter_ns()
        text = f"{recv_ns}:{send_ns} " if i == 0 else f"{send_ns} "
        writer.write(_event({"choices": [{"index": 0, "delta": {"content": text}}]}))
        await writer.drain()
        due += gaps_s[i % len(gaps_s)]
    writer.write(_event({"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}))
    usage = {"prompt_tokens": 8, "completion_tokens": tokens, "total_tokens": tokens + 8}
    writer.write(_event({"choices": [], "usage": usage}))
    writer.write(_chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
    await writer.drain()


async def _handle(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, ttft_s: float, gaps_s: Sequence[float]
) -> None:
    try:
        while True:
            try:
                req = await _read_request(reader)
            except (asyncio.IncompleteReadError, ConnectionError):
                break
            if req is None:
                break
            recv_ns = time.perf_counter_ns()
            method, path, body = req
            if method == "POST" and path.endswith(("/chat/completions", "/completions")):
                await _stream(writer, body, recv_ns, ttft_s, gaps_s)
            elif path in ("/health", "/metrics", "/reset_prefix_cache", "/v1/models"):
                writer.write(_plain("200 OK"))
                await writer.drain()
            else:
                writer.write(_plain("404 Not Found"))
                await writer.drain()
    finally:
        writer.close()


async def serve(port: int, ttft_s: float = DEFAULT_TTFT_S, gaps_s: Sequence[float] = DEFAULT_GAPS_S) -> None:
    server = await asyncio.start_server(
        lambda r, w: _handle(r, w, ttft_s, gaps_s), "127.0.0.1", port, backlog=1024
    )
    print(f"READY {port}", flush=True)
    async with server:
        await server.serve_forever()


def parse_stamps(text: str) -> tuple[int, list[int]] | None:
    """(recv_ns, [send_ns per token]) from a stream's concatenated content; None if garbled."""
    parts = text.split()
    if not parts or ":" not in parts[0]:
        return None
    recv, first = parts[0].split(":")
    try:
        return int(recv), [int(first), *(int(p) for p in parts[1:])]
    except ValueError:
        return None


if __name__ == "__main__":
    port = int(sys.argv[1])
    ttft = float(sys.argv[2]) / 1000 if len(sys.argv) > 2 else DEFAULT_TTFT_S
    gaps = tuple(float(g) / 1000 for g in sys.argv[3].split(",")) if len(sys.argv) > 3 else DEFAULT_GAPS_S
    asyncio.run(serve(port, ttft, gaps))
