"""``python -m specexp tune``: plan the search, run the study, print what it found."""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.table import Table
from rich.text import Text

from specexp.config.compose import hydra_context
from specexp.tune import report
from specexp.tune.plan import plan_tune
from specexp.tune.study import run_tune


def tune(args: argparse.Namespace, console: Console) -> int:
    with hydra_context():
        plan = plan_tune(
            list(args.overrides),
            search=args.search,
            study=args.study,
            storage=args.storage,
            n_trials=args.n_trials,
            objectives=args.objective,
            strategy=args.strategy,
            margin=args.margin,
            seed=args.seed,
        )
        outcome = run_tune(plan, console, write_experiment=args.write_experiment)
    tuner = outcome.tuner
    console.print(report.trials_table(tuner))
    front = report.best_rows(tuner)
    title = "best" if len(plan.objectives) == 1 else "Pareto front (feasible)"
    table = Table(title=title, title_justify="left")
    for col in ("trial", "variant", "measured", "overrides"):
        table.add_column(col, overflow="fold")
    for row in front:
        table.add_row(*map(Text, row))
    console.print(table)
    preds = report.prediction_rows(tuner)
    if preds:
        pt = Table(title="depth model: prediction beside measurement", title_justify="left")
        for col in (
            "variant",
            "figure",
            "predicted",
            "measured",
            "error",
            "acc. len pred",
            "measured",
            "basis",
        ):
            pt.add_column(col, overflow="fold")
        for row in preds:
            pt.add_row(*map(Text, row))
        console.print(pt)
    c = outcome.conclusion
    if c is not None and c.schedule is not None:
        per = ", ".join(
            f"{conc} stream(s) → depth {d} ({m} {v:.1f})"
            for conc, (d, v, m) in sorted(c.schedule.by_concurrency.items())
        )
        console.print(f"depth per batch size: {c.schedule.ranges}  ({per})", highlight=False)
    if c is not None and c.vllm_comparison:
        console.print(c.vllm_comparison, highlight=False, soft_wrap=True)
    if c is not None and c.experiment is not None:
        console.print(
            f"wrote {c.experiment}  (run it: python -m specexp sweep experiment={args.write_experiment})",
            highlight=False,
        )
    console.print(
        f"server starts in this process: {tuner.starts} · study {plan.study} in {plan.storage} · "
        f"results: {outcome.folder}",
        highlight=False,
        soft_wrap=True,
    )
    if outcome.mlflow_parent:
        console.print(f"MLflow parent run: {outcome.mlflow_parent} (python -m specexp ui)", highlight=False)
    return 0 if front else 1
