"""Objectives from case figures; constraints in Optuna's convention."""

from __future__ import annotations

import pytest

from specexp.config.schema import CaseConfig
from specexp.errors import ConfigError
from specexp.record.results import CaseResult, SuiteCaseResult, SuiteResult, Summary, VariantResult
from specexp.tune.objectives import constraint_values, objective_values, parse_objectives

CASES = {"single": CaseConfig(concurrency=1), "concurrent4": CaseConfig(concurrency=4)}


def result(
    single: float, conc: float, *, loops: int = 0, regression: bool = False, error: str | None = None
) -> VariantResult:
    def case(name: str, conc_: int, metric: str, value: float) -> CaseResult:
        s = Summary(median=value, min=value, max=value, n=3)
        return CaseResult(
            case=name,
            concurrency=conc_,
            trials=[],
            summary={metric: s, "ttft_max_ms": s},
            looping_outputs=loops,
        )

    suite = SuiteResult(
        name="s",
        cases=[
            SuiteCaseResult(
                name="count_r",
                check="exact",
                passed=not regression,
                reason="",
                baseline_passed=True,
                regression=regression,
            )
        ],
    )
    return VariantResult(
        label="v",
        variant_hash="a" * 12,
        is_baseline=False,
        overrides=[],
        status="failed" if error else "ok",
        error=error,
        suite=suite,
        cases={
            "single": case("single", 1, "decode_tok_s", single),
            "concurrent4": case("concurrent4", 4, "output_tok_s", conc),
        },
    )


def test_default_objectives_are_every_cases_main_figure() -> None:
    objs = parse_objectives([], CASES)
    assert [(o.name, o.direction) for o in objs] == [
        ("single.decode_tok_s", "maximize"),
        ("concurrent4.output_tok_s", "maximize"),
    ]
    assert objective_values(objs, result(30.0, 80.0)) == [30.0, 80.0]


def test_directions_and_bare_case_names() -> None:
    objs = parse_objectives(["concurrent4.ttft_max_ms", "single", "concurrent4.output_tok_s:min"], CASES)
    assert [(o.name, o.direction) for o in objs] == [
        ("concurrent4.ttft_max_ms", "minimize"),
        ("single.decode_tok_s", "maximize"),
        ("concurrent4.output_tok_s", "minimize"),
    ]
    assert not objs[0].throughput and objs[1].throughput


@pytest.mark.parametrize(
    ("spec", "message"),
    [("nope", "no case 'nope'"), ("single.speed", "unknown figure"), ("single:up", ":max or :min")],
)
def test_bad_objective_is_one_line(spec: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_objectives([spec], CASES)


def test_constraints_are_feasible_at_or_below_zero() -> None:
    assert constraint_values(result(1, 1)) == [0.0, 0.0, 0.0]
    assert constraint_values(result(1, 1, regression=True)) == [1.0, 0.0, 0.0]
    assert constraint_values(result(1, 1, loops=2)) == [0.0, 4.0, 0.0]  # two looping outputs per case
    gated = result(
        1, 1, error="memory gate: node0 has 1.20 GiB available, below launcher.min_available_gib=4"
    )
    assert constraint_values(gated, ["memory"]) == [1.0]
    with pytest.raises(ConfigError, match="unknown constraint"):
        constraint_values(result(1, 1), ["latency"])
