from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from specexp.config.compose import plan_sweep
from specexp.config.schema import BenchConfig, CaseConfig, SloConfig
from specexp.errors import ConfigError
from specexp.launch.base import Endpoint
from specexp.measure.goodput import Slo
from specexp.measure.runner import measure
from specexp.measure.stats import primary_metric
from specexp.measure.traffic import check_bench, plan_cases, traffic_metrics, window
from specexp.record import vllm_bench
from specexp.record.results import RequestRecord
from tests.helpers import scripted_sse

ROOT = Path(__file__).resolve().parents[2]


def traffic_file(tmp_path: Path, timestamps: bool = True) -> Path:
    lines = []
    for i, (slice_, session) in enumerate(
        [("home", None), ("todo", "t"), ("home", None), ("todo", "t"), (None, None), ("todo", None)]
    ):
        rec: dict[str, object] = {"messages": [{"role": "user", "content": f"request {i}"}]}
        if slice_:
            rec["slice"] = slice_
        if session:
            rec["session"] = session
        if timestamps:
            rec["timestamp"] = 0.05 * i
        lines.append(json.dumps(rec))
    path = tmp_path / "traffic.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_split_by_slice_makes_one_case_per_slice(tmp_path: Path) -> None:
    path = traffic_file(tmp_path)
    bench = BenchConfig(
        workload=f"file:{path}",
        split_by_slice=True,
        cases={"traffic": CaseConfig(num_prompts=None, concurrency=2)},
    )
    plans = plan_cases(bench)
    assert list(plans) == ["traffic.home", "traffic.todo", "traffic.unlabelled"]
    assert plans["traffic.home"].requests == 2
    todo = plans["traffic.todo"].conversations
    assert [len(c) for c in todo] == [2, 1]  # the session stays one conversation
    assert all(t.slice == "todo" for c in todo for t in c)
    unsplit = plan_cases(
        BenchConfig(workload=f"file:{path}", cases={"traffic": CaseConfig(num_prompts=None)})
    )
    assert list(unsplit) == ["traffic"] and unsplit["traffic"].requests == 6


def test_trace_timing_needs_timestamps_and_is_checked_before_any_server(tmp_path: Path) -> None:
    path = traffic_file(tmp_path, timestamps=False)
    bench = BenchConfig(
        workload=f"file:{path}", cases={"replay": CaseConfig(num_prompts=None, timing="trace")}
    )
    with pytest.raises(ConfigError, match=r"bench.cases.replay.timing=trace: workload .* has no timestamps"):
        check_bench(bench)


def test_each_trial_gets_its_own_schedule_shared_by_variants(tmp_path: Path) -> None:
    bench = BenchConfig(
        workload=f"file:{traffic_file(tmp_path)}",
        cases={"poisson": CaseConfig(num_prompts=None, request_rate=4.0, max_concurrency=3)},
    )
    (plan,) = plan_cases(bench).values()
    w0, w1 = window(plan, 0, 0), window(plan, 0, 1)
    assert w0.due_s is not None and w1.due_s is not None and w0.due_s != w1.due_s
    assert window(plan, 0, 0).due_s == w0.due_s
    assert w0.concurrency == 3
    assert w0.due_s[-1] == pytest.approx(len(plan.conversations) / 4.0)
    trace = BenchConfig(
        workload=f"file:{traffic_file(tmp_path)}",
        cases={"replay": CaseConfig(num_prompts=None, timing="trace")},
    )
    (tplan,) = plan_cases(trace).values()
    tw = window(tplan, 0, 0)
    assert tw.due_s == pytest.approx([0.0, 0.05, 0.10, 0.20, 0.25])  # sessions start at their first turn
    assert tw.trace_start_s == 0.0


def test_lateness_is_reported_for_scheduled_first_turns_only() -> None:
    recs = [
        RequestRecord(index=i, start_s=0, ttft_s=0.1, latency_s=0.5, output_tokens=5, late_s=late, turn=turn)
        for i, (late, turn) in enumerate([(0.001, 0), (0.002, 0), (0.5, 1), (0.004, 0)])
    ]
    out = traffic_metrics(recs, 2.0, Slo(ttft_ms=200), open_loop=True)
    assert out["send_late_max_ms"] == pytest.approx(4.0)  # the later turn waited for its answer: not late
    assert out["send_late_p50_ms"] == pytest.approx(2.0)
    assert out["goodput_req_s"] == 2.0
    assert "send_late_p50_ms" not in traffic_metrics(recs, 2.0, Slo(), open_loop=False)


def test_open_loop_settings_are_checked_by_the_schema() -> None:
    for bad, msg in [
        ("bench.cases.single.request_rate=0", "request_rate=0.0 must be > 0"),
        ("bench.cases.single.burstiness=-1", "burstiness=-1.0 must be > 0"),
        ("bench.cases.single.timing=replay", "timing='replay' is not trace"),
        ("bench.cases.single.max_concurrency=2", "max_concurrency caps open loop"),
        ("bench.slo.ttft_ms=0", "bench.slo.ttft_ms=0.0 must be > 0"),
    ]:
        with pytest.raises(ConfigError, match=msg):
            plan_sweep(["spec=none", bad], with_baseline=False)
    assert SloConfig(ttft_ms=100).itl_ms is None


@pytest.fixture(scope="module")
def scripted_server() -> Iterator[str]:
    with scripted_sse("10", "5") as url:
        yield url


def test_a_sweep_measures_open_loop_slices_with_goodput(scripted_server: str, tmp_path: Path) -> None:
    path = traffic_file(tmp_path)
    (variant,) = plan_sweep(
        [
            "spec=none",
            "bench=smoke",
            "~bench.cases.concurrent4",
            "~bench.cases.long_input",
            f"bench.workload=file:{path}",
            "bench.split_by_slice=true",
            "bench.cases.single.num_prompts=null",
            "bench.cases.single.request_rate=20",
            "bench.cases.single.max_tokens=8",
            "bench.slo.ttft_ms=5000",
            "bench.trials=2",
        ],
        with_baseline=False,
    )
    results = asyncio.run(measure(Endpoint(base_url=scripted_server, model="scripted"), variant.config.bench))
    assert list(results) == ["single.home", "single.todo", "single.unlabelled"]
    todo = results["single.todo"]
    assert primary_metric(todo) == "goodput_req_s"
    assert [len(t.requests) for t in todo.trials] == [3, 3]
    for trial in todo.trials:
        assert trial.metrics["goodput_req_s"] > 0 and trial.metrics["good_fraction"] == 1.0
        assert "send_late_p99_ms" in trial.metrics
        by_turn = {(r.session, r.turn): r for r in trial.requests}
        assert by_turn[("t", 1)].scheduled_s is not None and by_turn[("t", 0)].scheduled_s is not None
        assert all(r.ok and r.slice == "todo" and r.output_tokens == 8 for r in trial.requests)
    assert "goodput_req_s" in todo.summary
    # and in vllm bench serve's own field names
    rec = vllm_bench.run_record(variant, "scripted", todo, todo.trials[0])
    assert (rec["request_rate"], rec["burstiness"]) == (20.0, 1.0)
    assert rec["request_goodput"] == todo.trials[0].metrics["goodput_req_s"]
