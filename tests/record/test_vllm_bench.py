from __future__ import annotations

import json
from pathlib import Path

import pytest

from specexp.config.compose import plan_sweep
from specexp.record.results import AcceptanceRecord, CaseResult, RequestRecord, TrialRecord, VariantResult
from specexp.record.vllm_bench import _p99, run_record, write_variant


def ok_request(index: int, ttft: float, latency: float, prompt: int, tokens: int) -> RequestRecord:
    return RequestRecord(
        index=index,
        start_s=0.0,
        ttft_s=ttft,
        itl_s=[0.05] * 10,
        latency_s=latency,
        prompt_tokens=prompt,
        output_tokens=tokens,
    )


def trial(n: int) -> TrialRecord:
    reqs = [
        ok_request(0, 0.1, 0.6, 30, 21),
        ok_request(1, 0.2, 0.7, 40, 11),
        RequestRecord(index=2, start_s=0.0, error="HTTP 500: boom"),
    ]
    acc = AcceptanceRecord(
        drafts=10, draft_tokens=30, accepted=21, rate=0.7, mean_length=3.1, per_position=[0.9, 0.7, 0.5]
    )
    return TrialRecord(
        case="concurrent4",
        trial=n,
        duration_s=2.0,
        requests=reqs,
        metrics={"jain_index": 0.97, "ttft_spread_ms": 100.0},
        acceptance=acc,
    )


def test_run_record_uses_vllm_bench_names_and_units() -> None:
    (v,) = plan_sweep(["spec.depth=3"], with_baseline=False)
    case = CaseResult(case="concurrent4", concurrency=4, trials=[trial(0)], summary={})
    rec = run_record(v, "/m", case, case.trials[0])
    assert rec["completed"] == 2 and rec["failed"] == 1 and rec["num_prompts"] == 3
    assert rec["total_output_tokens"] == 32 and rec["output_throughput"] == pytest.approx(16.0)
    assert rec["total_input_tokens"] == 70 and rec["max_concurrency"] == 4
    assert rec["median_ttft_ms"] == pytest.approx(150.0) and rec["p99_ttft_ms"] == pytest.approx(199.0)
    assert rec["mean_tpot_ms"] == pytest.approx((25.0 + 50.0) / 2)
    assert rec["mean_itl_ms"] == pytest.approx(50.0)
    assert rec["spec_decode_acceptance_rate"] == pytest.approx(70.0)  # percent, as vLLM writes it
    assert rec["spec_decode_per_position_acceptance_rates"] == [0.9, 0.7, 0.5]  # fractions
    assert rec["speculative_config.num_speculative_tokens"] == 3 and rec["spec.depth"] == "3"
    assert rec["specexp_jain_index"] == 0.97


def test_sweep_layout_with_summary_lists(tmp_path: Path) -> None:
    (v,) = plan_sweep(["spec.depth=3"], with_baseline=False)
    case = CaseResult(case="concurrent4", concurrency=4, trials=[trial(0), trial(1)], summary={})
    result = VariantResult(
        label=v.label, variant_hash=v.hash, is_baseline=False, overrides=[], cases={"concurrent4": case}
    )
    (folder,) = write_variant(tmp_path, v, "/m", result)
    assert folder.name == "SERVE-ngram-k3-BENCH-concurrent4"
    assert sorted(p.name for p in folder.iterdir()) == ["run=0.json", "run=1.json", "summary.json"]
    summary = json.loads((folder / "summary.json").read_text())
    assert [r["run_number"] for r in summary] == [0, 1]


@pytest.mark.parametrize(
    "values", [[5.0], [1.0, 2.0], [3.0, 1.0, 2.0, 10.0, 7.5], [float(i % 17) for i in range(250)]]
)
def test_p99_is_numpys_linear_percentile(values: list[float]) -> None:
    np = pytest.importorskip("numpy")
    assert _p99(values) == pytest.approx(float(np.percentile(values, 99)))
