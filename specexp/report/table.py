"""Console output: dry-run plans and the variant × metric summary table."""

from __future__ import annotations

import shlex

from rich.console import Console
from rich.table import Table

from specexp.launch.plan import LaunchPlan, redact_argv, redact_env
from specexp.launch.validate import ValidationResult
from specexp.record.results import CaseResult, Summary, VariantResult


def fmt_range(s: Summary | None, scale: float = 1.0, digits: int = 1) -> str:
    if s is None:
        return "–"
    med, lo, hi = s.median * scale, s.min * scale, s.max * scale
    return f"{med:.{digits}f} [{lo:.{digits}f}–{hi:.{digits}f}]"


def print_plan(console: Console, index: int, plan: LaunchPlan, check: ValidationResult | None) -> None:
    console.print(f"[bold][{index}] {plan.label}[/bold]  hash={plan.variant_hash}  launcher={plan.kind}  device={plan.device}")
    for note in plan.notes:
        console.print(f"    [yellow]note:[/yellow] {note}")
    for node in plan.nodes:
        prefix = f"    node {node.rank} ({node.host})" if len(plan.nodes) > 1 else "    command"
        console.print(f"{prefix}:", highlight=False)
        console.print("      " + " \\\n        ".join(shlex.quote(a) for a in redact_argv(node.argv)),
                      highlight=False, soft_wrap=True)
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


def _primary(cr: CaseResult) -> str:
    """The figure a case is about: decode speed for one stream, aggregate output for several."""
    return "decode_tok_s" if cr.concurrency == 1 else "output_tok_s"


def summary_table(results: list[VariantResult], baselines: dict[str, VariantResult | None]) -> Table:
    case_names: list[str] = []
    for r in results:
        for name in r.cases:
            if name not in case_names:
                case_names.append(name)
    table = Table(title="specexp sweep: median [min–max] over trials", show_lines=False)
    table.add_column("variant", no_wrap=True)
    table.add_column("status")
    table.add_column("ready s", justify="right")
    for name in case_names:
        table.add_column(f"{name}\ntok/s", justify="right")
        table.add_column("vs base", justify="right")
        table.add_column(f"{name}\nTTFT ms", justify="right")
    table.add_column("accept rate", justify="right")
    table.add_column("accept len", justify="right")
    for r in results:
        row = [r.label, r.status if r.status == "ok" else f"[red]{r.status}[/red]",
               f"{r.ready_s:.1f}" if r.ready_s else "–"]
        base = baselines.get(r.label)
        first_with_acc: CaseResult | None = None
        for name in case_names:
            cr = r.cases.get(name)
            if cr is None:
                row += ["–", "–", "–"]
                continue
            key = _primary(cr)
            row.append(fmt_range(cr.summary.get(key)))
            ratio = "–"
            if base is not None and name in base.cases and key in cr.summary:
                b = base.cases[name].summary.get(key)
                if b and b.median > 0:
                    ratio = f"×{cr.summary[key].median / b.median:.2f}"
            row.append(ratio)
            row.append(fmt_range(cr.summary.get("ttft_ms"), digits=0))
            if first_with_acc is None and "acceptance_rate" in cr.summary:
                first_with_acc = cr
        if first_with_acc is not None:
            row.append(fmt_range(first_with_acc.summary.get("acceptance_rate"), 100, 0) + " %")
            row.append(fmt_range(first_with_acc.summary.get("acceptance_length"), digits=2))
        else:
            row += ["–", "–"]
        table.add_row(*row)
    return table
