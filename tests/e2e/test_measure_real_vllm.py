"""The measurement path on the real CPU vLLM: a reasoning parser's stream, a warm-up that
made the server draft, the client's decode windows against the server's own histograms,
and the acceptance counters' consistency (one server with ngram k=3 and a reasoning
parser; about two minutes)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import pytest

from specexp.config.compose import plan_sweep
from specexp.config.schema import BenchConfig, CaseConfig
from specexp.launch.local import LocalLauncher
from specexp.launch.plan import build_plan
from specexp.measure import prometheus
from specexp.measure.client import chat_payload, session, stream_chat
from specexp.measure.runner import VariantBench
from specexp.record.results import CaseResult, RequestRecord
from tests.helpers import require_vllm

pytestmark = pytest.mark.e2e

# olmo3's parser splits on the text tags <think>…</think> (no special tokens needed), so it
# works on SmolLM2; without a closing tag the whole answer is streamed as delta.reasoning
PARSER = "olmo3"


def test_reasoning_stream_and_server_cross_check_on_real_vllm(tmp_path: Path) -> None:
    require_vllm()
    (variant,) = plan_sweep(
        ["spec=ngram", "spec.depth=3", f'server.extra_args=["--reasoning-parser={PARSER}"]'],
        with_baseline=False,
    )
    bench = BenchConfig(
        trials=1,
        warmup_requests=1,
        # fixed 256-token answers: on a loaded host the API server hands the first token over
        # late by up to a few hundred ms while the engine's clock has already started; over
        # ~60-token windows that alone read 15 % fast, over 255-token windows a few percent.
        # The window definition itself is checked exactly against a scripted server in
        # tests/measure/test_runner.py.
        cases={"single": CaseConfig(concurrency=1, num_prompts=3, max_tokens=256, ignore_eos=True)},
    )
    with LocalLauncher(build_plan(variant), tmp_path / "server.log", ready_timeout_s=600) as launcher:
        endpoint = launcher.wait_ready()

        async def go() -> tuple[RequestRecord, float, CaseResult]:
            async with session(300) as client:
                thinking = await stream_chat(
                    client,
                    f"{endpoint.base_url}/v1/chat/completions",
                    chat_payload(
                        endpoint.model,
                        [{"role": "user", "content": "What is 12 plus 30? Think first."}],
                        max_tokens=48,
                        temperature=0.0,
                        seed=0,
                    ),
                    index=0,
                    t0=time.perf_counter(),
                    timeout_s=300,
                )
            async with VariantBench(endpoint, bench) as vb, httpx.AsyncClient() as control:
                # the warm-up made the server draft, so the ngram proposer's numba kernel is
                # compiled before the first trial instead of inside it
                warmed = await prometheus.scrape(control, endpoint.metrics_url)
                await vb.run_trial(1)
            return thinking, warmed.drafts, vb.results()["single"]

        thinking, warm_drafts, case = asyncio.run(go())
        assert warm_drafts > 0

    # the whole answer came as reasoning: timed, kept, not a "no content" failure
    assert thinking.ok, thinking.error
    assert thinking.reasoning_text and thinking.reasoning_chunks > 0 and thinking.ttft_s is not None
    assert thinking.output_tokens > 1 and thinking.reasoning_tokens is not None
    # the parser counts reasoning by special token ids and finds none: the client estimates, and says so
    assert thinking.reasoning_tokens_source == "estimate"

    (trial,) = case.trials
    assert trial.ok and all(r.ok for r in trial.requests)
    m = trial.metrics
    assert m["server_decode_tok_s"] > 0 and m["server_inv_tpot_tok_s"] > 0
    assert abs(m["client_server_gap"]) < 0.05, m  # the client's windows are the server's
    assert trial.acceptance is not None and trial.acceptance.drafts > 0
    assert trial.acceptance.consistent, trial.acceptance.inconsistency
    assert case.server_disagreements == 0 and case.acceptance_inconsistent == 0 and case.failed_trials == 0
