from __future__ import annotations

from rich.console import Console

from specexp.record.results import CaseResult, Summary, VariantResult, Verdict
from specexp.report.table import summary_table


def s(med: float, lo: float, hi: float, outliers: list[int] | None = None) -> Summary:
    return Summary(median=med, min=lo, max=hi, n=3, outliers=outliers or [])


def render(results: list[VariantResult]) -> str:
    console = Console(width=200, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    console.print(summary_table(results))
    return console.export_text()


def test_rows_per_variant_and_case_with_marks() -> None:
    single = CaseResult(
        case="single",
        concurrency=1,
        trials=[],
        summary={
            "decode_tok_s": s(107.2, 99.3, 110.6, [1]),
            "ttft_ms": s(101, 95, 118),
            "acceptance_rate": s(0.77, 0.7, 0.8),
            "acceptance_length": s(3.31, 3.0, 3.4),
        },
        verdict=Verdict(metric="decode_tok_s", ratio=2.84, ci_low=2.59, ci_high=2.95, verdict="better"),
    )
    conc = CaseResult(
        case="concurrent4",
        concurrency=4,
        trials=[],
        looping_outputs=2,
        summary={
            "output_tok_s": s(137.9, 127.0, 147.9),
            "ttft_spread_ms": s(563, 500, 600),
            "jain_index": s(0.85, 0.8, 0.9),
        },
        verdict=Verdict(
            metric="output_tok_s", ratio=1.01, ci_low=0.9, ci_high=1.1, verdict="no clear difference"
        ),
    )
    ok = VariantResult(
        label="ngram-k3",
        variant_hash="h",
        is_baseline=False,
        overrides=[],
        ready_s=24.1,
        cases={"single": single, "concurrent4": conc},
    )
    bad = VariantResult(
        label="ngram-k5",
        variant_hash="g",
        is_baseline=False,
        overrides=[],
        status="failed",
        error="vllm serve exited with code 1",
    )
    text = render([ok, bad])
    assert "107.2 [99.3–110.6] !1 ×2.84▲" in text
    assert "137.9 [127.0–147.9] ×1.01≈" in text
    assert "563 / 0.85" in text and "77% / 3.31" in text and "⟳ loops" in text
    assert "failed" in text and "vllm serve exited with code 1" in text


def test_suite_line_shows_flaky_flips_and_the_baseline_noise_floor() -> None:
    from specexp.record.results import SuiteCaseResult, SuiteResult
    from specexp.report.table import describe_suite

    def c(name: str, **kw: object) -> SuiteCaseResult:
        base: dict[str, object] = {"name": name, "check": "exact", "passed": True, "reason": ""}
        return SuiteCaseResult.model_validate(base | kw)

    suite = SuiteResult(
        name="r",
        cases=[c("a", passed=False, flaky=True, equivalent=False), c("b", equivalent=True)],
        baseline_self_equivalence=0.9,
        divergence_p=0.01,
        diverges_beyond_noise=True,
    )
    line = describe_suite(suite)
    assert "0 regression(s)" in line and "flaky (did not reproduce): a" in line
    assert "greedy-equivalent to the baseline on 50% (the baseline to itself: 90%)" in line
    assert "diverges beyond the baseline's own noise (p=0.010)" in line


def test_untrusted_verdicts_disagreeing_windows_and_failed_trials_are_marked() -> None:
    single = CaseResult(
        case="single",
        concurrency=1,
        trials=[],
        looping_outputs=3,
        failed_trials=1,
        server_disagreements=2,
        acceptance_inconsistent=4,
        summary={
            "decode_tok_s": s(95.0, 90.0, 99.0),
            "acceptance_rate": s(0.99, 0.98, 1.0),
            "acceptance_length": s(3.9, 3.8, 4.0),
        },
        verdict=Verdict(
            metric="decode_tok_s", ratio=2.9, ci_low=2.5, ci_high=3.1, verdict="not trusted", reason="loops"
        ),
    )
    v = VariantResult(
        label="ngram-k3", variant_hash="h", is_baseline=False, overrides=[], cases={"single": single}
    )
    text = render([v])
    assert "95.0 [90.0–99.0] ≠srv2 ✗1 ×2.90⟳" in text  # no ▲ although the interval excludes 1
    assert "▲" not in text.split("tok/s: decode speed")[0]
    assert "99% / 3.90 Σ≠4 ⟳ loops" in text


def test_an_open_loop_case_shows_goodput_and_its_traffic_figures() -> None:
    case = CaseResult(
        case="agent.todo",
        concurrency=22,
        trials=[],
        primary_metric="goodput_req_s",
        request_rate=1.5,
        summary={
            "goodput_req_s": s(0.92, 0.85, 1.01),
            "good_fraction": s(0.81, 0.7, 0.9),
            "prefix_cache_hit_rate": s(0.34, 0.3, 0.4),
            "send_late_p99_ms": s(0.6, 0.4, 1.3),
        },
    )
    plain = CaseResult(case="single", concurrency=1, trials=[], summary={"decode_tok_s": s(30, 29, 31)})
    v = VariantResult(
        label="baseline",
        variant_hash="b",
        is_baseline=True,
        overrides=[],
        cases={"agent.todo": case, "single": plain},
    )
    text = render([v])
    row = next(line for line in text.splitlines() if "agent.todo" in line)
    assert "0.9 [0.8–1.0] good req/s" in row
    assert "hit 34% · good 81% · late 1.3ms" in row
    single = next(line for line in text.splitlines() if " single " in line)
    assert "good req/s" not in single and single.split("│")[-2].strip() == "–"
