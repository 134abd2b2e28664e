"""Console output: dry-run plans and the variant × metric summary table."""

from __future__ import annotations

import shlex

from rich.console import Console
from rich.table import Table

from specexp.launch.plan import LaunchPlan, redact_argv, redact_env
from specexp.launch.validate import ValidationResult
from specexp.measure.stats import primary_metric
from specexp.record.results import CaseResult, SuiteCaseResult, SuiteResult, Summary, VariantResult


def fmt_range(s: Summary | None, scale: float = 1.0, digits: int = 1) -> str:
    """Median [min–max]; figures below 1 (goodput in requests/s, say) keep three decimals,
    since one would print 0.043 req/s as 0.0."""
    if s is None:
        return "–"
    med, lo, hi = s.median * scale, s.min * scale, s.max * scale
    if digits == 1 and 0 < max(abs(med), abs(lo), abs(hi)) < 1:
        digits = 3
    return f"{med:.{digits}f} [{lo:.{digits}f}–{hi:.{digits}f}]"


def print_plan(
    console: Console,
    index: int,
    plan: LaunchPlan,
    check: ValidationResult | None,
    launcher_lines: list[str] | None = None,
) -> None:
    """One variant of ``--dry-run``: each node's command and env, or, for a launcher that says
    what it does instead (``launcher_lines``; GPUStack: the request body it would send,
    secrets masked), that."""
    console.print(
        f"[bold][{index}] {plan.label}[/bold]  hash={plan.variant_hash}  "
        f"launcher={plan.kind}  device={plan.device}"
    )
    for note in plan.notes:
        console.print(f"    [yellow]note:[/yellow] {note}")
    for line in launcher_lines or []:
        console.print("    " + line, highlight=False, soft_wrap=True, markup=False)
    for node in plan.nodes if not launcher_lines else ():  # the launcher said what it runs
        prefix = f"    node {node.rank} ({node.host})" if len(plan.nodes) > 1 else "    command"
        console.print(f"{prefix}:", highlight=False)
        console.print(
            "      " + " \\\n        ".join(shlex.quote(a) for a in redact_argv(node.argv)),
            highlight=False,
            soft_wrap=True,
        )
        env = redact_env(node.env)
        if env:
            console.print("      env:", highlight=False)
            for key, value in env.items():
                console.print(f"        {key}={value}", highlight=False, soft_wrap=True)
    if check is not None:
        console.print("    " + describe_check(check), highlight=False)


def describe_check(check: ValidationResult) -> str:
    if check.skipped:
        return f"validation: {check.skipped}"
    levels = ", ".join(check.checked) or "none"
    if check.cached:
        levels += "; remembered from an earlier check of the same flags, vLLM and model files"
    if check.ok:
        return f"validation: ok ({levels}){' against this machine’s vLLM' if check.remote else ''}"
    kind = "warning (target vLLM may differ)" if check.remote else "error"
    return f"validation {kind}: {check.error}"


def _case_cells(cr: CaseResult) -> list[str]:
    """tok/s with outlier and verdict marks, TTFT, fairness (concurrent cases), acceptance."""
    key = primary_metric(cr)
    summary = cr.summary.get(key)
    speed = fmt_range(summary)
    if summary is not None and summary.outliers:
        speed += f" [yellow]!{len(summary.outliers)}[/yellow]"
    if cr.server_disagreements:
        speed += f" [yellow]≠srv{cr.server_disagreements}[/yellow]"
    if cr.failed_trials:
        speed += f" [red]✗{cr.failed_trials}[/red]"
    if cr.verdict is not None:
        mark = {"better": "[green]▲[/green]", "worse": "[red]▼[/red]"}.get(cr.verdict.verdict, "≈")
        if cr.verdict.verdict == "not trusted":
            mark = "[red]⟳[/red]"  # outputs loop: no winner, whatever the interval says
        elif cr.verdict.ci_low is None:
            mark = "?"  # too few trials for any interval: no verdict possible
        speed += f" ×{cr.verdict.ratio:.2f}{mark}"
    spread, jain = cr.summary.get("ttft_spread_ms"), cr.summary.get("jain_index")
    fairness = f"{spread.median:.0f} / {jain.median:.2f}" if spread and jain else "–"
    rate, length = cr.summary.get("acceptance_rate"), cr.summary.get("acceptance_length")
    acc = f"{rate.median * 100:.0f}% / {length.median:.2f}" if rate and length else "–"
    if cr.acceptance_inconsistent:
        acc += f" [red]Σ≠{cr.acceptance_inconsistent}[/red]"
    if cr.looping_outputs:
        acc += " [red]⟳ loops[/red]"
    if key == "goodput_req_s":
        speed += " good req/s"
    return [speed, fmt_range(cr.summary.get("ttft_ms"), digits=0), fairness, acc, _traffic_cell(cr)]


def _traffic_cell(cr: CaseResult) -> str:
    """Prefix-cache hits, the share of requests within the objectives, open-loop send lateness."""
    parts = []
    if (hit := cr.summary.get("prefix_cache_hit_rate")) is not None:
        parts.append(f"hit {hit.median:.0%}")
    if (good := cr.summary.get("good_fraction")) is not None:
        parts.append(f"good {good.median:.0%}")
    if (late := cr.summary.get("send_late_p99_ms")) is not None:
        parts.append(f"late {late.max:.1f}ms")
    return " · ".join(parts) or "–"


