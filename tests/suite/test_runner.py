"""run_suite against a canned server, and the regression/equivalence judgement."""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestServer

from specexp.launch.base import Endpoint
from specexp.record.results import SuiteCaseResult, SuiteResult
from specexp.suite.cases import parse_cases
from specexp.suite.runner import first_divergence, judge_against_baseline, run_suite

CASES = parse_cases(
    {
        "capital": {
            "messages": [{"role": "user", "content": "capital of France?"}],
            "chat_template_kwargs": {"thinking": False},
            "check": {"kind": "exact", "expected": "Paris"},
        },
        "count": {
            "messages": [{"role": "user", "content": "count to 20"}],
            "max_tokens": 5,
            "check": {"kind": "regex", "pattern": "1, 2"},
        },
        "weather": {
            "messages": [{"role": "user", "content": "weather?"}],
            "requires": ["--enable-auto-tool-choice"],
            "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}],
            "check": {"kind": "tool_call", "function": "get_weather"},
        },
    },
    "canned",
)


def serve_and_run(server_args: list[str]) -> tuple[SuiteResult, list[dict[str, Any]]]:
    seen: list[dict[str, Any]] = []

    async def handler(request: web.Request) -> web.Response:
        body = await request.json()
        seen.append(body)
        prompt = body["messages"][-1]["content"]
        if "weather" in prompt:
            message = {
                "content": None,
                "tool_calls": [{"function": {"name": "get_weather", "arguments": "{}"}}],
            }
            finish = "tool_calls"
        elif "count" in prompt:
            message, finish = {"content": "1, 2, 3, 4,"}, "length"  # cut off at max_tokens
        else:
            message, finish = {"content": "Paris"}, "stop"
        return web.json_response(
            {"choices": [{"message": message, "finish_reason": finish}], "usage": {"completion_tokens": 3}}
        )

    async def go() -> SuiteResult:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", handler)
        async with TestServer(app) as server:
            endpoint = Endpoint(base_url=str(server.make_url("")).rstrip("/"), model="m")
            return await run_suite(endpoint, "canned", CASES, server_args=server_args)

    return asyncio.run(go()), seen


def test_cases_run_with_their_options_and_a_cut_off_answer_fails() -> None:
    result, seen = serve_and_run(["--enable-auto-tool-choice", "--tool-call-parser=hermes"])
    by = {c.name: c for c in result.cases}
    assert by["capital"].passed is True and by["capital"].completion_tokens == 3
    assert by["count"].passed is False and "finish_reason=length" in by["count"].reason
    assert by["weather"].passed is True and by["weather"].tool_calls
    assert seen[0]["temperature"] == 0.0 and seen[0]["chat_template_kwargs"] == {"thinking": False}
    assert "tools" in seen[2] and "stream" not in seen[0]
    assert (result.passed, result.failed, result.not_run) == (2, 1, 0)


def test_a_case_whose_server_flag_is_missing_is_not_run_and_not_failed() -> None:
    result, seen = serve_and_run([])
    weather = next(c for c in result.cases if c.name == "weather")
    assert weather.passed is None and "--enable-auto-tool-choice" in weather.reason
    assert len(seen) == 2 and result.not_run == 1


def case(name: str, passed: bool | None, output: str) -> SuiteCaseResult:
    return SuiteCaseResult(name=name, check="exact", passed=passed, reason="", output=output)


def test_regression_means_pass_at_baseline_and_fail_in_the_variant() -> None:
    base = SuiteResult(
        name="s",
        cases=[case("a", True, "Paris"), case("b", False, "x"), case("c", True, "4"), case("d", None, "")],
    )
    var = SuiteResult(
        name="s",
        cases=[case("a", False, "Lyon"), case("b", False, "x"), case("c", True, "4"), case("d", None, "")],
    )
    judge_against_baseline(var, base, tokenizer=None)
    by = {c.name: c for c in var.cases}
    assert by["a"].regression and by["a"].baseline_passed is True
    assert not by["b"].regression  # fails at the baseline too: the model, not the variant
    assert by["c"].equivalent and by["c"].first_divergence is None
    assert by["a"].first_divergence == 0 and by["a"].divergence_unit == "char"
    assert by["d"].equivalent is None  # not run: not judged
    assert var.regressions == ["a"] and var.equivalence_rate == 2 / 3


def test_divergence_is_counted_in_tokens_when_the_tokenizer_is_there() -> None:
    class Words:
        def encode(self, text: str, add_special_tokens: bool = False) -> list[str]:
            return text.split()

    base = SuiteResult(name="s", cases=[case("a", True, "one two three four")])
    var = SuiteResult(name="s", cases=[case("a", True, "one two tree four")])
    judge_against_baseline(var, base, tokenizer=Words())
    assert var.cases[0].first_divergence == 2 and var.cases[0].divergence_unit == "token"
    assert first_divergence([1, 2], [1, 2, 3]) == 2 and first_divergence([1], [1]) is None
