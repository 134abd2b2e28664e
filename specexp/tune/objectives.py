"""What a search optimizes and what a candidate must not break.

Objectives are case figures (``single.decode_tok_s``, ``concurrent4.output_tok_s``,
``concurrent4.ttft_max_ms``): the median over the variant's trials, the same number the
sweep table shows. Several objectives make a Pareto front. Constraints follow Optuna's
convention (a value <= 0 is feasible) and reach the samplers as the trial's named
constraints (``Trial.set_constraint``, Optuna 5's successor of ``constraints_func``):
a functional regression against the baseline, looping outputs (prompt lookup then fakes
its acceptance), and the host-memory gate where the launcher has one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import optuna

from specexp.config.schema import CaseConfig
from specexp.errors import ConfigError
from specexp.record.results import VariantResult

Direction = Literal["maximize", "minimize"]
MEMORY_GATE = "memory gate:"  # how a variant stopped by the host-memory gate says so
CONSTRAINT_NAMES = ("regressions", "looping", "memory")

# Figures a case records per trial, and which way is better.
_MAXIMIZE = ("decode_tok_s", "output_tok_s", "jain_index", "acceptance_rate", "acceptance_length")
_MINIMIZE = ("ttft_ms", "ttft_max_ms", "ttft_spread_ms")


def primary(case: CaseConfig) -> str:
    """The figure a case is about (as specexp.measure.stats.primary_metric)."""
    return "decode_tok_s" if case.concurrency == 1 else "output_tok_s"


@dataclass(frozen=True)
class Objective:
    case: str
    metric: str
    direction: Direction
    concurrency: int

    @property
    def name(self) -> str:
        return f"{self.case}.{self.metric}"

    @property
    def throughput(self) -> bool:
        """Figures the step-cost model predicts (tokens per second)."""
        return self.metric.endswith("_tok_s")

    def value(self, result: VariantResult) -> float | None:
        case = result.cases.get(self.case)
        if case is None or self.metric not in case.summary:
            return None
        return case.summary[self.metric].median

    def better(self, a: float, b: float) -> bool:
        return a > b if self.direction == "maximize" else a < b

    def worst(self) -> float:
        return 0.0 if self.direction == "maximize" else float("inf")


def parse_objectives(specs: Sequence[str], cases: Mapping[str, CaseConfig]) -> list[Objective]:
    """``case.metric[:max|:min]``; a bare case name means its main figure; none given means
    every case's main figure (one start measures them all, so the front is free)."""
    if not cases:
        raise ConfigError("bench.cases is empty: nothing to optimize")
    if not specs:
        return [Objective(name, primary(c), "maximize", c.concurrency) for name, c in cases.items()]
    out: list[Objective] = []
    for spec in specs:
        text, _, way = spec.partition(":")
        case_name, _, metric = text.partition(".")
        if case_name not in cases:
            raise ConfigError(f"objective {spec!r}: no case {case_name!r} (cases: {', '.join(cases)})")
        case = cases[case_name]
        metric = metric or primary(case)
        if metric not in (*_MAXIMIZE, *_MINIMIZE):
            known = ", ".join((*_MAXIMIZE, *_MINIMIZE))
            raise ConfigError(f"objective {spec!r}: unknown figure {metric!r} (known: {known})")
        direction: Direction = "maximize" if metric in _MAXIMIZE else "minimize"
        if way:
            if way not in ("max", "min", "maximize", "minimize"):
                raise ConfigError(f"objective {spec!r}: direction must be :max or :min")
            direction = "maximize" if way.startswith("max") else "minimize"
        obj = Objective(case_name, metric, direction, case.concurrency)
        if obj.name in {o.name for o in out}:
            raise ConfigError(f"objective {obj.name} is given twice")
        out.append(obj)
    return out


def objective_values(objectives: Sequence[Objective], result: VariantResult) -> list[float] | None:
    values = [o.value(result) for o in objectives]
    if any(v is None for v in values):
        return None
    return [float(v) for v in values if v is not None]


def constraint_values(result: VariantResult, names: Sequence[str] = CONSTRAINT_NAMES) -> list[float]:
    """One value per constraint, feasible when <= 0: how many suite cases regressed against
    the baseline, how many outputs looped, whether the memory gate stopped the variant."""
    out = []
    for name in names:
        if name == "regressions":
            out.append(float(len(result.suite.regressions)) if result.suite is not None else 0.0)
        elif name == "looping":
            out.append(float(sum(c.looping_outputs for c in result.cases.values())))
        elif name == "memory":
            out.append(1.0 if (result.error or "").startswith(MEMORY_GATE) else 0.0)
        else:
            raise ConfigError(f"unknown constraint {name!r} (known: {', '.join(CONSTRAINT_NAMES)})")
    return out


def check_constraint_names(names: Sequence[str]) -> None:
    for name in names:
        if name not in CONSTRAINT_NAMES:
            raise ConfigError(f"unknown constraint {name!r} (known: {', '.join(CONSTRAINT_NAMES)})")


def feasible(trial: optuna.trial.FrozenTrial) -> bool:
    """Optuna's rule: every constraint value <= 0 (a trial without constraints is feasible)."""
    return all(v <= 0 for v in trial.constraints.values())
