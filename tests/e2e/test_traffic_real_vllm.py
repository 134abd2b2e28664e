"""The shipped agent traffic file replayed on the real CPU build of vLLM: ngram k=3 against
its baseline, slice by slice, sessions as conversations; 16 tokens per answer keep it short."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import require_vllm, run_cli

pytestmark = pytest.mark.e2e

SLICES = ("portfolio", "smart_home", "todo", "coding_conflict")


def test_agent_traffic_per_slice_on_real_vllm(workdir: Path) -> None:
    require_vllm()
    out = run_cli(
        [
            "sweep",
            "spec=ngram",
            "spec.depth=3",
            "bench=traffic",
            "bench.trials=4",
            "bench.order=interleaved",
            "bench.cases.agent.max_tokens=16",
            "suite=none",
            "tracking=none",
            "--name",
            "traffic",
        ],
        workdir,
        timeout=1500,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    sweep = json.loads((workdir / "results" / "traffic" / "sweep.json").read_text())
    base, k3 = sweep["variants"]
    assert [base["label"], k3["label"]] == ["baseline", "ngram-k3"]
    for v in (base, k3):
        assert v["status"] == "ok", v.get("error")
        assert sorted(v["cases"]) == sorted(f"agent.{s}" for s in SLICES)
        for name, case in v["cases"].items():
            assert case["failed_requests"] == 0, name
            assert case["looping_outputs"] == 0, f"{name}: the sample traffic must not make the model loop"
            assert len(case["trials"]) == 4
            for trial in case["trials"]:
                assert {r["slice"] for r in trial["requests"]} == {name.split(".", 1)[1]}
        # sessions replayed as conversations: the later turns resend the conversation so far
        todo = v["cases"]["agent.todo"]["trials"][0]["requests"]
        turns = sorted((r for r in todo if r["session"] == "weekly-list"), key=lambda r: r["turn"])
        assert [r["turn"] for r in turns] == [0, 1]
        assert turns[1]["prompt_tokens"] > turns[0]["prompt_tokens"] + turns[0]["output_tokens"]
        # ... so their earlier turns come from the prefix cache (vLLM caches whole blocks only)
        hits = [c["summary"]["prefix_cache_hit_rate"]["max"] for c in v["cases"].values()]
        assert max(hits) > 0, hits
    for name, case in k3["cases"].items():  # four trials a side: enough for an interval
        verdict = case["verdict"]
        assert (
            verdict is not None and verdict["metric"] == "output_tok_s" and verdict["ci_low"] is not None
        ), name
        assert 0 < case["summary"]["acceptance_rate"]["median"] <= 1
    for s in SLICES:
        assert f"agent.{s}" in out.stdout  # one row per slice in the table
