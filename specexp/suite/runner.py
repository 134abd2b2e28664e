"""Run a suite against a live server, then judge it against the sweep's baseline.

Cases run one at a time, non-streaming, at temperature 0 with a fixed seed: the point is
the answer, and one request at a time keeps batch shapes (and so greedy outputs) as
stable as the engine allows. Greedy equivalence is judged on token ids when the model's
tokenizer is on this machine, on characters otherwise; a divergence is reported with
its position, not hidden (bf16 rounding can make benign ones).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import httpx

from specexp.launch.base import Endpoint
from specexp.record.results import SuiteCaseResult, SuiteResult
from specexp.suite.cases import SuiteCase
from specexp.suite.checks import run_check


def _has_flag(server_args: Sequence[str], flag: str) -> bool:
    return any(a == flag or a.startswith(flag + "=") for a in server_args)


async def _ask(client: httpx.AsyncClient, endpoint: Endpoint, case: SuiteCase, seed: int) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "model": endpoint.model,
        "messages": case.rendered_messages(),
        "max_tokens": case.max_tokens,
        "temperature": 0.0,
        "seed": seed,
    }
    if case.tools:
        payload["tools"] = case.tools
    if case.chat_template_kwargs:
        payload["chat_template_kwargs"] = case.chat_template_kwargs
    resp = await client.post(f"{endpoint.base_url}/v1/chat/completions", json=payload)
    if resp.status_code != 200:
        raise httpx.HTTPStatusError(
            f"HTTP {resp.status_code}: {resp.text[:200]}", request=resp.request, response=resp
        )
    return dict(resp.json())


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
) -> SuiteResult:
    say = progress or (lambda _m: None)
    results: list[SuiteCaseResult] = []
    t0 = time.perf_counter()
    async with httpx.AsyncClient(timeout=timeout_s) as client:
        for i, case in enumerate(cases):
            say(f"suite {name} {i + 1}/{len(cases)} · {case.name}")
            missing = [f for f in case.requires if not _has_flag(server_args, f)]
            if missing:
                reason = f"not run: the server needs {' '.join(missing)} (server.extra_args)"
                results.append(
                    SuiteCaseResult(name=case.name, check=case.check.kind, passed=None, reason=reason)
                )
                continue
            start = time.perf_counter()
            try:
                body = await _ask(client, endpoint, case, seed)
            except httpx.HTTPError as exc:
                results.append(
                    SuiteCaseResult(
                        name=case.name,
                        check=case.check.kind,
                        passed=False,
                        reason=f"request failed: {exc}"[:200],
                    )
                )
                continue
            choice = (body.get("choices") or [{}])[0]
            message = choice.get("message") or {}
            text = message.get("content") or ""
            tool_calls = list(message.get("tool_calls") or [])
            finish = choice.get("finish_reason")
            passed, reason = run_check(case.check, text, tool_calls, code_timeout_s)
            if passed and case.complete and finish == "length":
                passed, reason = False, f"cut off at max_tokens={case.max_tokens} (finish_reason=length)"
            results.append(
                SuiteCaseResult(
                    name=case.name,
                    check=case.check.kind,
                    passed=passed,
                    reason=reason,
                    output=text,
                    tool_calls=tool_calls,
                    finish_reason=finish,
                    completion_tokens=(body.get("usage") or {}).get("completion_tokens"),
                    latency_s=round(time.perf_counter() - start, 4),
                )
            )
    return SuiteResult(name=name, cases=results, wall_s=round(time.perf_counter() - t0, 3))


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


def judge_against_baseline(result: SuiteResult, baseline: SuiteResult, tokenizer: Any | None) -> None:
    """Mark regressions (pass at baseline, fail here) and greedy equivalence per case."""
    base = {c.name: c for c in baseline.cases}
    for case in result.cases:
        ref = base.get(case.name)
        if ref is None:
            continue
        case.baseline_passed = ref.passed
        case.regression = ref.passed is True and case.passed is False
        if case.passed is None or ref.passed is None:
            continue
        a, b = _answer(ref), _answer(case)
        if tokenizer is not None:
            seq_a, seq_b = (
                tokenizer.encode(a, add_special_tokens=False),
                tokenizer.encode(b, add_special_tokens=False),
            )
            case.divergence_unit = "token"
        else:
            seq_a, seq_b = list(a), list(b)
            case.divergence_unit = "char"
        case.first_divergence = first_divergence(seq_a, seq_b)
        case.equivalent = case.first_divergence is None
