"""Run a variant's cases × trials against an Endpoint.

Warm-up requests come first and are not counted. Each measured window (one
case of one trial) is bracketed by two ``/metrics`` snapshots, so acceptance
belongs to exactly that window. Trials are the outer loop so slow drift of the
machine spreads over all cases instead of landing on the last one; an interleaved
sweep goes further and takes one trial of every variant per round.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

import aiohttp
import httpx

from specexp.config.schema import BenchConfig
from specexp.launch.base import Endpoint
from specexp.measure import client as streaming
from specexp.measure import prefix_cache, prometheus, workload
from specexp.measure.client import chat_payload, stream_chat
from specexp.measure.degenerate import is_looping
from specexp.measure.loadgen import RequestDefaults, build_payload, run_window
from specexp.measure.stats import (
    SERVER_GAP_LIMIT,
    case_verdict,
    look_confidence,
    server_metrics,
    summarize,
    trial_metrics,
)
from specexp.measure.traffic import CasePlan, plan_cases, slo_of, traffic_metrics, window
from specexp.record.results import (
    AcceptanceRecord,
    CaseResult,
    RequestRecord,
    TrialRecord,
    VariantResult,
)

Progress = Callable[[str], None]
EXTRA_WARMUPS = 3  # further warm-up requests while a speculative server has not drafted yet


async def _scrape(
    client: httpx.AsyncClient, url: str
) -> tuple[prometheus.Snapshot, prefix_cache.PrefixCacheCounters]:
    resp = await client.get(url, timeout=10.0)
    resp.raise_for_status()
    return prometheus.parse_metrics(resp.text), prefix_cache.parse(resp.text)


def _defaults(endpoint: Endpoint, bench: BenchConfig, plan: CasePlan) -> RequestDefaults:
    case = plan.case
    return RequestDefaults(endpoint.model, case.max_tokens, bench.temperature, bench.seed, case.ignore_eos)


def check_loops(records: list[RequestRecord]) -> None:
    """Mark outputs that loop; the guard reads the reasoning and the answer together (a
    model can loop while thinking and never reach an answer)."""
    for rec in records:
        rec.looping = is_looping(f"{rec.reasoning_text}\n{rec.text}" if rec.reasoning_text else rec.text)


async def _run_case(
    client: httpx.AsyncClient,
    streams: aiohttp.ClientSession,
    endpoint: Endpoint,
    bench: BenchConfig,
    plan: CasePlan,
    trial: int,
) -> TrialRecord:
    url = f"{endpoint.base_url}/v1/chat/completions"
    case = plan.case
    if bench.reset_prefix_cache:
        with contextlib.suppress(httpx.HTTPError):
            await client.post(f"{endpoint.control_base}/reset_prefix_cache", timeout=10.0)
    before, cache_before = await _scrape(client, endpoint.metrics_url)
    plan_window = window(plan, bench.seed, trial)
    started_at = time.time()
    t0 = time.perf_counter()
    records = await run_window(
        streams,
        url,
        plan_window,
        _defaults(endpoint, bench, plan),
        timeout_s=bench.request_timeout_s,
        t0=t0,
    )
    duration = time.perf_counter() - t0
    after, cache_after = await _scrape(client, endpoint.metrics_url)
    check_loops(records)  # after the window: the check is not part of what is timed
    reset = prometheus.reset_reason(before, after)
    if reset is not None:
        return TrialRecord(
            case=plan.name,
            trial=trial,
            started_at=started_at,
            duration_s=duration,
            requests=records,
            metrics={},
            error=f"not a measurement: {reset}",
        )
    acc = prometheus.delta(before, after)
    metrics = trial_metrics(records, duration, plan.streams)
    metrics.update(server_metrics(records, prometheus.server_window(before, after)))
    metrics.update(traffic_metrics(records, duration, slo_of(bench), plan.open_loop))
    hits = prefix_cache.hit_rate(cache_before, cache_after)
    if hits is not None:
        metrics["prefix_cache_hit_rate"] = hits
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
            consistent=acc.consistent,
            inconsistency=acc.inconsistency,
        )
        if acc.rate is not None:
            metrics["acceptance_rate"] = acc.rate
        if acc.mean_length is not None:
            metrics["acceptance_length"] = acc.mean_length
        for pos, rate in enumerate(acc.per_position):
            metrics[f"acceptance_pos{pos}"] = rate
    return TrialRecord(
        case=plan.name,
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
        self.plans = plan_cases(bench, endpoint.tokenizer)
        self.trials: dict[str, list[TrialRecord]] = {
            name: list((prior or {}).get(name, [])) for name in self.plans
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
        # both carry the endpoint's key (a server started with an API key, GPUStack, a
        # protected endpoint), so every request of the variant is authorised alike
        headers = self.endpoint.headers()
        self._client = httpx.AsyncClient(limits=limits, timeout=self.bench.request_timeout_s, headers=headers)
        self._streams = streaming.session(self.bench.request_timeout_s, headers)
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
        so the first timed trial does not pay vLLM's first-use costs of those shapes.

        The largest such cost is speculative: the ngram proposer is a numba kernel compiled
        at its first call (3.2 s on this machine; vLLM's own trigger at start-up passes an
        empty batch, which returns before the kernel runs), and without a warm-up the first
        request of the first trial spent ~4 CPU-seconds more than the same request later
        (243 against 121–136 ms of server CPU per token). So with speculation on, the
        warm-up goes on (up to ``EXTRA_WARMUPS`` longer requests) until the server's
        counters show that it has drafted."""
        assert self._client is not None
        planned = self.bench.warmup_requests
        if not planned:
            return
        for i in range(planned):
            self.say(f"warm-up {i + 1}/{planned}")
            await self._warm_up_request(i, longer=False)
        for extra in range(EXTRA_WARMUPS + 1):
            snap = await prometheus.scrape(self._client, self.endpoint.metrics_url)
            if not snap.has_spec or snap.drafts > 0:
                return
            if extra < EXTRA_WARMUPS:
                self.say(f"warm-up: no draft yet, a longer request ({extra + 1}/{EXTRA_WARMUPS})")
                await self._warm_up_request(planned + extra, longer=True)
        self.say("warm-up: the server made no draft; the first trial may pay first-use costs")

    async def _warm_up_request(self, i: int, longer: bool) -> None:
        assert self._streams is not None
        url = f"{self.endpoint.base_url}/v1/chat/completions"
        first = next(iter(self.plans.values()), None)
        if first is None:
            payload = chat_payload(
                self.endpoint.model,
                workload.warmup_prompt(),
                max_tokens=16,
                temperature=self.bench.temperature,
                seed=self.bench.seed,
            )
        else:
            convs = first.conversations
            payload = build_payload(convs[i % len(convs)][0], [], _defaults(self.endpoint, self.bench, first))
            for key in ("max_tokens", "max_completion_tokens"):
                if key in payload:
                    payload[key] = min(128 if longer else 32, payload[key])
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
        for name, plan in self.plans.items():
            self.say(f"trial {t + 1}/{of} · {name}")
            record = await _run_case(self._client, self._streams, self.endpoint, self.bench, plan, t)
            record.launch = self.launch
            self.trials[name].append(record)

    def results(self) -> dict[str, CaseResult]:
        return {name: _case_result(plan, self.bench, self.trials[name]) for name, plan in self.plans.items()}


