from __future__ import annotations

from pathlib import Path
from typing import Literal

from specexp.config.compose import plan_sweep
from specexp.config.sweep_plan import SweepPlan
from specexp.record.mlflow_sink import MlflowRecorder, variant_metrics
from specexp.record.results import CaseResult, Summary, SweepResult, VariantResult, Verdict


def result(
    label: str,
    tok_s: float,
    status: Literal["ok", "failed", "interrupted"] = "ok",
    ratio: float | None = None,
) -> VariantResult:
    case = CaseResult(
        case="single",
        concurrency=1,
        trials=[],
        summary={
            "decode_tok_s": Summary(median=tok_s, min=tok_s - 1, max=tok_s + 1, n=3),
            "decode_tok_s_extra": Summary(median=1, min=1, max=1, n=3),
            "acceptance_rate": Summary(median=0.6, min=0.5, max=0.7, n=3),
        },
        verdict=None
        if ratio is None
        else Verdict(metric="decode_tok_s", ratio=ratio, ci_low=1.2, ci_high=1.7, verdict="better"),
    )
    return VariantResult(
        label=label,
        variant_hash="h",
        is_baseline=False,
        overrides=[],
        status=status,
        ready_s=25.0,
        startup_phases={"weight_load_s": 0.6},
        cases={"single": case},
    )


def test_the_headline_is_what_the_table_shows_and_the_rest_stays_in_result_json() -> None:
    m = variant_metrics(result("k3", 36.0, ratio=1.45))
    assert m["single.decode_tok_s"] == 36.0
    # the Hodges-Lehmann ratio of the verdict, inside its own interval (not a ratio of medians)
    assert m["single.decode_tok_s.vs_baseline"] == 1.45
    assert m["single.decode_tok_s.vs_baseline_ci_low"] <= 1.45 <= m["single.decode_tok_s.vs_baseline_ci_high"]
    assert m["single.verdict"] == 1.0 and m["single.acceptance_rate"] == 0.6
    assert m["startup.ready_s"] == 25.0
    assert not [k for k in m if k.endswith((".mad", ".min", ".max", ".cv")) or "extra" in k]


def _sweep(plan: SweepPlan) -> SweepResult:
    return SweepResult(name="s1", started_at="2026-11-30T00:00:00", plan=plan.signature())


def test_runs_in_a_real_sqlite_store_with_statuses(workdir: Path) -> None:
    from mlflow.tracking import MlflowClient

    base, k3 = plan_sweep(["spec.depth=3", "tracking.experiment=t"])
    plan = SweepPlan.resolve([base, k3])
    rec = MlflowRecorder(base.config.tracking)
    assert rec.uri == f"sqlite:///{workdir / 'mlflow.db'}"
    sweep = _sweep(plan)
    rec.start_sweep(sweep, plan, workdir / "s1")
    vdir = workdir / "s1" / "v"
    vdir.mkdir(parents=True)
    (vdir / "result.json").write_text("{}")
    (vdir / "server.log").write_text("log\n")
    rec.start_variant(base, result(base.label, 24.0), vdir)
    rec.finish_variant(base, result(base.label, 24.0), None, vdir)
    failed = result(k3.label, 0.0, status="failed")
    failed.error = "vllm serve exited with code 1"
    rec.start_variant(k3, failed, workdir / "none")
    rec.finish_variant(k3, failed, None, workdir / "none")
    sweep.status = "finished"
    rec.end_sweep(sweep, workdir / "s1")

    client = MlflowClient(rec.uri)
    r1, r2 = sweep.tracking.runs[base.hash], sweep.tracking.runs[k3.hash]
    run1, run2, top = (
        client.get_run(r1),
        client.get_run(r2),
        client.get_run(sweep.tracking.parent_run_id or ""),
    )
    assert run1.info.status == "FINISHED" and run2.info.status == "FAILED" and top.info.status == "FINISHED"
    assert run1.data.tags["mlflow.parentRunId"] == top.info.run_id
    assert (
        run1.data.params["spec.method"] == "none" and run2.data.params["spec.num_speculative_tokens"] == "3"
    )
    assert run2.data.params["spec.prompt_lookup_max"] == "4"
    assert run2.data.tags["specexp.error"] == "vllm serve exited with code 1"
    assert "no MTP layers" in run2.data.tags["specexp.notes"]
    assert run1.data.metrics["single.decode_tok_s"] == 24.0
    assert sorted(a.path for a in client.list_artifacts(r1)) == ["logs", "result.json"]
    assert (workdir / "mlruns" / "t").is_dir()  # artifacts beside mlflow.db, not in the repo
    assert sweep.tracking.synced == [base.hash, k3.hash]


def test_a_resumed_sweep_goes_on_in_its_parent_run_and_replaces_an_unfinished_child(workdir: Path) -> None:
    from mlflow.tracking import MlflowClient

    base, k3 = plan_sweep(["spec.depth=3", "tracking.experiment=t"])
    plan = SweepPlan.resolve([base, k3])
    sweep = _sweep(plan)
    first = MlflowRecorder(base.config.tracking)
    first.start_sweep(sweep, plan, workdir)
    first.start_variant(k3, result(k3.label, 1.0), workdir)  # killed before it finished
    killed = result(k3.label, 1.0, status="interrupted")
    first.finish_variant(k3, killed, None, workdir)
    sweep.status = "interrupted"
    first.end_sweep(sweep, workdir)
    parent, old_child = sweep.tracking.parent_run_id, sweep.tracking.runs[k3.hash]

    again = MlflowRecorder(base.config.tracking)  # a new process resumes the same sweep.json
    again.start_sweep(sweep, plan, workdir)
    assert sweep.tracking.parent_run_id == parent
    again.start_variant(k3, result(k3.label, 30.0), workdir)
    again.finish_variant(k3, result(k3.label, 30.0), None, workdir)
    client = MlflowClient(again.uri)
    children = client.search_runs(
        [again.experiment_id or ""], filter_string=f"tags.`mlflow.parentRunId` = '{parent}'"
    )
    assert [c.info.run_id for c in children] == [sweep.tracking.runs[k3.hash]] != [old_child]
    assert client.get_run(old_child).info.lifecycle_stage == "deleted"
