"""The comparison the seeds wrote by hand: case × variant, median [min–max], the ratio to the
baseline with its interval and verdict, acceptance (rate, mean length, per position) and
fairness, from results read back from a sweep folder or MLflow runs.

Verdicts are recomputed from every trial's values against each variant's own baseline
(by hash) when it is among the inputs, else against the one baseline given, so results
of different sweeps can be compared (yesterday's baseline against today's variant), with
a plain warning that the machine's drift between the runs is then inside the difference.
"""

from __future__ import annotations

import csv
import io
import statistics
from dataclasses import dataclass, field

from rich.table import Table

from specexp.measure.stats import case_verdict, primary_metric
from specexp.record.results import CaseResult, Summary, VariantResult, Verdict
from specexp.record.store import StoredVariant
from specexp.report.table import fmt_range

MARK = {"better": "▲", "worse": "▼", "no clear difference": "≈"}


@dataclass(frozen=True)
class Row:
    case: str
    variant: str
    sweep: str
    metric: str
    summary: Summary | None
    verdict: Verdict | None
    acceptance_rate: float | None = None
    acceptance_length: float | None = None
    per_position: tuple[float, ...] = ()
    ttft_ms: float | None = None
    ttft_spread_ms: float | None = None
    ttft_max_ms: float | None = None
    jain: float | None = None
    flags: tuple[str, ...] = field(default=())

    @property
    def verdict_text(self) -> str:
        v = self.verdict
        if v is None:
            return f"no ratio: {ZERO_TRIAL}" if ZERO_TRIAL in self.flags else ""
        if "same run" in self.flags:
            return f"×{v.ratio:.2f} A/A (same run)"
        if v.ci_low is None or v.ci_high is None:
            return f"×{v.ratio:.2f} ? (too few trials)"
        return f"×{v.ratio:.2f} [{v.ci_low:.2f}–{v.ci_high:.2f}] {MARK.get(v.verdict, v.verdict)}"


# A ratio needs every trial above 0 on both sides; goodput (requests that met their
# objectives) is 0 for a window in which none did, which is a result, not a gap.
ZERO_TRIAL = "a trial at 0"


def _has_zero(metric: str, *cases: CaseResult) -> bool:
    return any(t.ok and t.metrics.get(metric, 1.0) <= 0 for c in cases for t in c.trials)


def _median(s: dict[str, Summary], key: str) -> float | None:
    return s[key].median if key in s else None


def _per_position(result: VariantResult, case: str) -> tuple[float, ...]:
    """Median per-position acceptance over the case's trials."""
    trials = [t.acceptance.per_position for t in result.cases[case].trials if t.acceptance is not None]
    if not trials:
        return ()
    width = max(len(p) for p in trials)
    return tuple(statistics.median(p[i] for p in trials if len(p) > i) for i in range(width))


def pick_baselines(results: list[StoredVariant]) -> dict[str, VariantResult | None]:
    """Each variant's baseline among the inputs: its own (by hash), else the only one given."""
    by_hash = {s.result.variant_hash: s.result for s in results}
    baselines = [s.result for s in results if s.result.is_baseline]
    out: dict[str, VariantResult | None] = {}
    for s in results:
        r = s.result
        if r.is_baseline:
            out[r.variant_hash] = None
        elif r.baseline_hash and r.baseline_hash in by_hash:
            out[r.variant_hash] = by_hash[r.baseline_hash]
        else:
            out[r.variant_hash] = baselines[0] if len(baselines) == 1 else None
    return out


def compare_rows(results: list[StoredVariant], confidence: float = 0.95) -> tuple[list[Row], list[str]]:
    warnings = []
    sweeps = sorted({s.sweep for s in results})
    if len(sweeps) > 1:
        warnings.append(
            f"these results come from {len(sweeps)} sweeps ({', '.join(sweeps)}): the machine's drift "
            "between them is inside every difference; for an A/B, measure both in one sweep"
        )
    base_of = pick_baselines(results)
    rows = []
    cases = list(dict.fromkeys(c for s in results for c in s.result.cases))
    for case in cases:
        for s in results:
            r = s.result
            cr = r.cases.get(case)
            if cr is None:
                continue
            metric = primary_metric(cr)
            base = base_of.get(r.variant_hash)
            base_case = base.cases.get(case) if base is not None else None
            verdict = case_verdict(cr, base_case, confidence) if base_case is not None else None
            flags = []
            if metric in cr.summary and cr.summary[metric].outliers:
                flags.append(f"{len(cr.summary[metric].outliers)} outlier trial(s)")
            if cr.looping_outputs:
                flags.append("outputs loop")
            if verdict is None and base_case is not None and _has_zero(metric, cr, base_case):
                flags.append(ZERO_TRIAL)
            if base is not None and r.same_run_as == base.label:
                flags.append("same run")
            if r.status != "ok":
                flags.append(r.status)
            rows.append(
                Row(
                    case=case,
                    variant=r.label,
                    sweep=s.sweep,
                    metric=metric,
                    summary=cr.summary.get(metric),
                    verdict=verdict,
                    acceptance_rate=_median(cr.summary, "acceptance_rate"),
                    acceptance_length=_median(cr.summary, "acceptance_length"),
                    per_position=_per_position(r, case),
                    ttft_ms=_median(cr.summary, "ttft_ms"),
                    ttft_spread_ms=_median(cr.summary, "ttft_spread_ms"),
                    ttft_max_ms=_median(cr.summary, "ttft_max_ms"),
                    jain=_median(cr.summary, "jain_index"),
                    flags=tuple(flags),
                )
            )
    return rows, warnings


