"""Suite cases: what to ask, what the server needs for it, and how to check the answer.

A suite is a config group (``conf/suite/*.yaml``: ``suite=regression17``); its cases are
plain mappings in YAML, validated here so a typo names the case and the field.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from specexp.errors import ConfigError

NUMERIC_RULE = (
    "numeric: the expected value of the last number in the answer, as GSM8K-style graders read "
    'it ("17 + 25 = 42" is 42); thousands separators are read (1,024), lists are not (1,2,3 is 3)'
)

CheckKind = Literal["exact", "regex", "json_schema", "tool_call", "code", "numeric"]


class CheckSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    kind: CheckKind
    expected: str | None = None  # exact
    pattern: str | None = None  # regex (searched, multi-line)
    ignore_case: bool = True
    json_schema: dict[str, Any] | None = Field(default=None, alias="schema")  # json_schema
    function: str | None = None  # tool_call: the function's name ...
    arguments: dict[str, Any] | None = None  # ... and the arguments it must carry (a subset)
    tests: str | None = None  # code: appended to the answer's code and run in the sandbox
    value: float | None = Field(default=None, description=NUMERIC_RULE)
    tolerance: float = 0.0

    @model_validator(mode="after")
    def _fields_for_kind(self) -> CheckSpec:
        need = {
            "exact": ("expected",),
            "regex": ("pattern",),
            "json_schema": ("json_schema",),
            "tool_call": ("function",),
            "code": ("tests",),
            "numeric": ("value",),
        }[self.kind]
        missing = [f for f in need if getattr(self, f) is None]
        if missing:
            raise ValueError(f"check kind {self.kind} needs {', '.join(missing)}")
        return self


class SuiteCase(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    messages: list[dict[str, str]]
    check: CheckSpec
    max_tokens: int = 128
    tools: list[dict[str, Any]] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    # server flags the case needs (e.g. --enable-auto-tool-choice): without them it is not run
    requires: list[str] = Field(default_factory=list)
    # long-context retrieval: "{haystack}" in the messages becomes this many words of
    # realistic text with ``needle`` in the middle
    haystack_words: int = 0
    needle: str | None = None
    complete: bool = True  # the answer must end by itself, not at max_tokens

    def rendered_messages(self) -> list[dict[str, str]]:
        if not self.haystack_words:
            return self.messages
        text = haystack(self.haystack_words, self.needle or "")
        return [{**m, "content": m["content"].replace("{haystack}", text)} for m in self.messages]


def haystack(words: int, needle: str) -> str:
    """``words`` words of the copy/edit workload's text with ``needle`` in the middle."""
    from specexp.measure import workload

    pool = " ".join(c for prompt in workload.load("copy_edit") for _, c in prompt).split()
    out = [pool[i % len(pool)] for i in range(words)]
    mid = words // 2
    return " ".join(out[:mid]) + f"\n\n{needle}\n\n" + " ".join(out[mid:])


def parse_cases(raw: dict[str, Any], suite: str) -> list[SuiteCase]:
    cases = []
    for name, body in raw.items():
        try:
            cases.append(SuiteCase.model_validate({"name": name, **dict(body)}))
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise ConfigError(f"suite {suite}, case {name}: {where}: {first['msg']}") from None
    return cases
