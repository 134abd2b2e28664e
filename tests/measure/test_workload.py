from __future__ import annotations

import json
from pathlib import Path

import pytest

from specexp.config.compose import plan_sweep
from specexp.config.schema import BenchConfig, CaseConfig
from specexp.errors import ConfigError
from specexp.measure import workload
from specexp.measure.traffic import plan_cases
from tests.helpers import run_cli


def test_the_slices_bundle_gives_each_slice_its_own_prompts() -> None:
    (variant,) = plan_sweep(["spec=none", "bench=slices"], with_baseline=False)
    bench = variant.config.bench
    assert list(bench.cases) == ["smart_home", "portfolio", "todo", "coding_conflict"]
    plans = plan_cases(bench)
    for name, case in bench.cases.items():
        assert plans[name].requests == case.num_prompts
        pool = set(workload.load(name))
        for conv in plans[name].conversations:
            assert tuple((m["role"], m["content"]) for m in conv[0].messages) in pool
            assert conv[0].slice == name


def test_a_case_without_its_own_workload_uses_the_bench_workload() -> None:
    bench = BenchConfig(workload="todo", cases={"c": CaseConfig(num_prompts=2)})
    (plan,) = plan_cases(bench).values()
    assert all(conv[0].slice == "todo" for conv in plan.conversations)


def test_variants_get_the_same_prompts_and_cases_differ() -> None:
    a = workload.prompts_for("copy_edit", 0, 6, seed=0)
    assert a == workload.prompts_for("copy_edit", 0, 6, seed=0)
    assert a != workload.prompts_for("copy_edit", 1, 6, seed=0)


def _file(tmp_path: Path, lines: list[dict[str, object]]) -> Path:
    path = tmp_path / "traffic.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def _turn(text: str, **labels: object) -> dict[str, object]:
    return {"messages": [{"role": "user", "content": text}], **labels}


def test_a_file_is_found_from_the_working_directory_then_the_config_tree(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    conf = tmp_path / "conf"
    (conf / "workloads").mkdir(parents=True)
    _file(conf / "workloads", [_turn("from conf")])
    monkeypatch.setenv("SPECEXP_CONF", str(conf))
    monkeypatch.chdir(tmp_path)
    assert workload.load("file:workloads/traffic.jsonl") == ((("user", "from conf"),),)
    (tmp_path / "workloads").mkdir()
    _file(tmp_path / "workloads", [_turn("from cwd")])
    assert workload.load("file:workloads/traffic.jsonl") == ((("user", "from cwd"),),)
    with pytest.raises(ConfigError) as err:
        workload.load("file:nope.jsonl")
    assert str(err.value) == (
        "bench.workload=file:nope.jsonl: no such file "
        f"(looked at {tmp_path / 'nope.jsonl'}, {conf / 'nope.jsonl'})"
    )


def test_an_edited_file_is_read_again(tmp_path: Path) -> None:
    path = _file(tmp_path, [_turn("one")])
    assert len(workload.resolve(f"file:{path}").turns) == 1
    _file(tmp_path, [_turn("one"), _turn("two, a longer line")])
    assert len(workload.resolve(f"file:{path}").turns) == 2


def test_pick_keeps_conversations_whole_and_cuts_only_the_last(tmp_path: Path) -> None:
    path = _file(
        tmp_path,
        [
            _turn("a1", session="a"),
            _turn("b"),
            _turn("a2", session="a"),
            _turn("a3", session="a"),
            _turn("c"),
        ],
    )
    w = workload.resolve(f"file:{path}")
    texts = [
        [t.messages[0]["content"] for t in conv] for conv in workload.pick(w, None, seed=0, case_index=0)
    ]
    assert texts == [["a1", "a2", "a3"], ["b"], ["c"]]
    in_order = workload.pick(w, 4, seed=0, case_index=0, in_file_order=True)
    assert [[t.messages[0]["content"] for t in conv] for conv in in_order] == [["a1", "a2", "a3"], ["b"]]
    for case_index in range(6):
        picked = workload.pick(w, 7, seed=0, case_index=case_index)
        assert sum(len(c) for c in picked) == 7
        for conv in picked:  # every conversation starts at its first turn, turns in order
            assert [t.messages[0]["content"] for t in conv] in (["a1", "a2", "a3"][: len(conv)], ["b"], ["c"])
    assert workload.pick(w, 7, seed=0, case_index=1) == workload.pick(w, 7, seed=0, case_index=1)


@pytest.mark.parametrize(
    ("bad", "says"),
    [
        ('{"messages": [{"role": "user"', "record 7 (line 7): bad JSON (Expecting ',' delimiter, column 30)"),
        ('{"max_tokens": 20}', 'record 7 (line 7), messages: missing: a record needs "messages"'),
        (
            '{"messages": [{"role": "robot", "content": "beep"}]}',
            "record 7 (line 7), messages[0].role: unknown role 'robot'",
        ),
    ],
)
def test_a_malformed_workload_file_is_one_line_and_creates_nothing(
    tmp_path_factory: pytest.TempPathFactory, workdir: Path, bad: str, says: str
) -> None:
    path = tmp_path_factory.mktemp("user") / "traffic.jsonl"
    lines = [json.dumps(_turn(f"request {i}")) for i in range(6)] + [bad]
    path.write_text("\n".join(lines) + "\n")
    out = run_cli(["sweep", "spec.depth=3", "bench=traffic", f"bench.workload=file:{path}"], workdir)
    assert out.returncode == 2, out.stderr
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith(f"specexp: error: workload file {path}, {says}"), line
    assert list(workdir.iterdir()) == []


def test_the_shipped_agent_traffic_has_slices_and_sessions() -> None:
    (variant,) = plan_sweep(["spec=none", "bench=traffic"], with_baseline=False)
    plans = plan_cases(variant.config.bench)
    assert sorted(plans) == ["agent.coding_conflict", "agent.portfolio", "agent.smart_home", "agent.todo"]
    sessions = [c for p in plans.values() for c in p.conversations if len(c) > 1]
    assert len(sessions) >= 3
    assert any(t.fields.get("tools") for p in plans.values() for c in p.conversations for t in c)
