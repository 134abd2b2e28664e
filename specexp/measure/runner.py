"""Run a variant's cases × trials against an Endpoint.

Warm-up requests come first and are not counted. Each measured window (one
case of one trial) is bracketed by two ``/metrics`` snapshots, so acceptance
belongs to exactly that window. Trials are the outer loop so slow drift of the
machine spreads over all cases instead of landing on the last one; an interleaved
sweep goes further and takes one trial of every variant per round.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

import aiohttp
import httpx

from specexp.config.schema import BenchConfig, CaseConfig
from specexp.errors import ConfigError
from specexp.launch.base import Endpoint
from specexp.measure import client as streaming
from specexp.measure import prometheus, workload
from specexp.measure.client import chat_payload, stream_chat
from specexp.measure.degenerate import is_looping
from specexp.measure.long_prompt import exact_prompt
from specexp.measure.stats import case_verdict, look_confidence, summarize, trial_metrics
from specexp.record.results import (
    AcceptanceRecord,
    CaseResult,
    RequestRecord,
    TrialRecord,
    VariantResult,
)

Progress = Callable[[str], None]


def _case_prompts(
    endpoint: Endpoint, bench: BenchConfig, case_name: str, case: CaseConfig, case_index: int
) -> list[workload.Messages]:
    """A case's prompts: the same in every trial, so they are built once per case."""
    if case.prompt_tokens is None:
        return workload.prompts_for(case.workload or bench.workload, case_index, case.num_prompts, bench.seed)
    if endpoint.tokenizer is None:
        raise ConfigError(
            f"bench.cases.{case_name}.prompt_tokens needs the model's tokenizer on this machine"
        )
    return [exact_prompt(endpoint.tokenizer, case.prompt_tokens, i) for i in range(case.num_prompts)]


async def _run_case(
    client: httpx.AsyncClient,
    streams: aiohttp.ClientSession,
    endpoint: Endpoint,
    bench: BenchConfig,
    case_name: str,
    case: CaseConfig,
    prompts: list[workload.Messages],
    trial: int,
) -> TrialRecord:
    url = f"{endpoint.base_url}/v1/chat/completions"
    if bench.reset_prefix_cache:
        with contextlib.suppress(httpx.HTTPError):
            await client.post(f"{endpoint.control_base}/reset_prefix_cache", timeout=10.0)
    before = await prometheus.scrape(client, endpoint.metrics_url)
    sem = asyncio.Semaphore(case.concurrency)
    started_at = time.time()
    t0 = time.perf_counter()

    async def one(i: int) -> RequestRecord:
        payload = chat_payload(
            endpoint.model,
            prompts[i],
            max_tokens=case.max_tokens,
            temperature=bench.temperature,
            seed=bench.seed,
            ignore_eos=case.ignore_eos,
        )
        async with sem:
            return await stream_chat(streams, url, payload, index=i, t0=t0, timeout_s=bench.request_timeout_s)

    records = list(await asyncio.gather(*(one(i) for i in range(len(prompts)))))
    for rec in records:
        rec.looping = is_looping(rec.text)
    duration = time.perf_counter() - t0
    after = await prometheus.scrape(client, endpoint.metrics_url)
    acc = prometheus.delta(before, after)
    metrics = trial_metrics(records, duration, case.concurrency)
    if case.prompt_tokens is not None:
        # the server's own count must match the exact length asked for
        metrics["prompt_tokens_mismatch"] = float(
            sum(1 for r in records if r.ok and r.prompt_tokens != case.prompt_tokens)
        )
    acc_rec = None
    if acc is not None:
        acc_rec = AcceptanceRecord(
            drafts=acc.drafts,
            draft_tokens=acc.draft_tokens,
            accepted=acc.accepted,
            rate=acc.rate,
            mean_length=acc.mean_length,
            per_position=list(acc.per_position),
        )
        if acc.rate is not None:
            metrics["acceptance_rate"] = acc.rate
        if acc.mean_length is not None:
            metrics["acceptance_length"] = acc.mean_length
        for pos, rate in enumerate(acc.per_position):
            metrics[f"acceptance_pos{pos}"] = rate
    return TrialRecord(
        case=case_name,
        trial=trial,
        started_at=started_at,
        duration_s=duration,
        requests=records,
        metrics=metrics,
        acceptance=acc_rec,
    )


