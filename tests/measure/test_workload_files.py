from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from specexp.measure.workload_files import Turn, WorkloadFileError, read, write_jsonl, write_vllm_custom


def _jsonl(tmp_path: Path, records: list[Any], name: str = "traffic.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in records) + "\n")
    return path


TOOL = {"type": "function", "function": {"name": "set_light", "parameters": {"type": "object"}}}


def test_chat_records_keep_their_tools_sampling_params_and_labels(tmp_path: Path) -> None:
    path = _jsonl(
        tmp_path,
        [
            {
                "messages": [
                    {"role": "system", "content": "You control a house."},
                    {"role": "user", "content": "Lights off."},
                ],
                "tools": [TOOL],
                "tool_choice": "auto",
                "max_tokens": 40,
                "temperature": 0.7,
                "top_p": 0.9,
                "seed": 3,
                "model": "whatever-the-log-said",
                "stream": False,
                "slice": "smart_home",
            },
            {"messages": [{"role": "user", "content": "Sell 3 shares."}], "slice": "portfolio"},
        ],
    )
    w = read(path)
    first = w.turns[0]
    assert first.fields == {
        "tools": [TOOL],
        "tool_choice": "auto",
        "max_tokens": 40,
        "temperature": 0.7,
        "top_p": 0.9,
        "seed": 3,
    }  # model and stream are specexp's to set
    assert first.max_tokens == 40
    assert [t.slice for t in w.turns] == ["smart_home", "portfolio"]
    assert w.slices() == ["smart_home", "portfolio"]
    assert [len(t.turns) for t in (w.only_slice("smart_home"), w.only_slice("portfolio"))] == [1, 1]


def test_sessions_group_turns_in_file_order_and_inherit_the_slice(tmp_path: Path) -> None:
    path = _jsonl(
        tmp_path,
        [
            {
                "messages": [{"role": "user", "content": "Add milk to my list."}],
                "session": "s1",
                "slice": "todo",
            },
            {"messages": [{"role": "user", "content": "What is 2+2?"}]},
            {"messages": [{"role": "user", "content": "And eggs."}], "session": "s1"},
            {
                # logged with its whole history: only what follows the last answer is new
                "messages": [
                    {"role": "user", "content": "Add milk to my list."},
                    {"role": "assistant", "content": "Added milk."},
                    {"role": "user", "content": "And eggs."},
                    {"role": "assistant", "content": "Added eggs."},
                    {"role": "user", "content": "Read it back."},
                ],
                "session": "s1",
            },
        ],
    )
    w = read(path)
    convs = w.conversations()
    assert [[t.record for t in c] for c in convs] == [[1, 3, 4], [2]]
    assert all(t.slice == "todo" for t in convs[0])
    assert convs[0][2].new_messages(first=False) == [{"role": "user", "content": "Read it back."}]
    assert convs[0][1].new_messages(first=False) == [{"role": "user", "content": "And eggs."}]


def test_vllm_custom_and_batch_lines_read_as_chat_requests(tmp_path: Path) -> None:
    path = _jsonl(
        tmp_path,
        [
            {"prompt": "What is the capital of France?", "output_tokens": 12, "slice": "facts"},
            {
                "custom_id": "r-2",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {"model": "gpt-x", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5},
                "slice": "chat",
            },
        ],
    )
    custom, batch = read(path).turns
    assert custom.messages == ({"role": "user", "content": "What is the capital of France?"},)
    assert custom.fields == {"max_tokens": 12}
    assert batch.messages == ({"role": "user", "content": "Hi"},)
    assert batch.fields == {"max_tokens": 5}
    assert (custom.slice, batch.slice) == ("facts", "chat")


def test_sharegpt_conversations_become_sessions_of_human_turns(tmp_path: Path) -> None:
    path = tmp_path / "share.json"
    path.write_text(
        json.dumps(
            [
                {
                    "id": "abc",
                    "conversations": [
                        {"from": "system", "value": "Be brief."},
                        {"from": "human", "value": "Name a fruit."},
                        {"from": "gpt", "value": "Apple."},
                        {"from": "human", "value": "Another."},
                        {"from": "gpt", "value": "Pear."},
                    ],
                    "slice": "chat",
                },
                {"conversations": [{"from": "human", "value": "Hello"}]},
            ]
        )
    )
    w = read(path)
    convs = w.conversations()
    assert [len(c) for c in convs] == [2, 1]
    assert convs[0][0].messages == (
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Name a fruit."},
    )
    assert convs[0][1].messages == ({"role": "user", "content": "Another."},)
    assert {t.session for t in convs[0]} == {"abc"} and convs[1][0].session == "#2"
    assert [t.slice for t in w.turns] == ["chat", "chat", None]


def test_timestamps_in_seconds_or_milliseconds(tmp_path: Path) -> None:
    path = _jsonl(
        tmp_path,
        [
            {"prompt": "a", "timestamp": 1.5},
            {"prompt": "b", "timestamp_ms": 2500},
        ],
    )
    assert [t.timestamp_s for t in read(path).turns] == [1.5, 2.5]


GOOD = {"messages": [{"role": "user", "content": "hello"}]}


@pytest.mark.parametrize(
    ("bad", "expected"),
    [
        ('{"messages": [{"role": "user", "content": "hi"}', "record 7 (line 8): bad JSON"),
        ({"max_tokens": 5}, 'record 7 (line 8), messages: missing: a record needs "messages"'),
        (
            {"messages": [{"role": "user", "content": "hi"}, {"role": "robot", "content": "beep"}]},
            "record 7 (line 8), messages[1].role: unknown role 'robot' "
            "(known: assistant, developer, system, tool, user)",
        ),
        ({"messages": [{"content": "hi"}]}, "record 7 (line 8), messages[0].role: no role"),
        ({"messages": []}, "record 7 (line 8), messages: must be a non-empty list of messages"),
        (
            {**GOOD, "max_token": 5},
            "record 7 (line 8), max_token: not a chat-completions request field specexp knows",
        ),
        ({**GOOD, "max_tokens": "5"}, "record 7 (line 8), max_tokens: must be an integer >= 1"),
        ({**GOOD, "temperature": -1}, "record 7 (line 8), temperature: must be a number >= 0"),
        ({**GOOD, "n": 2}, "record 7 (line 8), n: must be 1"),
        ({**GOOD, "tools": [{"type": "function"}]}, "record 7 (line 8), tools[0]: must be"),
        ({**GOOD, "slice": ""}, "record 7 (line 8), slice: must be a non-empty string"),
        ({**GOOD, "timestamp": -2}, "record 7 (line 8), timestamp: must be a number >= 0"),
        ({"prompt": "x", "output_tokens": 0}, "record 7 (line 8), output_tokens: must be an integer >= 1"),
        ({"prompt": "x", "output_len": 3}, "record 7 (line 8), output_len: not a field of vllm bench serve"),
        ([1, 2], "record 7 (line 8): must be a JSON object"),
    ],
)
def test_a_bad_record_is_one_line_naming_file_record_and_field(
    tmp_path: Path, bad: Any, expected: str
) -> None:
    # six good records, a blank line, then the bad one: record 7 on line 8
    path = _jsonl(tmp_path, [GOOD] * 6 + ["", bad])
    with pytest.raises(WorkloadFileError) as err:
        read(path)
    msg = str(err.value)
    assert "\n" not in msg
    assert msg.startswith(f"workload file {path}, {expected}"), msg


def test_session_errors_name_the_later_turn(tmp_path: Path) -> None:
    first = {"messages": [{"role": "user", "content": "hi"}], "session": 1, "slice": "a", "timestamp": 5}
    cases = [
        (
            {**first, "slice": "b", "timestamp": 6},
            "record 2 (line 2), slice: 'b': session '1' is in slice 'a'",
        ),
        (
            {**first, "timestamp": 4},
            "record 2 (line 2), timestamp: earlier than the previous turn of session '1'",
        ),
        (
            {
                "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}],
                "session": 1,
            },
            "record 2 (line 2), messages: adds nothing after its last assistant message",
        ),
    ]
    for second, expected in cases:
        path = _jsonl(tmp_path, [first, second])
        with pytest.raises(WorkloadFileError, match=None) as err:
            read(path)
        assert str(err.value).startswith(f"workload file {path}, {expected}"), str(err.value)


def test_sharegpt_errors_name_record_and_turn(tmp_path: Path) -> None:
    path = tmp_path / "share.json"
    path.write_text(
        json.dumps(
            [
                {"conversations": [{"from": "human", "value": "a"}]},
                {"conversations": [{"from": "robot", "value": "b"}]},
            ]
        )
    )
    with pytest.raises(WorkloadFileError) as err:
        read(path)
    assert str(err.value).startswith(
        f"workload file {path}, record 2, conversations[0].from: unknown role 'robot'"
    )
    path.write_text('[{"conversations": []},\n oops]')
    with pytest.raises(WorkloadFileError, match=r"line 2: bad JSON"):
        read(path)


def test_an_empty_file_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_text("\n\n")
    with pytest.raises(WorkloadFileError, match="no records"):
        read(path)


def test_written_files_read_back_the_same(tmp_path: Path) -> None:
    src = _jsonl(
        tmp_path,
        [
            {
                "messages": [{"role": "user", "content": "one"}],
                "max_tokens": 9,
                "slice": "a",
                "session": "s",
                "timestamp": 1.0,
            },
            {"messages": [{"role": "user", "content": "two"}], "session": "s", "timestamp": 2.0},
        ],
    )
    turns = read(src).turns
    chat = tmp_path / "chat.jsonl"
    write_jsonl(chat, turns)
    assert [(t.messages, t.fields, t.slice, t.session, t.timestamp_s) for t in read(chat).turns] == [
        (t.messages, t.fields, t.slice, t.session, t.timestamp_s) for t in turns
    ]
    custom = tmp_path / "custom.jsonl"
    write_vllm_custom(custom, turns)
    assert custom.read_text().splitlines() == ['{"prompt": "one", "output_tokens": 9}', '{"prompt": "two"}']
    assert [(t.messages, t.max_tokens) for t in read(custom).turns] == [
        (t.messages, t.max_tokens) for t in turns
    ]
    with pytest.raises(ValueError, match="one user prompt per line"):
        write_vllm_custom(
            custom, [Turn(1, ({"role": "system", "content": "x"}, {"role": "user", "content": "y"}))]
        )
