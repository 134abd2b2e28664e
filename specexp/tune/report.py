"""What a search leaves behind: the best trial or Pareto front, the depth model's
predictions beside the measurements, a per-batch-size depth schedule, an experiment file
``sweep experiment=NAME`` launches, Optuna's plots, and the comparison with vLLM's own
``tune_speculative_k`` where the installed vLLM has it.

The schedule uses vLLM's key ``num_speculative_tokens_per_batch_size``: a list of
``[first_batch_size, last_batch_size, depth]`` (inclusive), the first range starting at 1.
Per measured concurrency the depth with the best median figure wins; a depth within 1 %
of the best counts as a tie and the smaller depth (0 = no speculation) takes it, as in
``tune_speculative_k``; each concurrency's depth holds up to the next measured one.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import optuna
import yaml
from optuna.trial import FrozenTrial, TrialState
from rich.table import Table
from rich.text import Text

from specexp.config.variant import Variant
from specexp.errors import ConfigError
from specexp.launch.plan import ENTRY_SCRIPT, vllm_python
from specexp.paths import conf_dir, vllm_venv
from specexp.record.files import atomic_write_json, atomic_write_text
from specexp.tune.objectives import Objective, feasible, primary

if TYPE_CHECKING:
    from specexp.tune.study import Candidate, Stored, Tuner

A = "specexp."
TIE = 0.01  # within 1 % of the best is a tie; the smaller depth wins
CLIENT_SIDE = ("bench", "suite", "tracking", "sweep", "hydra")


def _attr(t: FrozenTrial, key: str, default: Any = None) -> Any:
    return t.user_attrs.get(A + key, default)


def measured(study: optuna.Study) -> list[FrozenTrial]:
    """COMPLETE trials (measured or reused), one per variant."""
    out, seen = [], set()
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        h = _attr(t, "key")
        if h not in seen:
            seen.add(h)
            out.append(t)
    return out


def pareto(study: optuna.Study, objectives: Sequence[Objective]) -> list[FrozenTrial]:
    """Feasible measured trials no other feasible one beats on every objective (for one
    objective: the best, ties to the lower trial number)."""
    ok = [t for t in measured(study) if feasible(t) and t.values is not None]

    def dominates(a: FrozenTrial, b: FrozenTrial) -> bool:
        pairs = list(zip(objectives, a.values, b.values, strict=True))
        no_worse = all(not o.better(y, x) for o, x, y in pairs)
        return no_worse and any(o.better(x, y) for o, x, y in pairs)

    front = [t for t in ok if not any(dominates(o, t) for o in ok if o is not t)]
    if len(objectives) == 1 and front:
        o = objectives[0]
        best = front[0]
        for t in front[1:]:
            if o.better(t.values[0], best.values[0]):
                best = t
        return [best]
    return front


def recommended(study: optuna.Study, objectives: Sequence[Objective]) -> FrozenTrial | None:
    """The front's best on the first objective."""
    front = pareto(study, objectives)
    if not front:
        return None
    o = objectives[0]
    best = front[0]
    for t in front[1:]:
        if o.better(t.values[0], best.values[0]):
            best = t
    return best


# -- the depth schedule ---------------------------------------------------------------------
@dataclass(frozen=True)
class Schedule:
    ranges: list[list[int]]  # [[first, last, depth], ...]
    by_concurrency: dict[int, tuple[int, float, str]]  # concurrency -> (depth, figure, case.metric)
    candidates: dict[int, dict[int, float]]  # concurrency -> depth -> median figure

    @property
    def depths(self) -> set[int]:
        return {r[2] for r in self.ranges}

    @property
    def varies(self) -> bool:
        return len(self.depths) > 1


def _same_but_depth(a: Variant, b: Variant) -> bool:
    """b is a or a's variant at another depth (or a's baseline)."""
    if b.is_baseline:
        return a.baseline_hash == b.hash or a.hash == b.hash
    sa, sb = a.config.spec, b.config.spec
    return (
        a.baseline_hash == b.baseline_hash
        and sa.method == sb.method
        and (sa.prompt_lookup_min, sa.prompt_lookup_max) == (sb.prompt_lookup_min, sb.prompt_lookup_max)
    )


