from __future__ import annotations

from pathlib import Path

from specexp.config.compose import plan_sweep
from specexp.record.mlflow_sink import MlflowSink, variant_metrics
from specexp.record.results import CaseResult, Summary, VariantResult


def result(label: str, tok_s: float, status: str = "ok") -> VariantResult:
    case = CaseResult(
        case="single",
        concurrency=1,
        trials=[],
        summary={"decode_tok_s": Summary(median=tok_s, min=tok_s - 1, max=tok_s + 1, n=3)},
    )
    return VariantResult(
        label=label,
        variant_hash="h",
        is_baseline=False,
        overrides=[],
        status=status,  # type: ignore[arg-type]
        ready_s=25.0,
        startup_phases={"weight_load_s": 0.6},
        cases={"single": case},
    )


def test_metrics_are_flat_with_ratio_to_baseline() -> None:
    m = variant_metrics(result("k3", 36.0), result("base", 24.0))
    assert m["single.decode_tok_s.median"] == 36.0 and m["single.decode_tok_s.min"] == 35.0
    assert m["single.decode_tok_s.vs_baseline"] == 1.5
    assert m["startup.ready_s"] == 25.0 and m["startup.weight_load_s"] == 0.6


def test_runs_in_a_real_sqlite_store_with_statuses(workdir: Path) -> None:
    from mlflow.tracking import MlflowClient

    base, k3 = plan_sweep(["spec.depth=3", "tracking.experiment=t"])
    sink = MlflowSink(base.config.tracking)
    assert sink.uri == f"sqlite:///{workdir / 'mlflow.db'}"
    parent = sink.start_sweep("s1", {"variants": 2})
    art = workdir / "result.json"
    art.write_text("{}")
    r1 = sink.start_variant(base)
    sink.finish_variant(r1, result(base.label, 24.0), None, [art])
    r2 = sink.start_variant(k3)
    failed = result(k3.label, 0.0, status="failed")
    failed.error = "vllm serve exited with code 1"
    sink.finish_variant(r2, failed, None, [])
    sink.end_sweep("FINISHED")

    client = MlflowClient(sink.uri)
    run1, run2, top = client.get_run(r1), client.get_run(r2), client.get_run(parent)
    assert run1.info.status == "FINISHED" and run2.info.status == "FAILED" and top.info.status == "FINISHED"
    assert run1.data.tags["mlflow.parentRunId"] == parent
    assert (
        run1.data.params["spec.method"] == "none" and run2.data.params["spec.num_speculative_tokens"] == "3"
    )
    assert run2.data.params["spec.prompt_lookup_max"] == "4"
    assert run2.data.tags["specexp.error"] == "vllm serve exited with code 1"
    assert "no MTP layers" in run2.data.tags["specexp.notes"]
    assert run1.data.metrics["single.decode_tok_s.median"] == 24.0
    assert [a.path for a in client.list_artifacts(r1)] == ["result.json"]
    assert (workdir / "mlruns" / "t").is_dir()  # artifacts beside mlflow.db, not in the repo
