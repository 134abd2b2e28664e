"""Run a suite against a live server, then judge it against the sweep's baseline.

Cases run one at a time, non-streaming, at temperature 0 with a fixed seed: the point is
the answer, and one request at a time keeps batch shapes (and so greedy outputs) as
stable as the engine allows.

Greedy equivalence compares the generated token ids the server reports
(``return_token_ids``, vLLM >= 0.10.2; ``logprobs`` with ``return_tokens_as_token_ids``
where the server ignores it), and names the first differing position. Greedy output is
bit-stable only up to numerics, with or without speculation, so the baseline answers the
suite a second time with every case sent at once (another batch shape): how often it
agrees with itself is the noise floor a variant's agreement is read against.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Sequence
from typing import Any, Literal

import httpx

from specexp.launch.base import Endpoint
from specexp.record.results import SuiteCaseResult, SuiteResult
from specexp.suite.cases import SuiteCase
from specexp.suite.checks import run_check

ALPHA = 0.05  # divergence beyond the baseline's own noise: one-sided, at this level
TOKEN_ID_PREFIX = "token_id:"
REQUEST_FAILED = "request failed: "
Unit = Literal["token", "retokenized", "char"]


def _has_flag(server_args: Sequence[str], flag: str) -> bool:
    return any(a == flag or a.startswith(flag + "=") for a in server_args)


class _Asker:
    """Asks one case; learns once per server whether ids come as ``token_ids`` or logprobs."""

    def __init__(self, client: httpx.AsyncClient, endpoint: Endpoint, seed: int) -> None:
        self.client, self.endpoint, self.seed = client, endpoint, seed
        self.via_logprobs: bool | None = None  # None: not known yet

    async def _post(self, case: SuiteCase, logprobs: bool) -> dict[str, Any]:
        payload: dict[str, Any] = {
            "model": self.endpoint.model,
            "messages": case.rendered_messages(),
            "max_tokens": case.max_tokens,
            "temperature": 0.0,
            "seed": self.seed,
            "return_token_ids": True,
        }
        if logprobs:
            payload |= {"logprobs": True, "top_logprobs": 0, "return_tokens_as_token_ids": True}
        if case.tools:
            payload["tools"] = case.tools
        if case.chat_template_kwargs:
            payload["chat_template_kwargs"] = case.chat_template_kwargs
        resp = await self.client.post(f"{self.endpoint.base_url}/v1/chat/completions", json=payload)
        if resp.status_code != 200:
            raise httpx.HTTPStatusError(
                f"HTTP {resp.status_code}: {resp.text[:200]}", request=resp.request, response=resp
            )
        return dict(resp.json())

    async def ask(self, case: SuiteCase) -> dict[str, Any]:
        body = await self._post(case, logprobs=bool(self.via_logprobs))
        if self.via_logprobs is None and _first_choice(body).get("token_ids") is None:
            self.via_logprobs = True  # the server ignored return_token_ids: ask for the ids another way
            body = await self._post(case, logprobs=True)
        elif self.via_logprobs is None:
            self.via_logprobs = False
        return body


def _first_choice(body: dict[str, Any]) -> dict[str, Any]:
    return dict((body.get("choices") or [{}])[0])


def generated_ids(choice: dict[str, Any]) -> list[int] | None:
    """The generated ids of one choice: ``token_ids``, else ``token_id:N`` logprob tokens."""
    ids = choice.get("token_ids")
    if ids is not None:
        return [int(i) for i in ids]
    content = (choice.get("logprobs") or {}).get("content")
    tokens = [str(e.get("token", "")) for e in content or []]
    if not tokens or not all(t.startswith(TOKEN_ID_PREFIX) for t in tokens):
        return None
    return [int(t.removeprefix(TOKEN_ID_PREFIX)) for t in tokens]


def _not_run(case: SuiteCase, server_args: Sequence[str]) -> SuiteCaseResult | None:
    missing = [f for f in case.requires if not _has_flag(server_args, f)]
    if not missing:
        return None
    reason = f"not run: the server needs {' '.join(missing)} (server.extra_args)"
    return SuiteCaseResult(name=case.name, check=case.check.kind, passed=None, reason=reason)


def _request_failed(case: SuiteCase, exc: BaseException) -> SuiteCaseResult:
    return SuiteCaseResult(
        name=case.name, check=case.check.kind, passed=False, reason=f"{REQUEST_FAILED}{exc}"[:200]
    )


def judge_answer(
    case: SuiteCase, body: dict[str, Any], latency_s: float, code_timeout_s: float
) -> SuiteCaseResult:
    """Run the case's check on one response body."""
    choice = _first_choice(body)
    message = choice.get("message") or {}
    text = message.get("content") or ""
    tool_calls = list(message.get("tool_calls") or [])
    finish = choice.get("finish_reason")
    passed, reason = run_check(case.check, text, tool_calls, code_timeout_s)
    if passed and case.complete and finish == "length":
        passed, reason = False, f"cut off at max_tokens={case.max_tokens} (finish_reason=length)"
    return SuiteCaseResult(
        name=case.name,
        check=case.check.kind,
        passed=passed,
        reason=reason,
        output=text,
        tool_calls=tool_calls,
        token_ids=generated_ids(choice),
        finish_reason=finish,
        completion_tokens=(body.get("usage") or {}).get("completion_tokens"),
        latency_s=round(latency_s, 4),
    )


