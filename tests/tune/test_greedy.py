"""The greedy token ids behind each case's prompts, from a server that returns them."""

from __future__ import annotations

import asyncio
import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from specexp.config.schema import BenchConfig, CaseConfig
from specexp.launch.base import Endpoint
from specexp.measure.traffic import CasePlan
from specexp.measure.workload_files import Turn
from specexp.tune import greedy


@pytest.fixture
def server() -> Iterator[tuple[str, list[dict]]]:
    """Answers chat completions with token ids derived from the prompt (as vLLM does when
    asked with ``return_token_ids``); ``"old"`` in the prompt answers without them."""
    seen: list[dict] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append(body)
            text = body["messages"][-1]["content"]
            ids = [ord(c) for c in text[:5]]
            choice: dict = {"message": {"content": "x"}, "finish_reason": "stop"}
            doc: dict = {"choices": [choice]}
            if "old" not in text:
                doc["prompt_token_ids"] = ids
                choice["token_ids"] = [i + 1 for i in ids][: body["max_tokens"]]
            raw = json.dumps(doc).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def log_message(self, *args: object) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}", seen
    srv.shutdown()
    srv.server_close()


def turn(text: str, record: int = 1) -> Turn:
    return Turn(record, ({"role": "user", "content": text},))


def plan(name: str, bench: BenchConfig, texts: list[str]) -> CasePlan:
    return CasePlan(name, bench.cases[name], [(turn(t),) for t in texts])


def test_each_distinct_prompt_once_in_trial_order_then_saved_and_loaded(
    server: tuple[str, list[dict[str, Any]]], tmp_path: Path
) -> None:
    url, seen = server
    bench = BenchConfig(
        seed=7,
        cases={
            "c1": CaseConfig(concurrency=1, max_tokens=3),
            "c4": CaseConfig(concurrency=4, max_tokens=4, ignore_eos=True),
        },
    )
    plans = {
        "c1": plan("c1", bench, ["alpha", "beta"]),
        "c4": plan("c4", bench, ["gamma", "delta", "gamma"]),
    }
    out = asyncio.run(greedy.capture(Endpoint(url, "m"), bench, plans))
    assert len(seen) == 4  # "gamma" twice in a trial: asked once
    assert all(
        b["return_token_ids"] and b["temperature"] == 0 and b["seed"] == 7 and not b.get("stream")
        for b in seen
    )
    assert {b.get("ignore_eos", False) for b in seen if b["max_tokens"] == 4} == {True}
    assert [o.prompt_ids for o in out["c4"]] == [
        tuple(map(ord, "gamma")),
        tuple(map(ord, "delta")),
        tuple(map(ord, "gamma")),
    ]
    assert out["c1"][0].output_ids == tuple(ord(c) + 1 for c in "alp")  # the case's own max_tokens
    greedy.save(tmp_path, out)
    assert greedy.load(tmp_path) == out
    assert greedy.load(tmp_path / "missing") is None


def test_a_server_without_token_ids_is_a_clear_failure(server: tuple[str, list[dict[str, Any]]]) -> None:
    url, _ = server
    bench = BenchConfig(cases={"c1": CaseConfig(concurrency=1)})
    with pytest.raises(greedy.CaptureFailed, match="no token ids"):
        asyncio.run(greedy.capture(Endpoint(url, "m"), bench, {"c1": plan("c1", bench, ["old model"])}))


def test_a_conversation_is_played_turn_by_turn_with_its_answers_in_the_history(
    server: tuple[str, list[dict[str, Any]]],
) -> None:
    url, seen = server
    bench = BenchConfig(cases={"c1": CaseConfig(concurrency=1, max_tokens=5)})
    conv = (turn("first"), turn("second", 2))
    out = asyncio.run(
        greedy.capture(Endpoint(url, "m"), bench, {"c1": CasePlan("c1", bench.cases["c1"], [conv])})
    )
    assert [o.prompt_ids for o in out["c1"]] == [tuple(map(ord, "first")), tuple(map(ord, "secon"))]
    assert [m["content"] for m in seen[1]["messages"]] == ["first", "x", "second"]  # the answer in between