def _case_result(plan: CasePlan, bench: BenchConfig, recs: list[TrialRecord]) -> CaseResult:
    ok = [r for r in recs if r.ok]
    keys = sorted({k for r in ok for k in r.metrics})
    summary = {}
    for key in keys:
        s = summarize(r.metrics[key] for r in ok if key in r.metrics)
        if s is not None:
            summary[key] = s
    # under open loop the offered load is fixed, so throughput says little: goodput (with
    # objectives) or each request's own decode speed is what a better variant improves
    primary = None
    if plan.open_loop:
        primary = "goodput_req_s" if slo_of(bench).active else "decode_tok_s"
    return CaseResult(
        case=plan.name,
        concurrency=plan.streams,
        primary_metric=primary,
        request_rate=plan.case.request_rate,
        burstiness=plan.case.burstiness,
        trials=recs,
        summary=summary,
        failed_requests=sum(1 for r in recs for q in r.requests if not q.ok),
        looping_outputs=sum(1 for r in recs for q in r.requests if q.ok and q.looping),
        failed_trials=len(recs) - len(ok),
        server_disagreements=sum(
            1 for r in ok if abs(r.metrics.get("client_server_gap", 0.0)) > SERVER_GAP_LIMIT
        ),
        acceptance_inconsistent=sum(
            1 for r in ok if r.acceptance is not None and not r.acceptance.consistent
        ),
    )


def undecided(
    cases: dict[str, CaseResult],
    baseline: dict[str, CaseResult] | None,
    confidence: float,
    trust_loops: bool = False,
    target_width: float | None = None,
) -> list[str]:
    """Cases whose main figure has no clear verdict against the baseline's cases yet (a
    case that is not trusted because its outputs loop is not helped by more trials).

    With ``target_width`` a case without a verdict is done too once its ratio's interval
    (at the same per-look confidence) is at most that wide: "within ±5 %" is an answer."""
    out = []
    for name, case in cases.items():
        base = (baseline or {}).get(name)
        verdict = case_verdict(case, base, confidence, trust_loops) if base is not None else None
        if verdict is None or verdict.verdict != "no clear difference":
            continue
        lo, hi = verdict.ci_low, verdict.ci_high
        if target_width is not None and lo is not None and hi is not None and hi - lo <= target_width:
            continue
        out.append(name)
    return out


def wants_more(
    bench: BenchConfig, cases: dict[str, CaseResult], baseline: dict[str, CaseResult] | None
) -> bool:
    """Whether adaptive trials add another batch: some case is still undecided at the
    per-look confidence (the error budget split over every look ``bench.max_trials`` allows)."""
    confidence = look_confidence(bench.trials, bench.max_trials)
    return bool(undecided(cases, baseline, confidence, bench.trust_loops, bench.target_width))


async def measure(
    endpoint: Endpoint,
    bench: BenchConfig,
    progress: Progress | None = None,
    baseline: VariantResult | None = None,
) -> dict[str, CaseResult]:
    """All of one variant's trials in a row; with ``bench.max_trials`` above ``bench.trials``,
    more batches follow while a case has no clear verdict against ``baseline`` (nor, with
    ``bench.target_width``, an interval that narrow)."""
    async with VariantBench(endpoint, bench, progress) as vb:
        target = bench.trials
        while vb.done < target:
            await vb.run_trial(target)
            base = baseline.cases if baseline else None
            if vb.done == target and target < bench.max_trials and wants_more(bench, vb.results(), base):
                target = min(bench.max_trials, target + bench.trials)
        return vb.results()