async def _one(asker: _Asker, case: SuiteCase, code_timeout_s: float) -> SuiteCaseResult:
    start = time.perf_counter()
    try:
        body = await asker.ask(case)
    except httpx.HTTPError as exc:
        return _request_failed(case, exc)
    return judge_answer(case, body, time.perf_counter() - start, code_timeout_s)


async def _all_at_once(asker: _Asker, cases: list[SuiteCase], code_timeout_s: float) -> list[SuiteCaseResult]:
    """Every case in flight together (another batch shape); checks run once all answered."""

    async def timed(case: SuiteCase) -> tuple[dict[str, Any] | BaseException, float]:
        start = time.perf_counter()
        try:
            return await asker.ask(case), time.perf_counter() - start
        except httpx.HTTPError as exc:
            return exc, 0.0

    answers = await asyncio.gather(*(timed(c) for c in cases))
    return [
        _request_failed(case, body)
        if isinstance(body, BaseException)
        else judge_answer(case, body, t, code_timeout_s)
        for case, (body, t) in zip(cases, answers, strict=True)
    ]


async def run_suite(
    endpoint: Endpoint,
    name: str,
    cases: list[SuiteCase],
    *,
    server_args: Sequence[str],
    seed: int = 0,
    timeout_s: float = 120.0,
    code_timeout_s: float = 10.0,
    progress: Callable[[str], None] | None = None,
    repeat: bool = False,
    baseline: SuiteResult | None = None,
    tokenizer: Any | None = None,
) -> SuiteResult:
    """Ask every case once, one at a time, and check each answer.

    ``repeat`` (the baseline): then ask every case again, all at once, and record how
    often the answer is the same (the noise floor of greedy equivalence).
    ``baseline`` (a variant): re-ask each case that passed at the baseline and failed
    here, then judge every case against the baseline (``judge_against_baseline``).
    """
    say = progress or (lambda _m: None)
    results: list[SuiteCaseResult] = []
    t0 = time.perf_counter()
    async with httpx.AsyncClient(timeout=timeout_s) as client:
        asker = _Asker(client, endpoint, seed)
        runnable: list[SuiteCase] = []
        for i, case in enumerate(cases):
            say(f"suite {name} {i + 1}/{len(cases)} · {case.name}")
            skipped = _not_run(case, server_args)
            if skipped is None:
                runnable.append(case)
            results.append(skipped or await _one(asker, case, code_timeout_s))
        result = SuiteResult(name=name, cases=results)
        if repeat and runnable:
            say(f"suite {name}: all {len(runnable)} case(s) again at once (the baseline's own noise)")
            t_again = time.perf_counter()
            again = await _all_at_once(asker, runnable, code_timeout_s)
            result.repeat = SuiteResult(name=name, cases=again)
            result.repeat.wall_s = round(time.perf_counter() - t_again, 3)
            compare_repeat(result, tokenizer)
        if baseline is not None:
            by_name = {c.name: c for c in cases}
            for flip in flips(result, baseline):
                say(f"suite {name}: {flip.name} passed at the baseline and failed here; asking again")
                again_one = await _one(asker, by_name[flip.name], code_timeout_s)
                flip.recheck_passed, flip.recheck_reason = again_one.passed, again_one.reason
            judge_against_baseline(result, baseline, tokenizer)
    result.wall_s = round(time.perf_counter() - t0, 3)
    return result


