from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest

from specexp.measure.stats import summarize
from specexp.record.results import AcceptanceRecord, CaseResult, RequestRecord, TrialRecord, VariantResult
from specexp.record.store import StoredVariant
from specexp.report import compare, plots
from specexp.report.table import fmt_range


def variant(
    label: str, values: list[float], *, baseline: bool, base_hash: str | None = None, k: int = 0
) -> VariantResult:
    trials = []
    for i, v in enumerate(values):
        acc = None
        if k:
            per = [0.8 - 0.1 * p for p in range(k)]
            acc = AcceptanceRecord(
                drafts=100,
                draft_tokens=100 * k,
                accepted=int(100 * sum(per)),
                rate=sum(per) / k,
                mean_length=1 + sum(per),
                per_position=per,
            )
        requests = [
            RequestRecord(index=j, start_s=0, ttft_s=0.05 * (j + 1), latency_s=1.0, output_tokens=10)
            for j in range(4)
        ]
        trials.append(
            TrialRecord(
                case="c4",
                trial=i,
                duration_s=1.0,
                requests=requests,
                metrics={"output_tok_s": v},
                acceptance=acc,
            )
        )
    summary = {"output_tok_s": summarize(values)}
    assert summary["output_tok_s"] is not None
    case = CaseResult(
        case="c4", concurrency=4, trials=trials, summary={k2: s for k2, s in summary.items() if s}
    )
    return VariantResult(
        label=label,
        variant_hash=label[:12].ljust(12, "0"),
        is_baseline=baseline,
        overrides=[],
        cases={"c4": case},
        baseline_hash=base_hash,
    )


BASE = variant("baseline", [60, 61, 59, 60, 62], baseline=True)
K3 = variant("ngram-k3", [90, 92, 88, 91, 93], baseline=False, base_hash=BASE.variant_hash, k=3)


def test_rows_carry_the_verdict_against_each_variants_own_baseline() -> None:
    rows, warnings = compare.compare_rows([StoredVariant(BASE, None, "s"), StoredVariant(K3, None, "s")])
    assert warnings == []
    base_row, k3_row = rows
    assert base_row.verdict is None and k3_row.verdict is not None
    assert (
        k3_row.verdict.verdict == "better" and k3_row.verdict.ci_low is not None and k3_row.verdict.ci_low > 1
    )
    assert k3_row.per_position == pytest.approx((0.8, 0.7, 0.6))
    assert "▲" in k3_row.verdict_text


def test_results_from_two_sweeps_are_compared_with_a_drift_warning() -> None:
    rows, warnings = compare.compare_rows(
        [StoredVariant(BASE, None, "monday"), StoredVariant(K3, None, "tuesday")]
    )
    assert len(warnings) == 1 and "drift" in warnings[0] and "monday" in warnings[0]
    assert rows[1].verdict is not None  # still judged against the only baseline given


def test_markdown_and_csv_hold_the_same_figures() -> None:
    rows, _ = compare.compare_rows([StoredVariant(BASE, None, "s"), StoredVariant(K3, None, "s")])
    md = compare.markdown(rows, "s")
    assert md.count("\n| c4 |") == 2 and "91.0 [88.0–93.0] n=5" in md
    table = list(csv.DictReader(io.StringIO(compare.csv_text(rows))))
    assert [r["variant"] for r in table] == ["baseline", "ngram-k3"]
    assert float(table[1]["median"]) == 91.0 and table[1]["verdict"] == "better"
    assert table[1]["per_position"] == "0.8000 0.7000 0.6000"


def test_the_plots_are_png_files_with_what_they_show(tmp_path: Path) -> None:
    made = plots.write_all([BASE, K3], tmp_path)
    assert sorted(p.name for p in made) == ["acceptance.png", "fairness.png", "throughput.png"]
    for p in made:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 5000
    assert not list(tmp_path.glob(".*tmp"))
    # no acceptance data, no concurrent case: those plots are not drawn at all
    only = plots.write_all(
        [variant("baseline", [1, 2, 3], baseline=True).model_copy(update={"cases": {}})], tmp_path / "x"
    )
    assert only == []


def test_a_variant_that_ran_what_its_baseline_ran_is_shown_as_an_aa_not_a_winner() -> None:
    same = K3.model_copy(update={"same_run_as": BASE.label})
    rows, _ = compare.compare_rows([StoredVariant(BASE, None, "s"), StoredVariant(same, None, "s")])
    row = rows[1]
    assert "same run" in row.flags
    assert row.verdict_text.endswith("A/A (same run)") and "▲" not in row.verdict_text
    assert "A/A" in compare.csv_text(rows)


def test_a_figure_below_one_keeps_its_digits() -> None:
    """Goodput in requests/s is often below 1: one decimal would print 0.043 as 0.0."""
    good = summarize([0.0432, 0.0225, 0.0])
    assert good is not None
    assert fmt_range(good) == "0.022 [0.000–0.043]"
    fast = summarize([8.61, 8.3, 9.0])
    assert fast is not None and fmt_range(fast) == "8.6 [8.3–9.0]"


def test_a_baseline_trial_at_zero_says_why_there_is_no_ratio() -> None:
    """Goodput is 0 in a window where no request met its objectives: no ratio can be taken,
    and the cell says so instead of staying empty."""
    base = variant("baseline", [0.0, 0.02, 0.03, 0.02], baseline=True)
    other = variant("ngram-k3", [0.05, 0.04, 0.05, 0.06], baseline=False, base_hash=base.variant_hash)
    rows, _ = compare.compare_rows([StoredVariant(base, None, "s"), StoredVariant(other, None, "s")])
    base_row, row = rows
    assert row.verdict is None and row.verdict_text == "no ratio: a trial at 0"
    assert base_row.verdict_text == ""  # the baseline is not compared with itself
    assert "a trial at 0" in compare.markdown(rows, "s")
    # trials above 0 on both sides: a ratio, and no such note
    fine = variant("ngram-k3", [0.05, 0.04, 0.05, 0.06], baseline=False, base_hash=BASE.variant_hash)
    rows, _ = compare.compare_rows([StoredVariant(BASE, None, "s"), StoredVariant(fine, None, "s")])
    assert rows[1].verdict is not None and "a trial at 0" not in rows[1].flags
