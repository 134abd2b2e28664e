"""run_suite against canned servers, and the regression / equivalence / noise-floor judgement.

The servers here are fakes (aiohttp, scripted answers): they script what a real vLLM does
only by chance (an answer that changes with the batch shape, a flip that does not
reproduce). tests/e2e runs the suite on the real CPU vLLM.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from specexp.launch.base import Endpoint
from specexp.record.results import SuiteCaseResult, SuiteResult
from specexp.suite.cases import SuiteCase, parse_cases
from specexp.suite.runner import (
    first_divergence,
    generated_ids,
    judge_against_baseline,
    run_suite,
    sign_test_p,
)

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

Answer = tuple[dict[str, Any], str, list[int]]  # message, finish_reason, generated ids


def canned(prompt: str) -> Answer:
    if "weather" in prompt:
        call = {"function": {"name": "get_weather", "arguments": "{}"}}
        return {"content": None, "tool_calls": [call]}, "tool_calls", [9, 9, 9]
    if "count" in prompt:
        return {"content": "1, 2, 3, 4,"}, "length", [16, 11, 17, 11, 18]  # cut off at max_tokens
    return {"content": "Paris"}, "stop", [3271, 2]


def serve_and_run(
    server_args: list[str],
    answer: Callable[[str, int], Answer] = lambda prompt, _n: canned(prompt),
    *,
    ids_via: str = "token_ids",
    cases: list[SuiteCase] = CASES,
    **kwargs: Any,
) -> tuple[SuiteResult, list[dict[str, Any]]]:
    """Run the suite against a canned server; ``answer(prompt, n)`` gets the prompt's n-th ask.

    ``ids_via``: how the server reports ids (``token_ids`` as vLLM >= 0.10.2, ``logprobs``
    only, as an older vLLM that ignores ``return_token_ids``, or ``none``)."""
    seen: list[dict[str, Any]] = []
    asks: dict[str, int] = {}

    async def handler(request: web.Request) -> web.Response:
        body = await request.json()
        seen.append(body)
        prompt = body["messages"][-1]["content"]
        asks[prompt] = asks.get(prompt, 0) + 1
        message, finish, ids = answer(prompt, asks[prompt])
        choice: dict[str, Any] = {"message": message, "finish_reason": finish}
        if ids_via == "token_ids" and body.get("return_token_ids"):
            choice["token_ids"] = ids
        if ids_via == "logprobs" and body.get("logprobs") and body.get("return_tokens_as_token_ids"):
            choice["logprobs"] = {"content": [{"token": f"token_id:{i}", "logprob": 0.0} for i in ids]}
        return web.json_response({"choices": [choice], "usage": {"completion_tokens": len(ids)}})

    async def go() -> SuiteResult:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", handler)
        async with TestServer(app) as server:
            endpoint = Endpoint(base_url=str(server.make_url("")).rstrip("/"), model="m")
            return await run_suite(endpoint, "canned", cases, server_args=server_args, **kwargs)

    return asyncio.run(go()), seen


TOOLS = ["--enable-auto-tool-choice", "--tool-call-parser=hermes"]


def test_cases_run_with_their_options_and_a_cut_off_answer_fails() -> None:
    result, seen = serve_and_run(TOOLS)
    by = {c.name: c for c in result.cases}
    assert by["capital"].passed is True and by["capital"].completion_tokens == 2
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


# -- token ids -----------------------------------------------------------------------------


def test_answers_carry_the_generated_token_ids() -> None:
    result, seen = serve_and_run(TOOLS)
    assert all(body["return_token_ids"] is True and "logprobs" not in body for body in seen)
    assert [c.token_ids for c in result.cases] == [[3271, 2], [16, 11, 17, 11, 18], [9, 9, 9]]


def test_ids_come_from_logprobs_where_the_server_ignores_return_token_ids() -> None:
    result, seen = serve_and_run(TOOLS, ids_via="logprobs")
    assert [c.token_ids for c in result.cases] == [[3271, 2], [16, 11, 17, 11, 18], [9, 9, 9]]
    assert len(seen) == 4  # the first case asked again with logprobs, then the server is known
    assert [bool(b.get("logprobs")) for b in seen] == [False, True, True, True]


def test_a_server_without_ids_leaves_them_empty_and_equivalence_falls_back_to_text() -> None:
    result, _ = serve_and_run(TOOLS, ids_via="none")
    assert all(c.token_ids is None for c in result.cases)
    base = SuiteResult(name="s", cases=[case("capital", True, "Paris")])
    judge_against_baseline(result, base)
    capital = result.cases[0]
    assert capital.equivalent is True and capital.divergence_unit == "char"


def test_generated_ids_ignore_logprobs_that_are_not_ids() -> None:
    assert generated_ids({"logprobs": {"content": [{"token": "Paris"}]}}) is None
    assert generated_ids({"token_ids": [], "logprobs": None}) == []


def case(name: str, passed: bool | None, output: str, ids: list[int] | None = None) -> SuiteCaseResult:
    return SuiteCaseResult(name=name, check="exact", passed=passed, reason="", output=output, token_ids=ids)


def test_equivalence_is_judged_on_generated_ids_not_on_the_text() -> None:
    # the same text from different token sequences ("Par"+"is" against "Paris"): vLLM decodes
    # both to "Paris", and re-encoding the text would call them equal
    base = SuiteResult(
        name="s", cases=[case("a", True, "Paris", [3271]), case("b", True, "x y z", [1, 2, 3])]
    )
    var = SuiteResult(
        name="s", cases=[case("a", True, "Paris", [47, 285]), case("b", True, "x y q", [1, 2, 4])]
    )
    judge_against_baseline(var, base)
    a, b = var.cases
    assert a.equivalent is False and a.first_divergence == 0 and a.divergence_unit == "token"
    assert b.equivalent is False and b.first_divergence == 2
    assert first_divergence([1, 2], [1, 2, 3]) == 2 and first_divergence([1], [1]) is None


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


def test_divergence_is_counted_in_re_encoded_tokens_for_answers_without_ids() -> None:
    class Words:
        def encode(self, text: str, add_special_tokens: bool = False) -> list[str]:
            return text.split()

    base = SuiteResult(name="s", cases=[case("a", True, "one two three four")])
    var = SuiteResult(name="s", cases=[case("a", True, "one two tree four")])
    judge_against_baseline(var, base, tokenizer=Words())
    assert var.cases[0].first_divergence == 2 and var.cases[0].divergence_unit == "retokenized"


# -- the baseline's own noise ----------------------------------------------------------------


def test_the_baseline_answers_a_second_time_all_at_once_and_reports_its_self_match() -> None:
    ask = {"check": {"kind": "regex", "pattern": "."}}
    many = parse_cases(
        {f"c{i}": {"messages": [{"role": "user", "content": f"q{i}"}], **ask} for i in range(6)}, "c"
    )
    in_flight = 0
    most = 0
    arrived = 0
    everyone = asyncio.Event()

    def answer(prompt: str, n: int) -> Answer:
        # q3's greedy answer depends on the batch shape: alone it is [1, 2, 3], in a crowd [1, 2, 4]
        crowd = n == 2
        return {"content": "ok"}, "stop", [1, 2, 4] if prompt == "q3" and crowd else [1, 2, 3]

    async def run() -> SuiteResult:
        nonlocal in_flight, most, arrived

        async def handler(request: web.Request) -> web.Response:
            nonlocal in_flight, most, arrived
            body = await request.json()
            arrived += 1
            in_flight += 1
            most = max(most, in_flight)
            if arrived > len(many):  # the second pass: hold each answer until all have arrived
                if arrived == 2 * len(many):
                    everyone.set()
                await asyncio.wait_for(everyone.wait(), 30)
            message, finish, ids = answer(body["messages"][-1]["content"], 2 if arrived > len(many) else 1)
            in_flight -= 1
            return web.json_response(
                {"choices": [{"message": message, "finish_reason": finish, "token_ids": ids}]}
            )

        app = web.Application()
        app.router.add_post("/v1/chat/completions", handler)
        async with TestServer(app) as server:
            endpoint = Endpoint(base_url=str(server.make_url("")).rstrip("/"), model="m")
            return await run_suite(endpoint, "canned", many, server_args=[], repeat=True)

    result = asyncio.run(run())
    assert most == len(many)  # the second pass had every case in flight at once
    assert result.repeat is not None and len(result.repeat.cases) == len(many)
    by = {c.name: c for c in result.cases}
    assert by["c3"].repeat_equivalent is False and by["c3"].repeat_divergence == 2
    assert by["c0"].repeat_equivalent is True and by["c0"].repeat_passed is True
    assert result.self_equivalence_rate == pytest.approx(5 / 6)


def paired(n: int, unstable: set[int], diverging: set[int]) -> tuple[SuiteResult, SuiteResult]:
    """A baseline of n cases, unstable (its two passes differ) on ``unstable``, and a variant
    that diverges from it on ``diverging``."""
    base = SuiteResult(name="s", cases=[case(f"c{i}", True, "x", [i]) for i in range(n)])
    for i, c in enumerate(base.cases):
        c.repeat_passed, c.repeat_equivalent = True, i not in unstable
    var = SuiteResult(
        name="s", cases=[case(f"c{i}", True, "x", [i + 1000] if i in diverging else [i]) for i in range(n)]
    )
    judge_against_baseline(var, base)
    return base, var


def test_a_variant_is_flagged_only_when_it_diverges_clearly_more_than_the_baseline_from_itself() -> None:
    # as noisy as the baseline, on the cases where the baseline is noisy: not flagged
    _, same_noise = paired(17, unstable={0, 1, 2, 3}, diverging={0, 1, 2, 3})
    assert same_noise.baseline_self_equivalence == pytest.approx(13 / 17)
    assert same_noise.equivalence_rate == pytest.approx(13 / 17)
    assert same_noise.diverges_beyond_noise is False and same_noise.divergence_p == 1.0
    # 4 divergences where the baseline reproduced itself: could be chance (p = 1/16)
    _, four = paired(17, unstable=set(), diverging={0, 1, 2, 3})
    assert four.diverges_beyond_noise is False and four.divergence_p == pytest.approx(1 / 16)
    # 5 of them: flagged (p = 1/32)
    _, five = paired(17, unstable=set(), diverging={0, 1, 2, 3, 4})
    assert five.diverges_beyond_noise is True and five.divergence_p == pytest.approx(1 / 32)
    assert five.cases[0].baseline_stable is True
    # as many divergences, but the baseline also differs from itself where the variant does not
    _, offset = paired(17, unstable={10, 11, 12}, diverging={0, 1, 2, 3, 4})
    assert offset.diverges_beyond_noise is False


def test_without_a_second_baseline_pass_there_is_no_noise_verdict() -> None:
    base = SuiteResult(name="s", cases=[case("a", True, "x", [1])])
    var = SuiteResult(name="s", cases=[case("a", True, "y", [2])])
    judge_against_baseline(var, base)
    assert var.baseline_self_equivalence is None and var.diverges_beyond_noise is None


def test_sign_test_matches_brute_force_enumeration() -> None:
    for worse, better in [(0, 0), (5, 0), (4, 1), (7, 3), (2, 6)]:
        n = worse + better
        outcomes = list(itertools.product([0, 1], repeat=n))
        brute = sum(1 for o in outcomes if sum(o) >= worse) / len(outcomes)
        assert sign_test_p(worse, better) == pytest.approx(brute)


# -- regressions must reproduce ----------------------------------------------------------------


def passing_baseline(repeat_passed: bool | None = True) -> SuiteResult:
    base = SuiteResult(name="canned", cases=[case("capital", True, "Paris", [3271, 2])])
    base.cases[0].repeat_passed = repeat_passed
    return base


def lyon_then(second: str) -> Callable[[str, int], Answer]:
    def answer(prompt: str, n: int) -> Answer:
        if "capital" in prompt:
            text = "Lyon" if n == 1 else second
            return {"content": text}, "stop", [1] if text == "Lyon" else [3271, 2]
        return canned(prompt)

    return answer


def test_a_flip_that_reproduces_is_a_regression() -> None:
    result, seen = serve_and_run(TOOLS, lyon_then("Lyon"), cases=CASES[:1], baseline=passing_baseline())
    capital = result.cases[0]
    assert len(seen) == 2  # the failed case was asked again
    assert capital.recheck_passed is False and capital.regression and not capital.flaky
    assert result.regressions == ["capital"] and result.flaky == []


def test_a_flip_that_does_not_reproduce_is_flaky_not_a_regression() -> None:
    result, seen = serve_and_run(TOOLS, lyon_then("Paris"), cases=CASES[:1], baseline=passing_baseline())
    capital = result.cases[0]
    assert len(seen) == 2 and capital.recheck_passed is True
    assert capital.flaky and not capital.regression
    assert result.regressions == [] and result.flaky == ["capital"]
    assert capital.passed is False  # its first answer still failed, and says so


def test_a_flip_against_a_baseline_that_failed_its_own_second_pass_is_flaky() -> None:
    result, _ = serve_and_run(
        TOOLS, lyon_then("Lyon"), cases=CASES[:1], baseline=passing_baseline(repeat_passed=False)
    )
    assert result.cases[0].flaky and result.regressions == []


def test_cases_that_did_not_flip_are_not_asked_again() -> None:
    result, seen = serve_and_run(
        TOOLS, baseline=SuiteResult(name="canned", cases=[case("capital", True, "Paris")])
    )
    assert len(seen) == 3 and all(c.recheck_passed is None for c in result.cases)
