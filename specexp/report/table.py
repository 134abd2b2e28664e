"""Console output: dry-run plans and the variant × metric summary table."""

from __future__ import annotations

import shlex

from rich.console import Console
from rich.table import Table

from specexp.launch.plan import LaunchPlan, redact_argv, redact_env
from specexp.launch.validate import ValidationResult
from specexp.measure.stats import primary_metric
from specexp.record.results import Summary, VariantResult


def fmt_range(s: Summary | None, scale: float = 1.0, digits: int = 1) -> str:
    if s is None:
        return "–"
    med, lo, hi = s.median * scale, s.min * scale, s.max * scale
    return f"{med:.{digits}f} [{lo:.{digits}f}–{hi:.{digits}f}]"


def print_plan(console: Console, index: int, plan: LaunchPlan, check: ValidationResult | None) -> None:
    console.print(
        f"[bold][{index}] {plan.label}[/bold]  hash={plan.variant_hash}  "
        f"launcher={plan.kind}  device={plan.device}"
    )
    for note in plan.notes:
        console.print(f"    [yellow]note:[/yellow] {note}")
    for node in plan.nodes:
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
    if check.ok:
        return f"validation: ok ({levels}){' against this machine’s vLLM' if check.remote else ''}"
    kind = "warning (target vLLM may differ)" if check.remote else "error"
    return f"validation {kind}: {check.error}"


def summary_table(results: list[VariantResult]) -> Table:
    """Variant × case: the case's main figure as median [min–max], ×baseline, TTFT, acceptance."""
    case_names: list[str] = []
    for r in results:
        for name in r.cases:
            if name not in case_names:
                case_names.append(name)
    table = Table(title="specexp sweep · median \\[min–max] over trials", title_justify="left")
    table.add_column("variant", no_wrap=True)
    table.add_column("ready s", justify="right")
    for name in case_names:
        table.add_column(f"{name}\ntok/s", justify="right", no_wrap=True)
        table.add_column(f"{name}\nTTFT ms", justify="right", no_wrap=True)
        table.add_column(f"{name}\naccept", justify="right", no_wrap=True)
    for r in results:
        if r.status != "ok":
            table.add_row(r.label, f"[red]{r.status}[/red]", *([""] * (3 * len(case_names))))
            continue
        row = [r.label, f"{r.ready_s:.1f}" if r.ready_s else "–"]
        for name in case_names:
            cr = r.cases.get(name)
            if cr is None:
                row += ["–", "–", "–"]
                continue
            key = primary_metric(cr)
            summary = cr.summary.get(key)
            cell = fmt_range(summary)
            if summary is not None and summary.outliers:
                cell += f" [yellow]!{len(summary.outliers)}[/yellow]"
            if cr.verdict is not None:
                mark = {"better": "[green]▲[/green]", "worse": "[red]▼[/red]"}.get(cr.verdict.verdict, "≈")
                cell += f" ×{cr.verdict.ratio:.2f}{mark}"
            row.append(cell)
            row.append(fmt_range(cr.summary.get("ttft_ms"), digits=0))
            rate = cr.summary.get("acceptance_rate")
            length = cr.summary.get("acceptance_length")
            acc = f"{rate.median * 100:.0f}% / {length.median:.2f}" if rate and length else "–"
            if cr.looping_outputs:
                acc += " [red]⟳ inflated[/red]"
            row.append(acc)
        table.add_row(*row)
    table.caption = (
        "tok/s: decode speed per stream for single-stream cases, aggregate output for concurrent ones; "
        "×n: ratio of medians to the no-speculation baseline, ▲/▼ when its 95 % bootstrap interval "
        "excludes 1, ≈ when it does not (no clear difference); !n: trials flagged as outliers "
        "(kept); accept: acceptance rate / mean length; ⟳: outputs loop, so these figures are inflated"
    )
    return table
