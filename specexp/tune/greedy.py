"""The greedy token ids behind a variant's measured outputs, for the ngram replay.

Measured streams carry text; the replay needs the ids the server generated and the
chat-templated prompt ids it saw. vLLM's chat completions return both when asked
(``"return_token_ids": true``: ``prompt_token_ids`` and, per choice, ``token_ids``), so
each case's conversations are sent once more, non-streamed, while the server is still up
after its trials, at the case's own number of streams (the batch it was measured in),
with the same request bodies as the measured window's (``loadgen.build_payload``) but
greedy. Stored as ``greedy.json`` beside the
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
from specexp.measure.loadgen import RequestDefaults, build_payload
from specexp.measure.traffic import CasePlan
from specexp.measure.workload_files import Turn
from specexp.record.files import atomic_write_json
from specexp.tune.replay import GreedyOutput

GREEDY_FILE = "greedy.json"


class CaptureFailed(Exception):
    """The server did not give token ids back (an older vLLM, or a failed request)."""


def _key(conv: tuple[Turn, ...]) -> str:
    return json.dumps([[t.messages, t.fields] for t in conv], sort_keys=True, default=str)


async def _one(client: httpx.AsyncClient, url: str, payload: dict[str, Any]) -> tuple[GreedyOutput, str]:
    resp = await client.post(url, json=payload)
    if resp.status_code != 200:
        raise CaptureFailed(f"HTTP {resp.status_code}: {resp.text[:200]}")
    body = resp.json()
    choice = (body.get("choices") or [{}])[0]
    prompt_ids, output_ids = body.get("prompt_token_ids"), choice.get("token_ids")
    if not isinstance(prompt_ids, list) or not isinstance(output_ids, list):
        raise CaptureFailed("the server returned no token ids (needs a vLLM with return_token_ids)")
    text = (choice.get("message") or {}).get("content") or ""
    return GreedyOutput(tuple(int(t) for t in prompt_ids), tuple(int(t) for t in output_ids)), str(text)


async def _conversation(
    client: httpx.AsyncClient, url: str, conv: tuple[Turn, ...], defaults: RequestDefaults
) -> list[GreedyOutput]:
    """A conversation's turns one after another, each with the answers before it in its
    history (as the measured window sent them), non-streamed and greedy."""
    history: list[dict[str, Any]] = []
    out: list[GreedyOutput] = []
    for turn in conv:
        payload = build_payload(turn, history, defaults)
        payload.pop("stream_options", None)
        payload.update(stream=False, temperature=0.0, return_token_ids=True)
        got, text = await _one(client, url, payload)
        out.append(got)
        history = [*history, *turn.new_messages(first=not history), {"role": "assistant", "content": text}]
    return out


async def _bounded(sem: asyncio.Semaphore, *args: Any) -> list[GreedyOutput]:
    async with sem:
        return await _conversation(*args)


async def capture(
    endpoint: Endpoint, bench: BenchConfig, plans: dict[str, CasePlan]
) -> dict[str, list[GreedyOutput]]:
    """Every case's requests in a trial's order (a conversation sent twice in a trial
    appears twice, asked once), at the case's own number of streams."""
    out: dict[str, list[GreedyOutput]] = {}
    url = f"{endpoint.base_url}/v1/chat/completions"
    async with httpx.AsyncClient(timeout=bench.request_timeout_s, headers=endpoint.headers()) as client:
        for name, plan in plans.items():
            case = plan.case
            defaults = RequestDefaults(endpoint.model, case.max_tokens, 0.0, bench.seed, case.ignore_eos)
            unique: dict[str, tuple[Turn, ...]] = {}
            for conv in plan.conversations:
                unique.setdefault(_key(conv), conv)
            sem = asyncio.Semaphore(max(1, plan.streams))
            keys = list(unique)
            got = await asyncio.gather(*(_bounded(sem, client, url, unique[k], defaults) for k in keys))
            by_key = dict(zip(keys, got, strict=True))
            out[name] = [o for conv in plan.conversations for o in by_key[_key(conv)]]
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
