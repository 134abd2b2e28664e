from __future__ import annotations

import pytest

from specexp.config.compose import plan_sweep
from specexp.errors import ConfigError
from specexp.suite.cases import parse_cases


def test_the_default_suite_has_17_cases_covering_every_check_kind() -> None:
    (variant,) = plan_sweep(["spec=none"], with_baseline=False)
    assert variant.config.suite.name == "regression17"
    cases = parse_cases(variant.config.suite.cases, "regression17")
    assert len(cases) == 17
    assert {c.check.kind for c in cases} == {"exact", "regex", "json_schema", "tool_call", "code", "numeric"}
    assert any(c.name.startswith("count_") for c in cases)
    tool = next(c for c in cases if c.check.kind == "tool_call")
    assert tool.requires and tool.tools


def test_long_context_case_hides_its_needle_in_the_middle_of_the_haystack() -> None:
    (variant,) = plan_sweep(["spec=none"], with_baseline=False)
    case = next(c for c in parse_cases(variant.config.suite.cases, "r") if c.haystack_words)
    text = case.rendered_messages()[0]["content"]
    assert "{haystack}" not in text and "access code is 7391" in text
    at = text.index("7391") / len(text)
    assert 0.3 < at < 0.7 and len(text.split()) > case.haystack_words


def test_a_bad_case_names_the_suite_case_and_field() -> None:
    with pytest.raises(ConfigError, match=r"suite s, case c1: check.kind"):
        parse_cases({"c1": {"messages": [], "check": {"kind": "fuzzy"}}}, "s")
    with pytest.raises(ConfigError, match=r"case c2: max_tokns"):
        parse_cases(
            {"c2": {"messages": [], "max_tokns": 3, "check": {"kind": "exact", "expected": "x"}}}, "s"
        )
