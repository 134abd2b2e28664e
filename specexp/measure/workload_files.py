"""Workload files: the user's own traffic, in the formats other tools already write.

Seed 000's lesson is that the right knob is the one measured on *your* traffic, so a
case can replay a file instead of a bundled prompt set. Three formats are read:

- OpenAI chat-completions requests, one JSON object per line (``.jsonl``): ``messages``
  plus any of the request's own fields (``tools``, ``max_tokens``, ``temperature``, …),
  sent as written; an OpenAI Batch API line (``{"custom_id", "method", "url", "body"}``)
  is read through its ``body``;
- ``vllm bench serve``'s custom dataset (``.jsonl``): ``{"prompt": …, "output_tokens": N}``,
  so one file can feed both tools the same prompts;
- ShareGPT (``.json``, one array of ``{"conversations": [{"from", "value"}, …]}``): each
  human turn is a turn of a conversation; the recorded answers are replaced by live ones.

Any record may carry ``slice`` (a label; ``bench.split_by_slice`` makes one case per
slice), ``session`` (records sharing it replay as one conversation, in file order: each
turn is sent after the previous answer, with that answer in the history) and
``timestamp`` (seconds; ``timestamp_ms`` for milliseconds, as Mooncake-style traces
write it) for ``timing: trace``. In a session, a later record may hold either only its
new messages or the whole conversation as a production log stores it: everything up to
its last assistant message is the recorded history, replaced by the live one.

A file is checked whole when it is read, before any server starts: a bad record is one
line naming the file, the record (its line, for JSONL) and the field.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from specexp.errors import ConfigError

ROLES = ("assistant", "developer", "system", "tool", "user")
SHAREGPT_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "chatgpt": "assistant",
    "bard": "assistant",
    "model": "assistant",
    "system": "system",
}
LABEL_KEYS = ("slice", "session", "timestamp", "timestamp_ms")
# Set by specexp on every request (the served model's name, streaming with usage).
SET_BY_SPECEXP = ("model", "stream", "stream_options")


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _num(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _str_or_strs(v: Any) -> bool:
    return isinstance(v, str) or (isinstance(v, list) and all(isinstance(s, str) for s in v))


# Request fields passed on as written, each with its type check (OpenAI's chat-completions
# request and vLLM's sampling extras). Anything else is refused by name: a typo such as
# "max_token" would otherwise silently measure a different request.
_FIELDS: dict[str, tuple[str, Any]] = {
    "tools": ("a list of tool objects", lambda v: isinstance(v, list)),
    "tool_choice": ("a string or an object", lambda v: isinstance(v, str | dict)),
    "parallel_tool_calls": ("true or false", lambda v: isinstance(v, bool)),
    "max_tokens": ("an integer >= 1", lambda v: _int(v) and v >= 1),
    "max_completion_tokens": ("an integer >= 1", lambda v: _int(v) and v >= 1),
    "min_tokens": ("an integer >= 0", lambda v: _int(v) and v >= 0),
    "temperature": ("a number >= 0", lambda v: _num(v) and v >= 0),
    "top_p": ("a number in (0, 1]", lambda v: _num(v) and 0 < v <= 1),
    "top_k": ("an integer (-1 or 0: off)", _int),
    "min_p": ("a number in [0, 1]", lambda v: _num(v) and 0 <= v <= 1),
    "seed": ("an integer", _int),
    "stop": ("a string or a list of strings", _str_or_strs),
    "stop_token_ids": ("a list of integers", lambda v: isinstance(v, list) and all(_int(x) for x in v)),
    "presence_penalty": ("a number", _num),
    "frequency_penalty": ("a number", _num),
    "repetition_penalty": ("a number > 0", lambda v: _num(v) and v > 0),
    "logit_bias": ("an object", lambda v: isinstance(v, dict)),
    "logprobs": ("true or false", lambda v: isinstance(v, bool)),
    "top_logprobs": ("an integer >= 0", lambda v: _int(v) and v >= 0),
    "n": ("1 (one answer per request is what gets timed)", lambda v: v == 1 and _int(v)),
    "response_format": ("an object", lambda v: isinstance(v, dict)),
    "structured_outputs": ("an object", lambda v: isinstance(v, dict)),
    "ignore_eos": ("true or false", lambda v: isinstance(v, bool)),
    "skip_special_tokens": ("true or false", lambda v: isinstance(v, bool)),
    "chat_template_kwargs": ("an object", lambda v: isinstance(v, dict)),
    "reasoning_effort": ("a string", lambda v: isinstance(v, str)),
    "user": ("a string", lambda v: isinstance(v, str)),
    "metadata": ("an object", lambda v: isinstance(v, dict)),
}


class WorkloadFileError(ConfigError):
    """A record of a workload file that cannot be sent as written."""


@dataclass(frozen=True)
class Turn:
    """One request of a workload: the messages it adds and its own request fields."""

    record: int  # 1-based record number
    messages: tuple[dict[str, Any], ...]
    fields: dict[str, Any] = field(default_factory=dict)  # tools, max_tokens, temperature, ...
    slice: str | None = None
    session: str | None = None
    timestamp_s: float | None = None
    line: int | None = None  # its line, in a JSONL file

    def new_messages(self, first: bool) -> list[dict[str, Any]]:
        """What this turn adds to its conversation. A later turn logged with the whole
        conversation (as production logs store it) adds what follows its last assistant message."""
        msgs = list(self.messages)
        if not first:
            answers = [i for i, m in enumerate(msgs) if m.get("role") == "assistant"]
            if answers:
                msgs = msgs[answers[-1] + 1 :]
        return msgs

    @property
    def max_tokens(self) -> int | None:
        value = self.fields.get("max_tokens", self.fields.get("max_completion_tokens"))
        return int(value) if value is not None else None


@dataclass(frozen=True)
class Workload:
    """The turns of one file (or bundled set), in file order."""

    name: str
    source: str
    turns: tuple[Turn, ...]

    def conversations(self) -> list[tuple[Turn, ...]]:
        """Sessions as units (turns in file order), in order of their first turn; a record
        without a session is a conversation of one turn."""
        units: list[list[Turn]] = []
        by_session: dict[str, list[Turn]] = {}
        for turn in self.turns:
            if turn.session is None:
                units.append([turn])
            elif turn.session in by_session:
                by_session[turn.session].append(turn)
            else:
                by_session[turn.session] = [turn]
                units.append(by_session[turn.session])
        return [tuple(u) for u in units]

    def slices(self) -> list[str]:
        """Slice labels in order of first appearance (records without one are not a slice)."""
        return list(dict.fromkeys(t.slice for t in self.turns if t.slice is not None))

    def only_slice(self, label: str) -> Workload:
        turns = tuple(t for t in self.turns if t.slice == label)
        return replace(self, name=f"{self.name}/{label}", turns=turns)

    @property
    def has_sessions(self) -> bool:
        return any(t.session is not None for t in self.turns)

    @property
    def has_timestamps(self) -> bool:
        return any(t.timestamp_s is not None for t in self.turns)


class _Where:
    """Names a place in the file for error messages."""

    def __init__(self, path: Path, record: int, line: int | None) -> None:
        self.path, self.record, self.line = path, record, line

    def error(self, field_name: str | None, msg: str) -> WorkloadFileError:
        where = f"record {self.record}" + (f" (line {self.line})" if self.line is not None else "")
        what = f", {field_name}" if field_name else ""
        return WorkloadFileError(f"workload file {self.path}, {where}{what}: {msg}")


def _content_ok(content: Any) -> bool:
    if isinstance(content, str):
        return True
    return isinstance(content, list) and all(isinstance(p, dict) and "type" in p for p in content)


def _check_messages(messages: Any, where: _Where, key: str = "messages") -> tuple[dict[str, Any], ...]:
    if not isinstance(messages, list) or not messages:
        raise where.error(key, "must be a non-empty list of messages")
    out = []
    for i, msg in enumerate(messages):
        at = f"{key}[{i}]"
        if not isinstance(msg, dict):
            raise where.error(at, "must be an object with role and content")
        role = msg.get("role")
        if role not in ROLES:
            shown = "no role" if role is None else f"unknown role {role!r}"
            raise where.error(f"{at}.role", f"{shown} (known: {', '.join(ROLES)})")
        content = msg.get("content")
        if content is None and not (role == "assistant" and msg.get("tool_calls")):
            raise where.error(f"{at}.content", "missing (only an assistant turn with tool_calls may omit it)")
        if content is not None and not _content_ok(content):
            raise where.error(f"{at}.content", "must be a string or a list of content parts with a type")
        out.append(dict(msg))
    return tuple(out)


def _check_tools(tools: list[Any], where: _Where, key: str) -> None:
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or tool.get("type") != "function":
            raise where.error(f"{key}[{i}]", 'must be {"type": "function", "function": {"name": ...}}')


def _labels(rec: Mapping[str, Any], where: _Where) -> tuple[str | None, str | None, float | None]:
    slice_ = rec.get("slice")
    if slice_ is not None and (not isinstance(slice_, str) or not slice_.strip()):
        raise where.error("slice", "must be a non-empty string")
    session = rec.get("session")
    if session is not None and not (isinstance(session, str) and session) and not _int(session):
        raise where.error("session", "must be a non-empty string or an integer")
    ts: float | None = None
    for key, scale in (("timestamp", 1.0), ("timestamp_ms", 1e-3)):
        value = rec.get(key)
        if value is None:
            continue
        if ts is not None:
            raise where.error(key, "give timestamp (seconds) or timestamp_ms, not both")
        if not _num(value) or value < 0:
            raise where.error(key, "must be a number >= 0")
        ts = float(value) * scale
    return slice_, None if session is None else str(session), ts


def _chat_record(
    rec: Mapping[str, Any], where: _Where, prefix: str = ""
) -> tuple[tuple[dict[str, Any], ...], dict[str, Any]]:
    messages = _check_messages(rec.get("messages"), where, f"{prefix}messages")
    fields: dict[str, Any] = {}
    for key, value in rec.items():
        if key == "messages" or key in SET_BY_SPECEXP or (not prefix and key in LABEL_KEYS):
            continue
        spec = _FIELDS.get(key)
        if spec is None:
            raise where.error(f"{prefix}{key}", "not a chat-completions request field specexp knows")
        kind, ok = spec
        if not ok(value):
            raise where.error(f"{prefix}{key}", f"must be {kind}")
        fields[key] = value
    if "tools" in fields:
        _check_tools(fields["tools"], where, f"{prefix}tools")
    return messages, fields


def _jsonl_turn(rec: Any, where: _Where) -> Turn:
    if not isinstance(rec, dict):
        raise where.error(None, "must be a JSON object")
    slice_, session, ts = _labels(rec, where)
    if "body" in rec:  # an OpenAI Batch API line
        body = rec["body"]
        unknown = set(rec) - {"body", "custom_id", "method", "url", *LABEL_KEYS}
        if unknown:
            raise where.error(sorted(unknown)[0], "not a Batch API line field (custom_id, method, url, body)")
        url = rec.get("url", "/v1/chat/completions")
        if not isinstance(url, str) or not url.endswith("/chat/completions"):
            raise where.error("url", f"{url!r} is not a chat-completions request")
        if not isinstance(body, dict):
            raise where.error("body", "must be an object")
        messages, fields = _chat_record(body, where, "body.")
    elif "messages" in rec:
        messages, fields = _chat_record(rec, where)
    elif "prompt" in rec:  # vllm bench serve's custom dataset
        prompt = rec["prompt"]
        if not isinstance(prompt, str) or not prompt.strip():
            raise where.error("prompt", "must be a non-empty string")
        unknown = set(rec) - {"prompt", "output_tokens", *LABEL_KEYS}
        if unknown:
            raise where.error(
                sorted(unknown)[0], "not a field of vllm bench serve's custom dataset (prompt, output_tokens)"
            )
        messages, fields = ({"role": "user", "content": prompt},), {}
        if "output_tokens" in rec:
            out = rec["output_tokens"]
            if not _int(out) or out < 1:
                raise where.error("output_tokens", "must be an integer >= 1")
            fields["max_tokens"] = out
    else:
        raise where.error("messages", 'missing: a record needs "messages" (or "prompt", or a Batch "body")')
    return Turn(where.record, messages, fields, slice_, session, ts, where.line)


def _sharegpt_turns(rec: Any, where: _Where, index: int) -> Iterator[Turn]:
    if not isinstance(rec, dict):
        raise where.error(None, "must be a JSON object")
    if "messages" in rec:  # a JSON array of chat records
        yield _jsonl_turn(rec, where)
        return
    conv = rec.get("conversations")
    if not isinstance(conv, list) or not conv:
        raise where.error("conversations", "missing: a ShareGPT record needs a non-empty conversations list")
    slice_, session, ts = _labels(rec, where)
    if session is None:
        ident = rec.get("id")
        session = str(ident) if isinstance(ident, str | int) and not isinstance(ident, bool) else f"#{index}"
    pending: list[dict[str, Any]] = []
    turns = []
    for i, msg in enumerate(conv):
        at = f"conversations[{i}]"
        if not isinstance(msg, dict):
            raise where.error(at, 'must be an object with "from" and "value"')
        role = SHAREGPT_ROLES.get(str(msg.get("from", "")).lower())
        if role is None:
            known = ", ".join(SHAREGPT_ROLES)
            raise where.error(f"{at}.from", f"unknown role {msg.get('from')!r} (known: {known})")
        value = msg.get("value")
        if not isinstance(value, str):
            raise where.error(f"{at}.value", "must be a string")
        if role == "assistant":
            continue  # replaced by the live answer
        pending.append({"role": role, "content": value})
        if role == "user":
            turns.append(tuple(pending))
            pending = []
    if not turns:
        raise where.error("conversations", "has no human turn")
    for j, messages in enumerate(turns):
        yield Turn(where.record, messages, {}, slice_, session, ts if j == 0 else None)


def _check_sessions(path: Path, turns: list[Turn]) -> None:
    """Turns of one session agree on their slice, and their timestamps do not go back."""
    first: dict[str, Turn] = {}
    last_ts: dict[str, float] = {}
    for i, turn in enumerate(turns):
        if turn.session is None:
            continue
        where = _Where(path, turn.record, turn.line)
        head = first.setdefault(turn.session, turn)
        if turn is not head and not turn.new_messages(first=False):
            raise where.error(
                "messages", "adds nothing after its last assistant message (a later turn of a session)"
            )
        if turn.slice is not None and turn.slice != head.slice:
            raise where.error(
                "slice",
                f"{turn.slice!r}: session {turn.session!r} is in slice {head.slice!r} (its first turn's)",
            )
        if turn.slice is None and head.slice is not None:
            turns[i] = replace(turn, slice=head.slice)
        if turn.timestamp_s is not None:
            if turn.timestamp_s < last_ts.get(turn.session, 0.0):
                raise where.error("timestamp", f"earlier than the previous turn of session {turn.session!r}")
            last_ts[turn.session] = turn.timestamp_s


def read(path: Path, name: str | None = None) -> Workload:
    """Read and check a whole workload file; one ``WorkloadFileError`` line on the first bad record."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise WorkloadFileError(f"workload file {path}: cannot read it ({exc})") from None
    turns: list[Turn] = []
    if path.suffix == ".json" or (path.suffix != ".jsonl" and text.lstrip().startswith("[")):
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            msg = f"workload file {path}, line {exc.lineno}: bad JSON ({exc.msg})"
            raise WorkloadFileError(msg) from None
        if not isinstance(doc, list):
            raise WorkloadFileError(f"workload file {path}: a .json workload is one array of records")
        for i, rec in enumerate(doc, start=1):
            turns.extend(_sharegpt_turns(rec, _Where(path, i, None), i))
    else:
        record = 0
        for lineno, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            record += 1
            where = _Where(path, record, lineno)
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                raise where.error(None, f"bad JSON ({exc.msg}, column {exc.colno})") from None
            turns.append(_jsonl_turn(rec, where))
    if not turns:
        raise WorkloadFileError(f"workload file {path}: no records")
    _check_sessions(path, turns)
    return Workload(name or path.stem, str(path), tuple(turns))


