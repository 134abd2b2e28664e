"""The greedy token ids behind a variant's measured outputs, for the ngram replay.

Measured streams carry text; the replay needs the ids the server generated and the
chat-templated prompt ids it saw. vLLM's chat completions return both when asked
(``"return_token_ids": true``: ``prompt_token_ids`` and, per choice, ``token_ids``), so
each case's prompts are sent once more, non-streamed, while the server is still up after
its trials, at the case's own concurrency (the batch it was measured in), with the
case's own ``max_tokens``, seed and ``ignore_eos``. Stored as ``greedy.json`` beside the
variant's ``result.json``; a later search reads it instead of starting the server.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx

from specexp.config.schema import BenchConfig
from specexp.launch.base import Endpoint
from specexp.measure import workload
from specexp.record.files import atomic_write_json
from specexp.tune.replay import GreedyOutput

GREEDY_FILE = "greedy.json"


class CaptureFailed(Exception):
    """The server did not give token ids back (an older vLLM, or a failed request)."""


def _key(messages: workload.Messages) -> str:
    return json.dumps(messages, sort_keys=True)


async def _one(
    client: httpx.AsyncClient,
    endpoint: Endpoint,
    messages: workload.Messages,
    bench: BenchConfig,
    max_tokens: int,
    ignore_eos: bool,
) -> GreedyOutput:
    payload: dict[str, Any] = {
        "model": endpoint.model,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "seed": bench.seed,
        "return_token_ids": True,
    }
    if ignore_eos:
        payload["ignore_eos"] = True
    resp = await client.post(f"{endpoint.base_url}/v1/chat/completions", json=payload)
    if resp.status_code != 200:
        raise CaptureFailed(f"HTTP {resp.status_code}: {resp.text[:200]}")
    body = resp.json()
    choice = (body.get("choices") or [{}])[0]
    prompt_ids, output_ids = body.get("prompt_token_ids"), choice.get("token_ids")
    if not isinstance(prompt_ids, list) or not isinstance(output_ids, list):
        raise CaptureFailed("the server returned no token ids (needs a vLLM with return_token_ids)")
    return GreedyOutput(tuple(int(t) for t in prompt_ids), tuple(int(t) for t in output_ids))


async def _bounded(sem: asyncio.Semaphore, *args: Any) -> GreedyOutput:
    async with sem:
        return await _one(*args)


async def capture(
    endpoint: Endpoint, bench: BenchConfig, prompts: dict[str, list[workload.Messages]]
) -> dict[str, list[GreedyOutput]]:
    """Every case's prompts in trial order (a prompt sent twice in a trial appears twice)."""
    out: dict[str, list[GreedyOutput]] = {}
    async with httpx.AsyncClient(timeout=bench.request_timeout_s, headers=endpoint.headers()) as client:
        for name, case in bench.cases.items():
            unique: dict[str, workload.Messages] = {}
            for messages in prompts[name]:
                unique.setdefault(_key(messages), messages)
            sem = asyncio.Semaphore(case.concurrency)
            keys = list(unique)
            got = await asyncio.gather(
                *(
                    _bounded(sem, client, endpoint, unique[k], bench, case.max_tokens, case.ignore_eos)
                    for k in keys
                )
            )
            by_key = dict(zip(keys, got, strict=True))
            out[name] = [by_key[_key(m)] for m in prompts[name]]
    return out


def save(folder: Path, outputs: dict[str, list[GreedyOutput]]) -> Path:
    path = folder / GREEDY_FILE
    atomic_write_json(
        path,
        {
            "cases": {
                name: [{"prompt_ids": list(o.prompt_ids), "output_ids": list(o.output_ids)} for o in outs]
                for name, outs in outputs.items()
            }
        },
    )
    return path


def load(folder: Path | None) -> dict[str, list[GreedyOutput]] | None:
    if folder is None or not (folder / GREEDY_FILE).is_file():
        return None
    try:
        doc = json.loads((folder / GREEDY_FILE).read_bytes())
        return {
            name: [GreedyOutput(tuple(o["prompt_ids"]), tuple(o["output_ids"])) for o in outs]
            for name, outs in doc["cases"].items()
        }
    except (OSError, ValueError, KeyError, TypeError):
        return None
