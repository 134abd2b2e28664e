"""Streaming chat client: one request, timed with ``perf_counter``, failures returned as data.

TTFT is the first chunk carrying content; latency ends at the last content
chunk, not at the usage chunk or ``[DONE]``, so ``latency − TTFT = ΣITL``.
Output tokens come from the final usage block: with speculative decoding one
chunk can carry several tokens, so counting chunks would undercount. vLLM can
answer HTTP 200 and then send ``{"error": ...}`` inside the stream: that is a
failure, as is a stream with no content at all.
"""

from __future__ import annotations

import json
import time
from typing import Any

import httpx

from specexp.record.results import RequestRecord


def chat_payload(
    model: str,
    messages: list[dict[str, str]],
    *,
    max_tokens: int,
    temperature: float,
    seed: int,
) -> dict[str, Any]:
    return {
        "model": model,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": temperature,
        "seed": seed,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


async def stream_chat(
    client: httpx.AsyncClient,
    url: str,
    payload: dict[str, Any],
    *,
    index: int,
    t0: float,
    timeout_s: float,
) -> RequestRecord:
    start = time.perf_counter()
    rec = RequestRecord(index=index, start_s=start - t0)
    last: float | None = None
    parts: list[str] = []
    try:
        async with client.stream("POST", url, json=payload, timeout=timeout_s) as resp:
            if resp.status_code != 200:
                body = (await resp.aread()).decode(errors="replace")
                rec.error = f"HTTP {resp.status_code}: {body[:300]}"
                return rec
            async for line in resp.aiter_lines():
                now = time.perf_counter()
                if not line or line.startswith(":") or not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                event = json.loads(data)
                if "error" in event:
                    err = event["error"]
                    rec.error = str(err.get("message", err) if isinstance(err, dict) else err)[:300]
                    break
                if usage := event.get("usage"):
                    rec.output_tokens = int(usage.get("completion_tokens") or 0)
                    rec.prompt_tokens = usage.get("prompt_tokens")
                for choice in event.get("choices") or []:
                    delta = choice.get("delta") or {}
                    content = delta.get("content") or delta.get("reasoning_content") or ""
                    if choice.get("finish_reason"):
                        rec.finish_reason = choice["finish_reason"]
                    if not content:
                        continue
                    parts.append(content)
                    rec.chunks += 1
                    if last is None:
                        rec.ttft_s = now - start
                    else:
                        rec.itl_s.append(now - last)
                    last = now
    except (httpx.HTTPError, json.JSONDecodeError, ValueError) as exc:
        rec.error = f"{type(exc).__name__}: {exc}"[:300]
    rec.text = "".join(parts)
    if last is not None:
        rec.latency_s = last - start
    if rec.error is None and rec.ttft_s is None:
        rec.error = "stream ended without any content"
    return rec