def _answer(c: SuiteCaseResult) -> str:
    calls = "".join(
        f"\n<tool_call>{(tc.get('function') or {}).get('name')}{(tc.get('function') or {}).get('arguments')}"
        for tc in c.tool_calls
    )
    return c.output + calls


def first_divergence(a: Sequence[Any], b: Sequence[Any]) -> int | None:
    """Index of the first differing element, ``None`` when equal (a prefix differs at its end)."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def divergence(a: SuiteCaseResult, b: SuiteCaseResult, tokenizer: Any | None) -> tuple[int | None, Unit]:
    """First differing position of two answers and its unit: generated token ids when both
    have them; else the text, re-encoded when a tokenizer is given, or by character."""
    if a.token_ids is not None and b.token_ids is not None:
        return first_divergence(a.token_ids, b.token_ids), "token"
    x, y = _answer(a), _answer(b)
    if tokenizer is not None:
        encode = tokenizer.encode
        return first_divergence(encode(x, add_special_tokens=False), encode(y, add_special_tokens=False)), (
            "retokenized"
        )
    return first_divergence(x, y), "char"


def _answered(c: SuiteCaseResult) -> bool:
    return c.passed is not None and not c.reason.startswith(REQUEST_FAILED)


def compare_repeat(result: SuiteResult, tokenizer: Any | None = None) -> None:
    """Baseline: mark each case answered the same (or not) in its second pass."""
    assert result.repeat is not None
    again = {c.name: c for c in result.repeat.cases}
    for case in result.cases:
        other = again.get(case.name)
        if other is None or not _answered(case) or not _answered(other):
            continue  # not run, or a request failed: no pair of answers to compare
        case.repeat_passed = other.passed
        case.repeat_divergence, _ = divergence(case, other, tokenizer)
        case.repeat_equivalent = case.repeat_divergence is None


def flips(result: SuiteResult, baseline: SuiteResult) -> list[SuiteCaseResult]:
    """Cases that passed at the baseline (first answer) and failed here."""
    passed_there = {c.name for c in baseline.cases if c.passed is True}
    return [c for c in result.cases if c.passed is False and c.name in passed_there]


def sign_test_p(worse: int, better: int) -> float:
    """P(X >= worse) for X ~ Binomial(worse + better, 1/2): the exact one-sided McNemar test."""
    n = worse + better
    return sum(math.comb(n, k) for k in range(worse, n + 1)) / 2**n


def judge_against_baseline(result: SuiteResult, baseline: SuiteResult, tokenizer: Any | None = None) -> None:
    """Mark regressions, flaky flips and greedy equivalence per case, and whether the
    variant diverges from the baseline clearly more than the baseline does from itself.

    A flip is a regression when the baseline passed every answer it gave (its run and its
    second pass) and the variant failed every answer it gave (its run and its re-ask);
    answers never given do not count. Noise rule, on the cases where both sides have an
    equivalence: ``worse`` = the variant diverges where the baseline reproduced itself,
    ``better`` = the variant matches where the baseline did not; under "no more divergence
    than the baseline's own" both are equally likely, so the variant is flagged when the
    exact one-sided McNemar p of ``worse`` against ``better`` is below ``ALPHA`` (with no
    ``better`` case, 5 such cases are needed: p = 1/32).
    """
    base = {c.name: c for c in baseline.cases}
    worse = better = 0
    for case in result.cases:
        ref = base.get(case.name)
        if ref is None:
            continue
        case.baseline_passed = ref.passed
        case.baseline_stable = ref.repeat_equivalent
        if ref.passed is True and case.passed is False:
            theirs = [a for a in (ref.passed, ref.repeat_passed) if a is not None]
            ours = [a for a in (case.passed, case.recheck_passed) if a is not None]
            case.regression = all(theirs) and not any(ours)
            case.flaky = not case.regression
        if case.passed is None or ref.passed is None:
            continue
        case.first_divergence, case.divergence_unit = divergence(ref, case, tokenizer)
        case.equivalent = case.first_divergence is None
        if ref.repeat_equivalent is not None:
            worse += ref.repeat_equivalent and not case.equivalent
            better += case.equivalent and not ref.repeat_equivalent
    result.baseline_self_equivalence = baseline.self_equivalence_rate
    if result.baseline_self_equivalence is not None:
        result.divergence_p = sign_test_p(worse, better)
        result.diverges_beyond_noise = result.divergence_p < ALPHA
