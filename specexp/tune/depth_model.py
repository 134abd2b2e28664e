"""Predict a speculative candidate's throughput before starting its server.

Two halves. **Acceptance** (tokens one decode step emits, draft tokens it verifies):
for ngram it is exact, replayed from the baseline's greedy outputs
(``specexp.tune.replay``); for MTP/EAGLE, whose drafts cannot be replayed, it comes from
the deepest measured run through a model of conditional acceptance (below).
**Step cost**: a decode step that verifies ``δ`` draft tokens costs ``1 + γ + β·δ`` times a
plain step; ``β`` is calibrated per case from the baseline (one token verified) and the
deepest run (``γ`` too once two depths are measured). A candidate's figure is then
``baseline × tokens_per_step / step_cost``, per case, so per concurrency.

**Conditional acceptance.** Raw per-position rates do not carry over between depths:
they are per draft, and a deeper K spends fewer drafts in easy stretches, so position 1
at K=5 is lower than at K=3 (demo, 4 streams: .67 against .75). The model instead
describes the token stream: from a fresh start the drafter is right for a run of ℓ
tokens, ``P(ℓ >= i | ℓ >= i-1) = c_i`` (``c_K`` for i > K); a draft of depth k accepts
``min(r, k)`` of a remaining run r, and after a full acceptance the next draft starts
inside the same run (``r - k - 1`` left: the bonus token is one of its tokens), otherwise
fresh. The c_i are fitted so that the stationary draft starts reproduce the measured
per-position rates at K, then the same stream is drafted at every other depth.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from specexp.config.schema import CaseConfig, SpecConfig
from specexp.record.results import VariantResult
from specexp.tune.objectives import Objective
from specexp.tune.replay import GreedyOutput, replay

_RUN_CAP = 256  # longest run the conditional model tracks (the tail beyond is negligible)


# -- conditional acceptance (MTP, EAGLE) ------------------------------------------------------
def _fresh_tail(c: Sequence[float]) -> np.ndarray:
    """P(ℓ >= i) for i = 0.._RUN_CAP from the continuation probabilities (last one repeats)."""
    surv = np.empty(_RUN_CAP + 2)
    surv[0] = 1.0
    for i in range(1, _RUN_CAP + 2):
        surv[i] = surv[i - 1] * c[min(i, len(c)) - 1]
    return surv


def run_rates(c: Sequence[float], k: int) -> list[float]:
    """Per-position acceptance rates at depth k of the run model with continuations ``c``."""
    surv = _fresh_tail(c)
    fresh = surv[:-1] - surv[1:]  # P(ℓ = r), r = 0.._RUN_CAP
    fresh[-1] += surv[-1]
    # a state r is a draft start of a fresh run r + m(k+1) for some m >= 0
    starts = np.zeros(_RUN_CAP + 1)
    for r in range(_RUN_CAP + 1):
        starts[r] = fresh[r :: k + 1].sum()
    starts /= starts.sum()
    above = np.cumsum(starts[::-1])[::-1]  # P(r >= i)
    return [float(above[i]) for i in range(1, k + 1)]


def fit_continuations(rates: Sequence[float]) -> list[float]:
    """The c_i whose drafts at depth ``len(rates)`` show these per-position rates."""
    from scipy.optimize import least_squares

    k = len(rates)
    target = np.clip(np.asarray(rates, dtype=float), 1e-6, 1 - 1e-6)
    prev = np.concatenate(([1.0], target[:-1]))
    start = np.clip(target / np.maximum(prev, 1e-6), 0.01, 0.99)

    def residual(c: np.ndarray) -> np.ndarray:
        return np.asarray(run_rates(list(c), k)) - target

    fit = least_squares(residual, start, bounds=(1e-4, 0.999), xtol=1e-10, ftol=1e-10)
    return [float(x) for x in fit.x]


@dataclass(frozen=True)
class Acceptance:
    """Per case: what one decode step does at a candidate's settings."""

    tokens_per_step: float  # 1 + accepted per step
    drafts_per_step: float  # draft tokens verified per step
    per_position: tuple[float, ...]
    mean_length: float | None  # vLLM's figure: 1 + accepted / drafts


