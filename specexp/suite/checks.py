"""Deterministic checks of one answer: pass/fail plus a one-line reason.

``None`` for passed means the check could not be run here (no sandbox for code), which
is reported as such and never counted as a pass or a failure.
"""

from __future__ import annotations

import json
import re
from typing import Any

import jsonschema

from specexp.suite.cases import CheckSpec
from specexp.suite.sandbox import run_python

Outcome = tuple[bool | None, str]
_NUMBER = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?![\d,]*\d)")
_FENCE = re.compile(r"```[a-zA-Z0-9_+-]*\n(.*?)```", re.DOTALL)


def _short(text: str, n: int = 60) -> str:
    one = " ".join(text.split())
    return one if len(one) <= n else one[: n - 1] + "…"


def unfence(text: str) -> str:
    """The first fenced block's body, or the whole text."""
    m = _FENCE.search(text)
    return m.group(1) if m else text


def check_exact(spec: CheckSpec, text: str) -> Outcome:
    def norm(s: str) -> str:
        s = s.strip().rstrip(".!").strip()
        return s.casefold() if spec.ignore_case else s

    assert spec.expected is not None
    ok = norm(text) == norm(spec.expected)
    return ok, f"{'is' if ok else 'expected'} {spec.expected!r}" + ("" if ok else f", got {_short(text)!r}")


def check_regex(spec: CheckSpec, text: str) -> Outcome:
    assert spec.pattern is not None
    flags = re.MULTILINE | (re.IGNORECASE if spec.ignore_case else 0)
    ok = re.search(spec.pattern, text, flags) is not None
    return ok, f"{'matches' if ok else 'does not match'} /{spec.pattern}/" + (
        "" if ok else f": {_short(text)!r}"
    )


def check_json_schema(spec: CheckSpec, text: str) -> Outcome:
    body = unfence(text).strip()
    try:
        doc = json.loads(body)
    except json.JSONDecodeError as exc:
        return False, f"not JSON ({exc.msg} at char {exc.pos}): {_short(body)!r}"
    try:
        jsonschema.validate(doc, spec.json_schema or {})
    except jsonschema.ValidationError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "top level"
        return False, f"JSON does not fit the schema at {where}: {exc.message}"
    return True, "valid JSON, fits the schema"


def _same(expected: Any, got: Any) -> bool:
    if isinstance(expected, str) and isinstance(got, str):
        return expected.strip().casefold() == got.strip().casefold()
    return bool(expected == got)


def check_tool_call(spec: CheckSpec, tool_calls: list[dict[str, Any]]) -> Outcome:
    if not tool_calls:
        return False, f"no tool call (expected {spec.function})"
    fn = tool_calls[0].get("function") or {}
    if fn.get("name") != spec.function:
        return False, f"called {fn.get('name')!r}, expected {spec.function!r}"
    try:
        args = json.loads(fn.get("arguments") or "{}")
    except json.JSONDecodeError:
        return False, f"arguments are not JSON: {_short(str(fn.get('arguments')))!r}"
    if not isinstance(args, dict):
        return False, "arguments are not a JSON object"
    for key, want in (spec.arguments or {}).items():
        if key not in args:
            return False, f"{spec.function} called without {key!r}"
        if not _same(want, args[key]):
            return False, f"{spec.function}({key}={args[key]!r}), expected {want!r}"
    return True, f"called {spec.function} with the expected arguments"


def check_code(spec: CheckSpec, text: str, timeout_s: float) -> Outcome:
    program = unfence(text).rstrip() + "\n\n" + (spec.tests or "") + "\n"
    run = run_python(program, timeout_s=timeout_s)
    if not run.jailed:
        return None, f"not run: {run.stderr.strip().splitlines()[-1] if run.stderr.strip() else 'no sandbox'}"
    if run.timed_out:
        return False, f"code ran past {timeout_s:g}s and was killed"
    if run.returncode != 0:
        lines = run.stderr.strip().splitlines()
        return False, f"code failed (exit {run.returncode}): {_short(lines[-1] if lines else '', 80)}"
    return True, "code ran and its tests passed"


def check_numeric(spec: CheckSpec, text: str) -> Outcome:
    """The rule of ``cases.NUMERIC_RULE``: the last number in the answer."""
    found = _NUMBER.findall(text)
    if not found:
        return False, f"no number in {_short(text)!r}"
    got = float(found[-1].replace(",", ""))
    assert spec.value is not None
    ok = abs(got - spec.value) <= spec.tolerance
    return ok, f"last number {got:g} {'=' if ok else '≠'} {spec.value:g}" + (
        f" ± {spec.tolerance:g}" if spec.tolerance else ""
    )


def run_check(
    spec: CheckSpec, text: str, tool_calls: list[dict[str, Any]], code_timeout_s: float = 10.0
) -> Outcome:
    if spec.kind == "exact":
        return check_exact(spec, text)
    if spec.kind == "regex":
        return check_regex(spec, text)
    if spec.kind == "json_schema":
        return check_json_schema(spec, text)
    if spec.kind == "tool_call":
        return check_tool_call(spec, tool_calls)
    if spec.kind == "code":
        return check_code(spec, text, code_timeout_s)
    return check_numeric(spec, text)
