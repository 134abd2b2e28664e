"""The depth schedule, the experiment file (launchable by ``sweep experiment=NAME``), plots."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import optuna
import pytest

from specexp.config.compose import build_variant, hydra_context, plan_sweep
from specexp.launch.plan import speculative_json
from specexp.paths import conf_dir
from specexp.record.results import CaseResult, Summary, VariantResult
from specexp.tune import report
from specexp.tune.objectives import parse_objectives
from specexp.tune.study import Candidate, Stored

FIXED = ["spec=ngram", "suite=none", "bench=tune_cost"]


@pytest.fixture
def conf(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of the config tree, so an experiment file can be written and composed."""
    copy = tmp_path / "conf"
    shutil.copytree(conf_dir(), copy)
    monkeypatch.setenv("SPECEXP_CONF", str(copy))
    return copy


def _result(c1: float, c4: float) -> VariantResult:
    cases = {
        "c1": CaseResult(
            case="c1",
            concurrency=1,
            trials=[],
            summary={"decode_tok_s": Summary(median=c1, min=c1, max=c1, n=3)},
        ),
        "c4": CaseResult(
            case="c4",
            concurrency=4,
            trials=[],
            summary={"output_tok_s": Summary(median=c4, min=c4, max=c4, n=3)},
        ),
    }
    return VariantResult(label="v", variant_hash="c" * 12, is_baseline=False, overrides=[], cases=cases)


def _grid(
    figures: dict[int, tuple[float, float]],
) -> tuple[dict[str, Candidate], dict[str, Stored], Candidate]:
    with hydra_context():
        base = build_variant([*FIXED, "spec=none"], ["spec", "spec.depth"], baseline=True)
        cands = {base.hash: Candidate({"spec": "none"}, base, base)}
        for k in figures:
            if k == 0:
                continue
            v = build_variant([*FIXED, f"spec.depth={k}"], ["spec", "spec.depth"])
            v = replace(v, baseline_hash=base.hash)
            cands[v.hash] = Candidate({"spec": "ngram", "spec.depth": k}, v, base)
    results = {}
    for h, c in cands.items():
        k = 0 if c.variant.is_baseline else c.variant.config.spec.depth
        results[h] = Stored(_result(*figures[k]), None, "test")
    anchor = next(c for c in cands.values() if not c.variant.is_baseline and c.variant.config.spec.depth == 5)
    return cands, results, anchor


def test_schedule_picks_each_concurrencys_best_depth_and_ties_go_to_the_smaller() -> None:
    # the seeds: depth 5 wins at one stream, depth 3 at four; 5 at four streams is within 1 % of 3
    figures = {0: (20.0, 60.0), 3: (30.0, 80.0), 5: (33.0, 79.5), 8: (31.0, 70.0)}
    cands, results, anchor = _grid(figures)
    sched = report.depth_schedule(anchor, cands, results)
    assert sched is not None
    assert sched.by_concurrency[1][0] == 5 and sched.by_concurrency[4][0] == 3
    assert sched.ranges == [[1, 3, 5], [4, 4, 3]]
    assert sched.candidates[4] == {0: 60.0, 3: 80.0, 5: 79.5, 8: 70.0}


def test_no_speculation_can_win_a_batch_size() -> None:
    cands, results, anchor = _grid({0: (20.0, 90.0), 3: (30.0, 80.0), 5: (33.0, 70.0)})
    sched = report.depth_schedule(anchor, cands, results)
    assert sched is not None and sched.ranges == [[1, 3, 5], [4, 4, 0]]


def test_the_experiment_file_carries_the_schedule_and_is_launchable(conf: Path) -> None:
    cands, results, anchor = _grid({0: (20.0, 60.0), 3: (30.0, 80.0), 5: (33.0, 75.0)})
    sched = report.depth_schedule(anchor, cands, results)
    assert sched is not None
    text = report.experiment_yaml(
        anchor.variant, study="s", trial=2, schedule=sched, figures={"c1.decode_tok_s": 33.0}
    )
    path = report.write_experiment("ngram_best", text)
    assert path == conf / "experiment" / "ngram_best.yaml"
    assert "override /spec: ngram" in text and "bench" not in text.split("\n", 3)[-1]
    (variant,) = plan_sweep(["experiment=ngram_best"], with_baseline=False)
    spec = variant.config.spec
    assert (spec.method, spec.depth) == ("ngram", 5)
    assert spec.extra["num_speculative_tokens_per_batch_size"] == [[1, 3, 5], [4, 4, 3]]
    assert '"num_speculative_tokens_per_batch_size":[[1,3,5],[4,4,3]]' in (
        speculative_json(variant.config) or ""
    )
    # with its baseline, as any sweep
    assert plan_sweep(["experiment=ngram_best"])[0].label == "baseline"
    with pytest.raises(Exception, match="plain file name"):
        report.write_experiment("../evil", text)


def test_pareto_front_keeps_only_feasible_undominated_trials() -> None:
    objs = parse_objectives([], {"c1": _case(1), "c4": _case(4)})
    study = optuna.create_study(directions=["maximize", "maximize"])
    rows = [((30, 80), {}), ((33, 75), {}), ((29, 79), {}), ((40, 90), {"regressions": 1.0})]
    for values, cons in rows:
        t = study.ask()
        t.set_user_attr("specexp.key", str(values))
        for key, value in cons.items():
            t.set_constraint(key, value)
        study.tell(t, list(values))
    front = report.pareto(study, objs)
    assert sorted(tuple(t.values) for t in front) == [(30, 80), (33, 75)]
    best = report.recommended(study, objs)
    assert best is not None and best.values == [33, 75]


def _case(conc: int) -> Any:
    from specexp.config.schema import CaseConfig

    return CaseConfig(concurrency=conc)


def test_optunas_plots_are_written(tmp_path: Path) -> None:
    objs = parse_objectives([], {"c1": _case(1), "c4": _case(4)})
    study = optuna.create_study(directions=["maximize", "maximize"])
    for i in range(6):
        t = study.ask()
        t.suggest_int("spec.depth", 1, 8)
        t.set_user_attr("specexp.key", str(i))
        study.tell(t, [float(i), float(10 - i)])
    written = {p.name for p in report.write_plots(study, objs, tmp_path / "plots")}
    assert {"history-c1.decode_tok_s.png", "history-c4.output_tok_s.png", "pareto.png"} <= written
    assert all((tmp_path / "plots" / name).stat().st_size > 1000 for name in written)