def ngram_acceptance(outputs: Sequence[GreedyOutput], spec: SpecConfig) -> Acceptance:
    lo, hi = ngram_window(spec)
    stats = replay(outputs, spec.depth, lo, hi)
    return Acceptance(
        stats.tokens_per_step, stats.drafts_per_step, tuple(stats.per_position), stats.mean_length
    )


def ngram_window(spec: SpecConfig) -> tuple[int, int]:
    """vLLM's defaults: both unset is 5..5, one unset takes the other's value."""
    lo, hi = spec.prompt_lookup_min, spec.prompt_lookup_max
    if lo is None and hi is None:
        return 5, 5
    return (lo if lo is not None else hi or 5), (hi if hi is not None else lo or 5)


def conditional_acceptance(deep_rates: Sequence[float], k: int) -> Acceptance:
    rates = run_rates(fit_continuations(deep_rates), k)
    accepted = sum(rates)
    return Acceptance(1 + accepted, float(k), tuple(rates), 1 + accepted)


def naive_acceptance(deep_rates: Sequence[float], k: int) -> Acceptance:
    """The deeper run's raw rates taken as they are (the trap the conditional model avoids;
    kept to measure what it avoids)."""
    rates = list(deep_rates[:k])
    return Acceptance(1 + sum(rates), float(k), tuple(rates), 1 + sum(rates))


# -- step cost ------------------------------------------------------------------------------
@dataclass(frozen=True)
class StepCost:
    """Cost of a step relative to a plain one: ``1 + gamma + beta * drafts_per_step``."""

    beta: float
    gamma: float = 0.0

    def ratio(self, acc: Acceptance) -> float:
        return acc.tokens_per_step / (1 + self.gamma + self.beta * acc.drafts_per_step)


def fit_step_cost(points: Sequence[tuple[float, float]]) -> StepCost | None:
    """``points``: (drafts per step, excess cost) with excess = baseline·τ/measured − 1.
    One point fixes β; two distinct depths fix β and γ (kept only when both come out
    non-negative, else β through the origin)."""
    pts = [(d, y) for d, y in points if d > 0 and math.isfinite(y)]
    if not pts:
        return None
    origin = sum(d * y for d, y in pts) / sum(d * d for d, _ in pts)
    if len({round(d, 6) for d, _ in pts}) >= 2:
        xs, ys = np.array([d for d, _ in pts]), np.array([y for _, y in pts])
        beta, gamma = np.polyfit(xs, ys, 1)
        if beta >= 0 and gamma >= 0:
            return StepCost(float(beta), float(gamma))
    return StepCost(max(origin, 0.0))


# -- the model over a search ---------------------------------------------------------------
@dataclass(frozen=True)
class Prediction:
    values: dict[str, float]  # objective name -> predicted figure
    acceptance: dict[str, Acceptance]  # case -> acceptance at the candidate's settings
    basis: str


@dataclass
class _Measured:
    spec: SpecConfig
    result: VariantResult


@dataclass
class _Group:
    """One configuration without its speculative part: a baseline and its spec runs."""

    baseline: VariantResult | None = None
    greedy: dict[str, list[GreedyOutput]] | None = None
    measured: list[_Measured] = field(default_factory=list)


def _case_rates(result: VariantResult, case: str) -> list[float] | None:
    cr = result.cases.get(case)
    if cr is None:
        return None
    keys = sorted(
        (k for k in cr.summary if k.startswith("acceptance_pos")),
        key=lambda k: int(k.removeprefix("acceptance_pos")),
    )
    return [cr.summary[k].median for k in keys] or None