def depth_schedule(
    anchor: Candidate, candidates: dict[str, Candidate], results: dict[str, Stored]
) -> Schedule | None:
    """Per concurrency, the best depth among the measured runs that differ from ``anchor``
    only in depth (its baseline is depth 0)."""
    cases = anchor.variant.config.bench.cases
    by_conc: dict[int, str] = {}
    for name, case in cases.items():
        by_conc.setdefault(case.concurrency, name)
    figures: dict[int, dict[int, float]] = {c: {} for c in by_conc}
    for h, stored in results.items():
        cand = candidates.get(h)
        if cand is None or stored.result.status != "ok" or not _same_but_depth(anchor.variant, cand.variant):
            continue
        depth = 0 if cand.variant.is_baseline else cand.variant.config.spec.depth
        for conc, case_name in by_conc.items():
            cr = stored.result.cases.get(case_name)
            metric = primary(cases[case_name])
            if cr is not None and metric in cr.summary:
                figures[conc][depth] = cr.summary[metric].median
    if any(len(f) < 2 for f in figures.values()):
        return None
    chosen: dict[int, tuple[int, float, str]] = {}
    for conc, per_depth in figures.items():
        best = max(per_depth.values())
        depth = min(d for d, v in per_depth.items() if v >= best * (1 - TIE))
        case_name = by_conc[conc]
        chosen[conc] = (depth, per_depth[depth], f"{case_name}.{primary(cases[case_name])}")
    ranges: list[list[int]] = []
    concs = sorted(chosen)
    for i, conc in enumerate(concs):
        first = 1 if i == 0 else conc
        last = concs[i + 1] - 1 if i + 1 < len(concs) else conc
        depth = chosen[conc][0]
        if ranges and ranges[-1][2] == depth:
            ranges[-1][1] = last
        else:
            ranges.append([first, last, depth])
    return Schedule(ranges, chosen, figures)