class VariantBench:
    """One variant's measurement, a trial at a time: warm-up once, then ``run_trial`` as
    often as the schedule asks (all trials in a row, or round-robin with other variants)."""

    def __init__(
        self,
        endpoint: Endpoint,
        bench: BenchConfig,
        progress: Progress | None = None,
        *,
        launch: int = 0,
        prior: dict[str, list[TrialRecord]] | None = None,
    ) -> None:
        """``launch`` and ``prior``: a later launch of the same variant goes on numbering
        trials after the ones ``prior`` holds, and its results include them."""
        self.endpoint, self.bench, self.launch = endpoint, bench, launch
        self.say: Progress = progress or (lambda _msg: None)
        self.prompts = {
            name: _case_prompts(endpoint, bench, name, case, ci)
            for ci, (name, case) in enumerate(bench.cases.items())
        }
        self.trials: dict[str, list[TrialRecord]] = {
            name: list((prior or {}).get(name, [])) for name in bench.cases
        }
        self.first_trial = self.done
        self._client: httpx.AsyncClient | None = None  # control: /metrics, cache reset
        self._streams: aiohttp.ClientSession | None = None  # the measured streams

    @property
    def done(self) -> int:
        return min((len(t) for t in self.trials.values()), default=0)

    async def __aenter__(self) -> VariantBench:
        limits = httpx.Limits(
            max_connections=None, max_keepalive_connections=64, keepalive_expiry=streaming.KEEPALIVE_S
        )
        self._client = httpx.AsyncClient(limits=limits, timeout=self.bench.request_timeout_s)
        self._streams = streaming.session(self.bench.request_timeout_s)
        try:
            await self._warm_up()
        except BaseException:
            await self.__aexit__()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._client is not None:
            await self._client.aclose()
        if self._streams is not None:
            await self._streams.close()

    async def _warm_up(self) -> None:
        """Untimed requests on the first case's own prompts (its length, its ``ignore_eos``),
        so the first timed trial does not pay vLLM's first-use costs of those shapes."""
        assert self._streams is not None
        url = f"{self.endpoint.base_url}/v1/chat/completions"
        first = next(iter(self.bench.cases), None)
        for i in range(self.bench.warmup_requests):
            self.say(f"warm-up {i + 1}/{self.bench.warmup_requests}")
            messages, max_tokens, ignore_eos = workload.warmup_prompt(), 16, False
            if first is not None:
                case, prompts = self.bench.cases[first], self.prompts[first]
                messages, ignore_eos = prompts[i % len(prompts)], case.ignore_eos
                max_tokens = min(32, case.max_tokens)
            payload = chat_payload(
                self.endpoint.model,
                messages,
                max_tokens=max_tokens,
                temperature=self.bench.temperature,
                seed=self.bench.seed,
                ignore_eos=ignore_eos,
            )
            rec = await stream_chat(
                self._streams,
                url,
                payload,
                index=i,
                t0=time.perf_counter(),
                timeout_s=self.bench.request_timeout_s,
            )
            if rec.error:
                raise RuntimeError(f"warm-up request failed: {rec.error}")

    async def run_trial(self, of: int) -> None:
        """One more trial of every case (cases in order, so drift spreads over all of them)."""
        assert self._client is not None and self._streams is not None, "use VariantBench with async with"
        t = self.done
        for name, case in self.bench.cases.items():
            self.say(f"trial {t + 1}/{of} · {name}")
            record = await _run_case(
                self._client, self._streams, self.endpoint, self.bench, name, case, self.prompts[name], t
            )
            record.launch = self.launch
            self.trials[name].append(record)

    def results(self) -> dict[str, CaseResult]:
        return {name: _case_result(name, case, self.trials[name]) for name, case in self.bench.cases.items()}


def _case_result(name: str, case: CaseConfig, recs: list[TrialRecord]) -> CaseResult:
    keys = sorted({k for r in recs for k in r.metrics})
    summary = {}
    for key in keys:
        s = summarize(r.metrics[key] for r in recs if key in r.metrics)
        if s is not None:
            summary[key] = s
    return CaseResult(
        case=name,
        concurrency=case.concurrency,
        trials=recs,
        summary=summary,
        failed_requests=sum(1 for r in recs for q in r.requests if not q.ok),
        looping_outputs=sum(1 for r in recs for q in r.requests if q.ok and q.looping),
    )


def undecided(
    cases: dict[str, CaseResult], baseline: dict[str, CaseResult] | None, confidence: float
) -> list[str]:
    """Cases whose main figure has no clear verdict against the baseline's cases yet."""
    out = []
    for name, case in cases.items():
        base = (baseline or {}).get(name)
        verdict = case_verdict(case, base, confidence) if base is not None else None
        if verdict is not None and verdict.verdict == "no clear difference":
            out.append(name)
    return out


async def measure(
    endpoint: Endpoint,
    bench: BenchConfig,
    progress: Progress | None = None,
    baseline: VariantResult | None = None,
) -> dict[str, CaseResult]:
    """All of one variant's trials in a row; with ``bench.max_trials`` above ``bench.trials``,
    more batches follow while a case has no clear verdict against ``baseline``."""
    confidence = look_confidence(bench.trials, bench.max_trials)
    async with VariantBench(endpoint, bench, progress) as vb:
        target = bench.trials
        while vb.done < target:
            await vb.run_trial(target)
            if (
                vb.done == target
                and target < bench.max_trials
                and undecided(vb.results(), baseline.cases if baseline else None, confidence)
            ):
                target = min(bench.max_trials, target + bench.trials)
        return vb.results()
