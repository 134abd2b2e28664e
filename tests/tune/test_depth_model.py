"""The depth model: conditional acceptance across depths, the step cost, predictions."""

from __future__ import annotations

import random

import pytest

from specexp.config.schema import CaseConfig, SpecConfig
from specexp.record.results import CaseResult, Summary, VariantResult
from specexp.tune.depth_model import (
    DepthModel,
    StepCost,
    conditional_acceptance,
    fit_continuations,
    fit_step_cost,
    naive_acceptance,
    ngram_acceptance,
    ngram_window,
    run_rates,
)
from specexp.tune.objectives import parse_objectives
from specexp.tune.replay import GreedyOutput


def drafted_rates(runs: list[int], k: int) -> list[float]:
    """Draft a token stream at depth k: per position, the run of tokens the drafter would
    get right from there (a run of l tokens, then one it gets wrong)."""
    remaining = [r for length in runs for r in range(length, -1, -1)]
    counts, drafts, s = [0] * k, 0, 0
    while s < len(remaining):
        accepted = min(remaining[s], k)
        drafts += 1
        for i in range(accepted):
            counts[i] += 1
        s += accepted + 1
    return [c / drafts for c in counts]


def test_conditional_model_carries_rates_across_depths_where_raw_rates_do_not() -> None:
    rng = random.Random(7)
    cont = [0.8, 0.9, 0.9, 0.95, 0.95, 0.95, 0.97, 0.97]

    def run() -> int:
        length = 0
        while rng.random() < cont[min(length, len(cont) - 1)]:
            length += 1
        return length

    runs = [run() for _ in range(60_000)]
    deep = drafted_rates(runs, 8)
    # the trap: a deeper K spends fewer drafts in easy stretches, so its raw rates are lower
    assert drafted_rates(runs, 3)[0] > deep[0] + 0.02
    for k in (1, 3, 5):
        truth = drafted_rates(runs, k)
        cond = conditional_acceptance(deep, k).per_position
        naive = naive_acceptance(deep, k).per_position
        err_cond = max(abs(a - b) for a, b in zip(cond, truth, strict=True))
        err_naive = max(abs(a - b) for a, b in zip(naive, truth, strict=True))
        assert err_cond < 0.01, (k, cond, truth)
        assert err_naive > 2 * err_cond


def test_fit_reproduces_the_rates_it_was_given() -> None:
    rates = [0.75, 0.6, 0.52, 0.45, 0.4]
    c = fit_continuations(rates)
    assert run_rates(c, 5) == pytest.approx(rates, abs=1e-6)
    assert conditional_acceptance(rates, 5).mean_length == pytest.approx(1 + sum(rates), abs=1e-5)


def test_step_cost_from_one_or_two_depths() -> None:
    assert fit_step_cost([]) is None
    one = fit_step_cost([(4.0, 0.8)])
    assert one is not None and one.beta == pytest.approx(0.2)
    two = fit_step_cost([(2.0, 0.5), (6.0, 1.3)])  # 0.1 + 0.2 * d
    assert two is not None and two.beta == pytest.approx(0.2) and two.gamma == pytest.approx(0.1)
    noisy = fit_step_cost([(2.0, 0.6), (6.0, 0.5)])  # a negative slope is noise: through the origin
    assert noisy is not None and noisy.gamma == 0.0 and noisy.beta > 0


def test_ngram_window_follows_vllm_defaults() -> None:
    assert ngram_window(SpecConfig(method="ngram", depth=3)) == (5, 5)
    assert ngram_window(SpecConfig(method="ngram", depth=3, prompt_lookup_max=4)) == (4, 4)
    assert ngram_window(SpecConfig(method="ngram", depth=3, prompt_lookup_min=2, prompt_lookup_max=4)) == (
        2,
        4,
    )


def _result(value: float, case: str = "single") -> VariantResult:
    s = Summary(median=value, min=value, max=value, n=3)
    cr = CaseResult(case=case, concurrency=1, trials=[], summary={"decode_tok_s": s})
    return VariantResult(label="v", variant_hash="b" * 12, is_baseline=False, overrides=[], cases={case: cr})


def test_predictions_calibrate_on_the_deepest_run() -> None:
    cases = {"single": CaseConfig(concurrency=1)}
    model = DepthModel(parse_objectives([], cases), cases)
    text = tuple([1, 2, 3, 4, 5, 6, 7, 8] * 6)
    greedy = {"single": [GreedyOutput(text[:20], text[20:])]}
    ngram = {
        k: SpecConfig(method="ngram", depth=k, prompt_lookup_min=2, prompt_lookup_max=4) for k in (2, 4, 8)
    }
    beta = 0.15  # the "true" step cost the fake measurements follow
    truth = {k: 20.0 * StepCost(beta).ratio(ngram_acceptance(greedy["single"], ngram[k])) for k in ngram}
    assert model.predict("g", ngram[4]) is None  # nothing known yet
    model.add_baseline("g", _result(20.0), greedy)
    plain, deeper = model.predict("g", SpecConfig()), model.predict("g", ngram[4])
    assert plain is not None and plain.values == {"single.decode_tok_s": 20.0}
    assert deeper is not None and deeper.values == {}  # acceptance known, step cost not yet
    model.add_measured("g", ngram[8], _result(truth[8]))
    assert model.calibrated("g")
    for k in ngram:
        got = model.predict("g", ngram[k])
        assert got is not None and got.basis == "ngram replay"
        assert got.values["single.decode_tok_s"] == pytest.approx(truth[k])
    eagle = SpecConfig(method="eagle", depth=3, model="/draft")
    assert model.predict("g", eagle) is None  # no eagle run measured: no rates to condition on