# -- the experiment file ------------------------------------------------------------------------
def _value(item: str) -> Any:
    """An override's value as YAML would hold it (Hydra's own parser reads it)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return OverridesParser.create().parse_overrides([item])[0].value()


def experiment_yaml(
    variant: Variant,
    *,
    study: str,
    trial: int,
    schedule: Schedule | None,
    figures: dict[str, float],
    depth: int | None = None,
) -> str:
    """``conf/experiment/NAME.yaml`` for a variant: config groups it selects as default
    overrides, dotted keys as values; measurement settings (bench, suite) stay out."""
    groups = {p.name for p in conf_dir().iterdir() if p.is_dir()}
    defaults: list[dict[str, str]] = []
    body: dict[str, Any] = {}
    for item in variant.overrides:
        key = item.split("=", 1)[0].lstrip("+~")
        root = key.split(".", 1)[0]
        if root in CLIENT_SIDE or root == "experiment":
            continue
        value = _value(item)
        if "." not in key and key in groups:
            defaults = [d for d in defaults if f"override /{key}" not in d]
            defaults.append({f"override /{key}": str(value)})
            continue
        node = body
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    spec = variant.config.spec
    if spec.method != "none":
        node = body.setdefault("spec", {})
        # vLLM clamps every scheduled depth to num_speculative_tokens: it is the deepest one
        node["depth"] = max(schedule.depths) if schedule is not None else (depth or spec.depth)
        if schedule is not None:
            node.setdefault("extra", {})["num_speculative_tokens_per_batch_size"] = schedule.ranges
    doc: dict[str, Any] = {}
    if defaults:
        doc["defaults"] = defaults
    doc.update(body)
    lines = [
        "# @package _global_",
        f"# Recommended by `python -m specexp tune` (study {study}, trial {trial}), "
        f"{datetime.now(UTC):%Y-%m-%d}.",
        "# Measured: " + ", ".join(f"{k} {v:.2f}" for k, v in figures.items()),
    ]
    if schedule is not None:
        per = "; ".join(
            f"{c} stream(s): depth {d} ({m} {v:.1f})"
            for c, (d, v, m) in sorted(schedule.by_concurrency.items())
        )
        lines.append(f"# Depth per batch size from the per-concurrency results: {per}.")
    return "\n".join(lines) + "\n" + yaml.safe_dump(doc, sort_keys=False, default_flow_style=None)


def write_experiment(name: str, text: str) -> Path:
    if not name or "/" in name or name.startswith("."):
        raise ConfigError(f"--write-experiment {name!r}: give a plain file name")
    path = conf_dir() / "experiment" / f"{name}.yaml"
    atomic_write_text(path, text)
    return path


# -- vLLM's own tuner ---------------------------------------------------------------------------
def vllm_tuner_command() -> list[str] | None:
    """``vllm bench sweep tune_speculative_k`` through the managed vLLM, if it has it
    (``SPECEXP_VLLM_TUNER`` may name the script of a newer vLLM to run against this one).
    Looked up as a file: importing vLLM to ask would cost seconds."""
    py = vllm_python()
    if py is None:
        return None
    script = os.environ.get("SPECEXP_VLLM_TUNER")
    if script:
        return [str(py), script]
    found = list(vllm_venv().glob("lib/python*/site-packages/vllm/benchmarks/sweep/tune_speculative_k.py"))
    if not found:
        return None
    return [str(py), str(ENTRY_SCRIPT), "bench", "sweep", "tune_speculative_k"]


def _bench_records(stored: Stored, variant_hash: str) -> list[dict[str, Any]]:
    if stored.folder is None:
        return []
    root = stored.folder.parent / "vllm-bench"
    out = []
    for summary in sorted(root.glob("SERVE-*-BENCH-*/summary.json")):
        with contextlib.suppress(OSError, ValueError):
            out += [
                r for r in json.loads(summary.read_bytes()) if r.get("specexp_variant_hash") == variant_hash
            ]
    return out


def compare_with_vllm(
    schedule: Schedule, anchor: Candidate, candidates: dict[str, Candidate], results: dict[str, Stored]
) -> str:
    """Run vLLM's tuner on the same runs' vllm-bench records; say whether it agrees."""
    cmd = vllm_tuner_command()
    if cmd is None:
        return "vllm bench sweep tune_speculative_k: not in the installed vLLM; no comparison"
    with tempfile.TemporaryDirectory(prefix="specexp-tunek-") as tmp:
        runs = 0
        for h, stored in results.items():
            cand = candidates.get(h)
            if cand is None or not _same_but_depth(anchor.variant, cand.variant):
                continue
            records = _bench_records(stored, cand.variant.hash)
            if records:
                runs = min(runs, len(records)) if runs else len(records)
                atomic_write_json(Path(tmp) / f"SERVE-{h}" / "summary.json", records)
        if not runs:
            return "vllm bench sweep tune_speculative_k: no vllm-bench records for these runs"
        out = Path(tmp) / "schedule.json"
        per_case = runs // max(1, len(anchor.variant.config.bench.cases))
        proc = subprocess.run(
            [
                *cmd,
                tmp,
                "--k-var",
                "speculative_config.num_speculative_tokens",
                "--min-runs",
                str(max(1, per_case)),
                "--output-json",
                str(out),
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
        if proc.returncode != 0 or not out.exists():
            lines = [ln for ln in (proc.stderr or proc.stdout).splitlines() if ln.strip()]
            why = lines[-1] if lines else f"exit {proc.returncode}"
            return f"vllm bench sweep tune_speculative_k refused these runs: {why}"
        theirs = json.loads(out.read_text())["num_speculative_tokens_per_batch_size"]
    verdict = "agrees" if theirs == schedule.ranges else "differs"
    return (
        f"vllm bench sweep tune_speculative_k (objective output_throughput, median - 1.48·MAD): "
        f"{json.dumps(theirs)}; specexp: {json.dumps(schedule.ranges)} — {verdict}"
    )


# -- tables and files ---------------------------------------------------------------------------
def _fmt(v: float | None) -> str:
    return "–" if v is None else f"{v:.1f}"


def trials_rows(tuner: Tuner) -> list[list[str]]:
    rows = []
    for t in tuner.study.get_trials(deepcopy=False):
        label = _attr(t, "label", "")
        state = t.state.name.lower()
        how = ""
        if _attr(t, "reused_from"):
            how = f"reused ({_attr(t, 'reused_from')})"
        elif _attr(t, "duplicate_of") is not None:
            how = f"same as trial {_attr(t, 'duplicate_of')}"
        elif _attr(t, "skipped"):
            how = "ruled out by the depth model"
        elif _attr(t, "started"):
            how = "server started"
        elif t.state == TrialState.PRUNED:
            how = "no start"
        if t.state == TrialState.FAIL:
            how = _attr(t, "error") or "failed"
        values = " · ".join(_fmt(v) for v in (t.values or [])) if t.state == TrialState.COMPLETE else ""
        predicted = _attr(t, "predicted") or {}
        pred = " · ".join(_fmt(predicted.get(o.name)) for o in tuner.plan.objectives) if predicted else ""
        bad = [n for n, v in t.constraints.items() if v > 0]
        rows.append([str(t.number), label, state, values, pred, ", ".join(bad), how])
    return rows


def trials_table(tuner: Tuner) -> Table:
    names = " · ".join(o.name for o in tuner.plan.objectives)
    table = Table(title=f"study {tuner.plan.study}: trials", title_justify="left")
    for col in ("#", "variant", "state", f"measured ({names})", "predicted", "violates", "how"):
        table.add_column(col, overflow="fold")
    for row in trials_rows(tuner):
        table.add_row(*map(Text, row))
    return table


def prediction_rows(tuner: Tuner) -> list[list[str]]:
    """The depth model against the measurement, per measured speculative trial."""
    rows = []
    for t in measured(tuner.study):
        predicted = _attr(t, "predicted") or {}
        errors = _attr(t, "prediction_error") or {}
        if not predicted:
            continue
        stored = tuner.results.get(_attr(t, "key"))
        acc = _attr(t, "predicted_acceptance") or {}
        for o, got in zip(tuner.plan.objectives, t.values or [], strict=False):
            if o.name not in predicted:
                continue
            measured_len = None
            if stored is not None:
                cr = stored.result.cases.get(o.case)
                if cr is not None and "acceptance_length" in cr.summary:
                    measured_len = cr.summary["acceptance_length"].median
            pred_len = (acc.get(o.case) or [None])[0]
            rows.append(
                [
                    _attr(t, "label", ""),
                    o.name,
                    f"{predicted[o.name]:.1f}",
                    f"{got:.1f}",
                    f"{errors.get(o.name, 0) * 100:+.1f} %",
                    _fmt2(pred_len),
                    _fmt2(measured_len),
                    _attr(t, "predicted_basis", ""),
                ]
            )
    return rows


def _fmt2(v: float | None) -> str:
    return "–" if v is None else f"{v:.2f}"


def best_rows(tuner: Tuner) -> list[list[str]]:
    rows = []
    for t in pareto(tuner.study, tuner.plan.objectives):
        values = ", ".join(f"{o.name} {v:.1f}" for o, v in zip(tuner.plan.objectives, t.values, strict=True))
        rows.append([str(t.number), _attr(t, "label", ""), values, " ".join(_attr(t, "overrides") or [])])
    return rows


def _md_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in rows]
    return "\n".join(out)


def study_markdown(tuner: Tuner, extra: Sequence[str] = ()) -> str:
    names = " · ".join(o.name for o in tuner.plan.objectives)
    parts = [
        f"# study {tuner.plan.study}",
        "",
        f"strategy {tuner.plan.strategy}; objectives {names}; "
        f"constraints {', '.join(tuner.plan.constraints)}",
        "",
        "## best" if len(tuner.plan.objectives) == 1 else "## Pareto front (feasible)",
        _md_table(["trial", "variant", "measured", "overrides"], best_rows(tuner)),
        "",
        "## trials",
        _md_table(
            ["#", "variant", "state", f"measured ({names})", "predicted", "violates", "how"],
            trials_rows(tuner),
        ),
    ]
    preds = prediction_rows(tuner)
    if preds:
        parts += [
            "",
            "## depth model: prediction beside measurement",
            _md_table(
                [
                    "variant",
                    "figure",
                    "predicted",
                    "measured",
                    "error",
                    "accept. len pred",
                    "measured",
                    "basis",
                ],
                preds,
            ),
        ]
    skipped = [
        [c.variant.label, " · ".join(f"{v:.1f}" for v in pred.values.values()), why]
        for c, pred, why in tuner.ruled_out()
    ]
    if skipped:
        parts += [
            "",
            "## never started (ruled out by the depth model)",
            _md_table(["variant", "predicted", "why"], skipped),
        ]
    parts += ["", *extra]
    return "\n".join(parts) + "\n"


def write_plots(study: optuna.Study, objectives: Sequence[Objective], folder: Path) -> list[Path]:
    """Optuna's own plots (matplotlib, PNG): history per objective, parameter importances,
    the Pareto front. A plot Optuna cannot draw yet (too few trials) is left out."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from optuna.visualization import matplotlib as ovm

    folder.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []

    def save(name: str, draw: Any) -> None:
        try:
            ax = draw()
        except (ValueError, RuntimeError, ImportError, IndexError, ZeroDivisionError):
            plt.close("all")
            return
        fig = ax.figure if hasattr(ax, "figure") else ax[0].figure
        path = folder / f"{name}.png"
        fig.savefig(path, dpi=110, bbox_inches="tight")
        plt.close("all")
        written.append(path)

    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for i, o in enumerate(objectives):
            save(
                f"history-{o.name}",
                lambda i=i, o=o: ovm.plot_optimization_history(
                    study, target=lambda t: t.values[i], target_name=o.name
                ),
            )
            if len(measured(study)) < 5:  # fANOVA over a handful of trials says nothing
                continue
            save(
                f"importance-{o.name}",
                lambda i=i, o=o: ovm.plot_param_importances(
                    study, target=lambda t: t.values[i], target_name=o.name
                ),
            )
        if len(objectives) > 1:
            save("pareto", lambda: ovm.plot_pareto_front(study, target_names=[o.name for o in objectives]))
    return written