def summary_table(results: list[VariantResult]) -> Table:
    """One row per variant and case, so any number of cases stays readable."""
    table = Table(title="specexp sweep · median \\[min–max] over trials", title_justify="left")
    for name, justify in (
        ("variant", "left"),
        ("ready s", "right"),
        ("case", "left"),
        ("tok/s", "right"),
        ("TTFT ms", "right"),
        ("spread ms / Jain", "right"),
        ("accept", "right"),
        ("traffic", "left"),
    ):
        table.add_column(name, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    for r in results:
        ready = f"{r.ready_s:.1f}" if r.ready_s else "–"
        if r.status != "ok":
            table.add_row(r.label, ready, f"[red]{r.status}[/red]", (r.error or "")[:60], "", "", "", "")
            continue
        for i, (name, cr) in enumerate(r.cases.items()):
            last = i == len(r.cases) - 1
            table.add_row(
                r.label if i == 0 else "", ready if i == 0 else "", name, *_case_cells(cr), end_section=last
            )
    table.caption = (
        "tok/s: decode speed per stream for single-stream cases, aggregate output for concurrent ones; "
        "×n: ratio to the no-speculation baseline (median pairwise ratio of trials), ▲/▼ when its "
        "exact 95 % rank interval excludes 1, ≈ when it does not (no clear difference: take the simpler "
        "config), ? when too few trials for any interval, ⟳ when outputs loop (not trusted: no "
        "winner; bench.trust_loops=true names one); !n: trials flagged as outliers (kept); ≠srvN: N "
        "trials whose decode speed differs from the server's own histograms by more than 5 %; ✗N: N "
        "windows that are not measurements (server counters reset; left out); "
        "spread / Jain: TTFT max − min across streams and Jain's index of per-stream throughput; "
        "accept: acceptance rate / mean length, Σ≠N: N windows whose mean length is not 1 + Σ "
        "per-position rates; ⟳ loops: outputs loop, so speed and acceptance are inflated; "
        "traffic: prefix-cache hit rate, share of requests within bench.slo, worst p99 send lateness "
        "(open loop); good req/s: goodput, the figure an open-loop case is judged on"
    )
    return table


def describe_suite(suite: SuiteResult) -> str:
    """One line: passed/failed/not run, regressions and flaky flips by name, equivalence
    beside the baseline's agreement with itself."""
    parts = [f"suite {suite.name}: {suite.passed}/{len(suite.cases)} passed"]
    if suite.failed:
        parts.append(f"{suite.failed} failed")
    if suite.not_run:
        parts.append(f"{suite.not_run} not run")
    regs = suite.regressions
    parts.append(f"{len(regs)} regression(s)" + (f": {', '.join(regs)}" if regs else ""))
    if suite.flaky:
        parts.append(f"flaky (did not reproduce): {', '.join(suite.flaky)}")
    if suite.self_equivalence_rate is not None:
        parts.append(f"answers the same in a second pass on {suite.self_equivalence_rate:.0%}")
    if suite.equivalence_rate is not None:
        own = suite.baseline_self_equivalence
        parts.append(
            f"greedy-equivalent to the baseline on {suite.equivalence_rate:.0%}"
            + (f" (the baseline to itself: {own:.0%})" if own is not None else "")
        )
    if suite.diverges_beyond_noise:
        parts.append(f"diverges beyond the baseline's own noise (p={suite.divergence_p:.3f})")
    return ", ".join(parts)


def _suite_cell(case: SuiteCaseResult) -> str:
    mark = {True: "[green]✓[/green]", False: "[red]✗[/red]", None: "–"}[case.passed]
    if case.regression:
        mark = "[bold red]✗ regression[/bold red]"
    elif case.flaky:
        mark = "[yellow]✗ flaky[/yellow]"
    if case.first_divergence is not None:
        mark += f" ≠@{case.first_divergence}" + ("~" if case.baseline_stable is False else "")
    if case.repeat_divergence is not None:
        mark += f" ≠@{case.repeat_divergence}~"
    return mark


def suite_table(results: list[VariantResult]) -> Table:
    """One row per suite case, one column per variant that ran the suite."""
    ran = [r for r in results if r.suite is not None]
    table = Table(
        title=f"functional suite {ran[0].suite.name if ran and ran[0].suite else ''}", show_lines=False
    )
    table.add_column("case")
    table.add_column("check")
    for r in ran:
        table.add_column(r.label)
    names: list[tuple[str, str]] = []
    for r in ran:
        assert r.suite is not None
        for c in r.suite.cases:
            if (c.name, c.check) not in names:
                names.append((c.name, c.check))
    for name, check in names:
        cells = []
        for r in ran:
            assert r.suite is not None
            case = next((c for c in r.suite.cases if c.name == name), None)
            cells.append(_suite_cell(case) if case else "")
        table.add_row(name, check, *cells)
    table.caption = (
        "✓ pass · ✗ fail · – not run here (server flag or sandbox missing) · regression: passes twice at "
        "the baseline, fails twice in the variant · flaky: such a flip that did not reproduce · ≠@n: "
        "output differs from the baseline's from token n on · ~: the baseline's own two answers differ"
    )
    return table