class DepthModel:
    """Per configuration group: the baseline's figures and greedy outputs, and the measured
    speculative runs that calibrate the step cost."""

    def __init__(self, objectives: Sequence[Objective], cases: Mapping[str, CaseConfig]) -> None:
        self.objectives = list(objectives)
        self.cases = dict(cases)
        self.groups: dict[str, _Group] = {}

    def group(self, key: str) -> _Group:
        return self.groups.setdefault(key, _Group())

    def add_baseline(
        self, key: str, result: VariantResult, greedy: dict[str, list[GreedyOutput]] | None
    ) -> None:
        g = self.group(key)
        g.baseline = result
        if greedy:
            g.greedy = greedy

    def add_greedy(self, key: str, greedy: dict[str, list[GreedyOutput]]) -> None:
        g = self.group(key)
        if g.greedy is None:
            g.greedy = greedy

    def add_measured(self, key: str, spec: SpecConfig, result: VariantResult) -> None:
        g = self.group(key)
        g.measured = [m for m in g.measured if _spec_key(m.spec) != _spec_key(spec)]
        g.measured.append(_Measured(spec, result))

    # -- acceptance -------------------------------------------------------------------------
    def acceptance(self, key: str, spec: SpecConfig) -> tuple[dict[str, Acceptance], str] | None:
        g = self.groups.get(key)
        if g is None or spec.method == "none":
            return None
        if spec.method == "ngram":
            if g.greedy is None or any(c not in g.greedy for c in self.cases):
                return None
            return {c: ngram_acceptance(g.greedy[c], spec) for c in self.cases}, "ngram replay"
        deep = max(
            (m for m in g.measured if m.spec.method == spec.method), key=lambda m: m.spec.depth, default=None
        )
        if deep is None:
            return None
        out = {}
        for case in self.cases:
            rates = _case_rates(deep.result, case)
            if not rates:
                return None
            out[case] = conditional_acceptance(rates, spec.depth)
        return out, f"conditional rates from {spec.method} k={deep.spec.depth}"

    # -- step cost --------------------------------------------------------------------------
    def step_cost(self, key: str, case: str, metric: str) -> StepCost | None:
        g = self.groups.get(key)
        if g is None or g.baseline is None:
            return None
        base = _figure(g.baseline, case, metric)
        if base is None:
            return None
        points = []
        for m in g.measured:
            got = self.acceptance(key, m.spec)
            measured = _figure(m.result, case, metric)
            if got is None or measured is None or measured <= 0:
                continue
            acc = got[0][case]
            points.append((acc.drafts_per_step, base * acc.tokens_per_step / measured - 1))
        return fit_step_cost(points)

    def predict(self, key: str, spec: SpecConfig) -> Prediction | None:
        """Predicted objective figures (throughput only) of a candidate in group ``key``."""
        g = self.groups.get(key)
        if g is None or g.baseline is None:
            return None
        if spec.method == "none":
            values = {o.name: v for o in self.objectives if (v := o.value(g.baseline)) is not None}
            return Prediction(values, {}, "measured baseline")
        got = self.acceptance(key, spec)
        if got is None:
            return None
        acceptance, basis = got
        values = {}
        for o in self.objectives:
            if not o.throughput:
                continue
            base = _figure(g.baseline, o.case, o.metric)
            cost = self.step_cost(key, o.case, o.metric)
            if base is None or cost is None:
                continue
            values[o.name] = base * cost.ratio(acceptance[o.case])
        return Prediction(values, acceptance, basis)

    def calibrated(self, key: str) -> bool:
        g = self.groups.get(key)
        return bool(g and g.baseline is not None and g.measured)


def _figure(result: VariantResult, case: str, metric: str) -> float | None:
    cr = result.cases.get(case)
    if cr is None or metric not in cr.summary:
        return None
    return cr.summary[metric].median


def _spec_key(spec: SpecConfig) -> tuple[str, int, int | None, int | None]:
    return spec.method, spec.depth, spec.prompt_lookup_min, spec.prompt_lookup_max