def write_study_files(tuner: Tuner, folder: Path, extra: Sequence[str] = ()) -> None:
    if not folder.exists():
        return
    atomic_write_text(folder / "tune.md", study_markdown(tuner, extra))
    write_plots(tuner.study, tuner.plan.objectives, folder / "plots")


def conclusion_lines(conclusion: Any) -> list[str]:
    """Markdown for tune.md: the schedule, the comparison with vLLM's tuner, the experiment."""
    if conclusion is None:
        return []
    out = []
    sched = conclusion.schedule
    if sched is not None:
        out += [
            "## depth per batch size",
            "",
            f"`num_speculative_tokens_per_batch_size: {json.dumps(sched.ranges)}`",
            "",
        ]
        rows = []
        for conc in sorted(sched.candidates):
            per = sched.candidates[conc]
            rows.append(
                [
                    str(conc),
                    ", ".join(f"k={d}: {v:.1f}" for d, v in sorted(per.items())),
                    str(sched.by_concurrency[conc][0]),
                ]
            )
        out += [_md_table(["concurrency", "measured (median)", "chosen depth"], rows), ""]
    if conclusion.vllm_comparison:
        out += [conclusion.vllm_comparison, ""]
    if conclusion.experiment_text:
        where = f" ({conclusion.experiment})" if conclusion.experiment else ""
        out += [
            f"## recommended experiment{where}",
            "",
            "```yaml",
            conclusion.experiment_text.rstrip(),
            "```",
        ]
    return out