def _fmt(value: float | None, digits: int = 1, scale: float = 1.0, suffix: str = "") -> str:
    return "–" if value is None else f"{value * scale:.{digits}f}{suffix}"


def _cells(row: Row) -> list[str]:
    s = row.summary
    value = "–" if s is None else f"{fmt_range(s)} n={s.n}"
    acc = (
        "–"
        if row.acceptance_rate is None
        else f"{row.acceptance_rate:.0%} / {_fmt(row.acceptance_length, 2)}"
        + (f" ({' '.join(f'{p:.2f}' for p in row.per_position)})" if row.per_position else "")
    )
    fair = (
        "–"
        if row.ttft_spread_ms is None
        else f"{row.ttft_spread_ms:.0f} / {_fmt(row.ttft_max_ms, 0)} / {_fmt(row.jain, 2)}"
    )
    return [
        row.case,
        row.variant,
        f"{row.metric}: {value}",
        row.verdict_text,
        acc,
        _fmt(row.ttft_ms, 0),
        fair,
        ", ".join(row.flags),
    ]


HEADERS = [
    "case",
    "variant",
    "median [min–max]",
    "vs baseline",
    "acceptance rate / length (per position)",
    "TTFT ms",
    "TTFT spread / worst ms / Jain",
    "flags",
]


def rich_table(rows: list[Row], title: str) -> Table:
    table = Table(title=title, title_justify="left")
    for h in HEADERS:
        table.add_column(h, overflow="fold")
    last = None
    for row in rows:
        cells = _cells(row)
        if row.case == last:
            cells[0] = ""
        last = row.case
        table.add_row(*cells)
    table.caption = (
        "vs baseline: Hodges–Lehmann ratio of trial values with its exact rank interval; ▲/▼ when the "
        "interval excludes 1, ≈ when it does not (take the simpler config), ? too few trials; A/A: the "
        "servers reported the same effective configuration"
    )
    return table


def markdown(rows: list[Row], title: str) -> str:
    def esc(text: str) -> str:
        return text.replace("|", "\\|")

    lines = [f"### {title}", "", "| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    lines += ["| " + " | ".join(esc(c) for c in _cells(row)) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def csv_text(rows: list[Row]) -> str:
    """One line per case × variant with plain numbers (no formatting) for spreadsheets."""
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(
        [
            "case",
            "variant",
            "sweep",
            "metric",
            "median",
            "min",
            "max",
            "trials",
            "ratio",
            "ci_low",
            "ci_high",
            "verdict",
            "acceptance_rate",
            "acceptance_length",
            "per_position",
            "ttft_ms",
            "ttft_spread_ms",
            "ttft_max_ms",
            "jain_index",
            "flags",
        ]
    )
    for r in rows:
        s, v = r.summary, r.verdict
        writer.writerow(
            [
                r.case,
                r.variant,
                r.sweep,
                r.metric,
                s.median if s else "",
                s.min if s else "",
                s.max if s else "",
                s.n if s else "",
                v.ratio if v else "",
                v.ci_low if v and v.ci_low is not None else "",
                v.ci_high if v and v.ci_high is not None else "",
                ("A/A" if "same run" in r.flags else v.verdict) if v else "",
                "" if r.acceptance_rate is None else r.acceptance_rate,
                "" if r.acceptance_length is None else r.acceptance_length,
                " ".join(f"{p:.4f}" for p in r.per_position),
                "" if r.ttft_ms is None else r.ttft_ms,
                "" if r.ttft_spread_ms is None else r.ttft_spread_ms,
                "" if r.ttft_max_ms is None else r.ttft_max_ms,
                "" if r.jain is None else r.jain,
                "; ".join(r.flags),
            ]
        )
    return out.getvalue()
