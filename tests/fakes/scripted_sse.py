"""A scripted-timing OpenAI-style SSE server: known TTFT and inter-token gaps, and every
token carries the server's own send time, so a client's timing error can be measured
exactly (the clocks are the same: ``perf_counter`` is CLOCK_MONOTONIC in every process).

Each token's text is ``"<send_ns> "``; the first is ``"<recv_ns>:<send_ns> "`` where
``recv_ns`` is when the request was fully read. Like vLLM, a role chunk goes out with
the first token, and the finish chunk carries no text. A request field
``x_reasoning_tokens: N`` sends the first N tokens as ``delta.reasoning`` (a reasoning
parser's stream) and reports them in the usage's ``completion_tokens_details``.
With ``--eos-step`` the last token is an EOS produced by a step of its own, one gap
after the last text: its chunk is the finish chunk (no text), as in vLLM when a
request stops by itself.

``/metrics`` serves vLLM's per-request histograms (decode time from the first to the
last token's send, generation tokens, time per output token) and
``generation_tokens_total``, in vLLM's exposition format with ``*_created`` samples and
``process_start_time_seconds``. ``POST /x/restart`` makes the next chat request act
as a server restart: new start time, counters from zero. With ``--drafts-from=N`` it
also serves speculative-decoding counters (k = 3), which move only from the N-th chat
request on (0-based), as when a warm-up request never gave prompt lookup a match. Also
answers /health and /reset_prefix_cache. Chunked HTTP/1.1 with keep-alive, like uvicorn.

    python -m tests.fakes.scripted_sse PORT [TTFT_MS] [GAP_MS,...] [--eos-step] [--drafts-from=N]
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

DEFAULT_TTFT_S = 0.040
DEFAULT_GAPS_S = (0.008, 0.012, 0.016, 0.024)
_LABELS = '{engine="0",model_name="scripted"}'


@dataclass
class Script:
    ttft_s: float = DEFAULT_TTFT_S
    gaps_s: Sequence[float] = DEFAULT_GAPS_S
    eos_step: bool = False
    started: float = field(default_factory=time.time)
    created: float = field(default_factory=time.time)
    restart_next: bool = False
    counters: dict[str, float] = field(default_factory=dict)
    drafts_from: int | None = None  # serve spec-decode counters; drafts from this request on
    requests: int = 0

    def restart(self) -> None:
        self.started = self.created = time.time() + 1.0  # a later start than the one it replaces
        self.counters = {}
        self.restart_next = False

    def finished(self, tokens: int, first_s: float, last_s: float) -> None:
        c = self.counters
        decode = last_s - first_s
        if self.drafts_from is not None and self.requests >= self.drafts_from:
            drafts = tokens // 2  # k = 3 drafts per step, the first token of each accepted
            for key, value in (("drafts", drafts), ("draft_tokens", 3 * drafts), ("accepted", drafts)):
                c[key] = c.get(key, 0.0) + value
        self.requests += 1
        for name, value in (
            ("generation_tokens_total", tokens),
            ("request_decode_time_seconds_sum", decode),
            ("request_decode_time_seconds_count", 1),
            ("request_generation_tokens_sum", tokens),
            ("request_generation_tokens_count", 1),
            ("request_time_per_output_token_seconds_sum", decode / (tokens - 1) if tokens > 1 else 0.0),
            ("request_time_per_output_token_seconds_count", 1),
        ):
            c[name] = c.get(name, 0.0) + value

    def metrics(self) -> bytes:
        lines = [
            "# TYPE process_start_time_seconds gauge",
            f"process_start_time_seconds {self.started:.2f}",
            "# TYPE vllm:generation_tokens counter",
            f"vllm:generation_tokens_total{_LABELS} {self.counters.get('generation_tokens_total', 0.0)}",
            f"vllm:generation_tokens_created{_LABELS} {self.created}",
        ]
        if self.drafts_from is not None:
            for name, key in (
                ("spec_decode_num_drafts", "drafts"),
                ("spec_decode_num_draft_tokens", "draft_tokens"),
                ("spec_decode_num_accepted_tokens", "accepted"),
            ):
                lines.append(f"# TYPE vllm:{name} counter")
                lines.append(f"vllm:{name}_total{_LABELS} {self.counters.get(key, 0.0)}")
            lines.append("# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter")
            for pos in range(3):
                value = self.counters.get("accepted", 0.0) if pos == 0 else 0.0
                labels = f'{{engine="0",model_name="scripted",position="{pos}"}}'
                lines.append(f"vllm:spec_decode_num_accepted_tokens_per_pos_total{labels} {value}")
        for hist in (
            "request_decode_time_seconds",
            "request_generation_tokens",
            "request_time_per_output_token_seconds",
        ):
            lines.append(f"# TYPE vllm:{hist} histogram")
            count = self.counters.get(f"{hist}_count", 0.0)
            lines.append(f'vllm:{hist}_bucket{{engine="0",le="+Inf",model_name="scripted"}} {count}')
            lines.append(f"vllm:{hist}_count{_LABELS} {count}")
            lines.append(f"vllm:{hist}_sum{_LABELS} {self.counters.get(f'{hist}_sum', 0.0)}")
            lines.append(f"vllm:{hist}_created{_LABELS} {self.created}")
        return ("\n".join(lines) + "\n").encode()


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


async def _stream(writer: asyncio.StreamWriter, body: bytes, recv_ns: int, script: Script) -> None:
    if script.restart_next:
        script.restart()
    req = json.loads(body or b"{}")
    tokens = max(1, int(req.get("max_tokens") or req.get("max_completion_tokens") or 16))
    texts = tokens - 1 if script.eos_step and tokens > 1 else tokens
    reasoning = min(texts, int(req.get("x_reasoning_tokens") or 0))
    writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
    due = recv_ns / 1e9 + script.ttft_s
    sends: list[float] = []
    for i in range(tokens):
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        send_ns = time.perf_counter_ns()
        sends.append(send_ns / 1e9)
        due += script.gaps_s[i % len(script.gaps_s)]
        if i == 0:
            writer.write(_event({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}))
        if i >= texts:  # the EOS step: the finish chunk, no text
            break
        text = f"{recv_ns}:{send_ns} " if i == 0 else f"{send_ns} "
        field = "reasoning" if i < reasoning else "content"
        writer.write(_event({"choices": [{"index": 0, "delta": {field: text}}]}))
        await writer.drain()
    finish = "stop" if texts < tokens else "length"
    writer.write(_event({"choices": [{"index": 0, "delta": {}, "finish_reason": finish}]}))
    script.finished(tokens, sends[0], sends[-1])
    usage = {
        "prompt_tokens": 8,
        "completion_tokens": tokens,
        "total_tokens": tokens + 8,
        "completion_tokens_details": {"reasoning_tokens": reasoning},
    }
    writer.write(_event({"choices": [], "usage": usage}))
    writer.write(_chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
    await writer.drain()


async def _handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, script: Script) -> None:
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
                await _stream(writer, body, recv_ns, script)
            elif path == "/metrics":
                writer.write(_plain("200 OK", script.metrics()))
            elif method == "POST" and path == "/x/restart":
                script.restart_next = True
                writer.write(_plain("200 OK"))
            elif path in ("/health", "/reset_prefix_cache", "/v1/models"):
                writer.write(_plain("200 OK"))
            else:
                writer.write(_plain("404 Not Found"))
            await writer.drain()
    finally:
        writer.close()


async def serve(port: int, script: Script) -> None:
    server = await asyncio.start_server(lambda r, w: _handle(r, w, script), "127.0.0.1", port, backlog=1024)
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
    flags = [a for a in sys.argv[1:] if a.startswith("--")]
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    script = Script(eos_step="--eos-step" in flags)
    for flag in flags:
        if flag.startswith("--drafts-from="):
            script.drafts_from = int(flag.split("=", 1)[1])
    if len(args) > 1:
        script.ttft_s = float(args[1]) / 1000
    if len(args) > 2:
        script.gaps_s = tuple(float(g) / 1000 for g in args[2].split(","))
    asyncio.run(serve(int(args[0]), script))