def write_jsonl(path: Path, turns: list[Turn] | tuple[Turn, ...]) -> None:
    """Write turns as OpenAI chat JSONL (one request per line, labels kept)."""
    lines = []
    for t in turns:
        rec: dict[str, Any] = {"messages": list(t.messages), **t.fields}
        if t.slice is not None:
            rec["slice"] = t.slice
        if t.session is not None:
            rec["session"] = t.session
        if t.timestamp_s is not None:
            rec["timestamp"] = t.timestamp_s
        lines.append(json.dumps(rec, ensure_ascii=False))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def write_vllm_custom(path: Path, turns: list[Turn] | tuple[Turn, ...]) -> None:
    """Write single-message turns as ``vllm bench serve``'s custom dataset
    (``--dataset-name custom``), so the peer and specexp send the same prompts."""
    lines = []
    for t in turns:
        if (
            len(t.messages) != 1
            or t.messages[0].get("role") != "user"
            or not isinstance(t.messages[0].get("content"), str)
        ):
            raise ValueError(f"record {t.record}: vllm's custom dataset holds one user prompt per line")
        rec: dict[str, Any] = {"prompt": t.messages[0]["content"]}
        if t.max_tokens is not None:
            rec["output_tokens"] = t.max_tokens
        lines.append(json.dumps(rec, ensure_ascii=False))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
