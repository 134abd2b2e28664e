"""MLflow as a sink: one parent run per sweep, one child run per variant.

Runs are opened when work starts and closed with the status the work earned:
FINISHED only after every metric and artifact is logged, FAILED with the
reason, KILLED on Ctrl-C, so no half-logged run ever looks good. The tracking
store is sqlite (``mlflow.db``) with artifacts under ``mlruns/``: MLflow 3.17's
``./mlruns`` file store raises unless explicitly allowed.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specexp.config.schema import TrackingConfig
from specexp.config.variant import Variant, flatten
from specexp.paths import workdir
from specexp.record.results import VariantResult

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

_MAX_PARAM = 6000


def tracking_uri(cfg: TrackingConfig) -> str:
    return cfg.uri or f"sqlite:///{workdir() / 'mlflow.db'}"


def artifact_root(cfg: TrackingConfig) -> Path:
    return Path(cfg.artifact_dir or workdir() / "mlruns").resolve()


def variant_metrics(result: VariantResult, baseline: VariantResult | None) -> dict[str, float]:
    """Flat metric names: ``<case>.<metric>.{median,min,max}`` plus ratios to the baseline."""
    out: dict[str, float] = {}
    if result.ready_s is not None:
        out["startup.ready_s"] = result.ready_s
    for phase, seconds in result.startup_phases.items():
        out[f"startup.{phase}"] = seconds
    if result.suite is not None:
        suite = result.suite
        out["regression.passed"] = float(suite.passed)
        out["regression.failed"] = float(suite.failed)
        out["regression.not_run"] = float(suite.not_run)
        out["regression.regressions"] = float(len(suite.regressions))
        if suite.equivalence_rate is not None:
            out["equivalence.rate"] = suite.equivalence_rate
    for case, cr in result.cases.items():
        for metric, s in cr.summary.items():
            out[f"{case}.{metric}.median"] = s.median
            out[f"{case}.{metric}.min"] = s.min
            out[f"{case}.{metric}.max"] = s.max
            out[f"{case}.{metric}.mad"] = s.mad
            if s.cv is not None:
                out[f"{case}.{metric}.cv"] = s.cv
            if s.outliers:
                out[f"{case}.{metric}.outlier_trials"] = float(len(s.outliers))
            if baseline is not None and metric in ("output_tok_s", "decode_tok_s"):
                base = baseline.cases.get(case)
                if base and metric in base.summary and base.summary[metric].median > 0:
                    out[f"{case}.{metric}.vs_baseline"] = s.median / base.summary[metric].median
        out[f"{case}.failed_requests"] = float(cr.failed_requests)
        out[f"{case}.looping_outputs"] = float(cr.looping_outputs)
        if cr.verdict is not None:
            v = cr.verdict
            if v.ci_low is not None and v.ci_high is not None:
                out[f"{case}.{v.metric}.vs_baseline_ci_low"] = v.ci_low
                out[f"{case}.{v.metric}.vs_baseline_ci_high"] = v.ci_high
            out[f"{case}.verdict"] = {"better": 1.0, "worse": -1.0}.get(v.verdict, 0.0)
    return out


class MlflowSink:
    def __init__(self, cfg: TrackingConfig) -> None:
        os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
        logging.getLogger("mlflow").setLevel(logging.WARNING)
        logging.getLogger("alembic").setLevel(logging.WARNING)
        from mlflow.tracking import MlflowClient

        self.uri = tracking_uri(cfg)
        self.client: MlflowClient = MlflowClient(tracking_uri=self.uri)
        exp = self.client.get_experiment_by_name(cfg.experiment)
        if exp is None:
            root = artifact_root(cfg)
            root.mkdir(parents=True, exist_ok=True)
            self.experiment_id = self.client.create_experiment(
                cfg.experiment,
                artifact_location=(root / cfg.experiment).as_uri(),
                tags={"mlflow.experimentKind": "custom_model_development"},
            )
        else:
            self.experiment_id = exp.experiment_id
        self.parent_id: str | None = None

    def start_sweep(self, name: str, params: dict[str, Any]) -> str:
        run = self.client.create_run(self.experiment_id, run_name=name, tags={"specexp.kind": "sweep"})
        self.parent_id = run.info.run_id
        self._log_params(self.parent_id, params)
        return self.parent_id

    def start_variant(self, variant: Variant) -> str:
        tags = {
            "specexp.kind": "variant",
            "specexp.label": variant.label,
            "specexp.hash": variant.hash,
            "specexp.baseline": str(variant.is_baseline).lower(),
            "specexp.overrides": " ".join(variant.overrides)[:5000],
        }
        if variant.notes:
            tags["specexp.notes"] = " | ".join(variant.notes)[:5000]
        if self.parent_id:
            tags["mlflow.parentRunId"] = self.parent_id
        run = self.client.create_run(self.experiment_id, run_name=variant.label, tags=tags)
        params = flatten(variant.resolved)
        params["spec.num_speculative_tokens"] = variant.config.spec.depth
        self._log_params(run.info.run_id, params)
        return run.info.run_id

    def finish_variant(
        self,
        run_id: str,
        result: VariantResult,
        baseline: VariantResult | None,
        artifacts: list[Path],
    ) -> None:
        """Log metrics and artifacts, then close the run with the status the variant earned."""
        status = {"ok": "FINISHED", "failed": "FAILED", "interrupted": "KILLED"}[result.status]
        try:
            metrics = variant_metrics(result, baseline)
            if metrics:
                from mlflow.entities import Metric

                ts = _now_ms()
                batch = [Metric(k, float(v), ts, 0) for k, v in metrics.items()]
                for i in range(0, len(batch), 900):
                    self.client.log_batch(run_id, metrics=batch[i : i + 900])
            if result.error:
                self.client.set_tag(run_id, "specexp.error", result.error[:5000])
            if result.suite is not None and result.suite.regressions:
                self.client.set_tag(run_id, "specexp.regressions", ", ".join(result.suite.regressions))
            if any(cr.looping_outputs for cr in result.cases.values()):
                self.client.set_tag(run_id, "specexp.degenerate_output", "true")
            for case, cr in result.cases.items():
                if cr.verdict is not None:
                    self.client.set_tag(run_id, f"specexp.verdict.{case}", cr.verdict.verdict)
            for path in artifacts:
                if path.exists():
                    self.client.log_artifact(run_id, str(path))
        except BaseException:
            self.client.set_terminated(run_id, status="FAILED")
            raise
        self.client.set_terminated(run_id, status=status)

    def end_sweep(self, status: str, metrics: dict[str, float] | None = None) -> None:
        if self.parent_id is None:
            return
        if metrics:
            from mlflow.entities import Metric

            ts = _now_ms()
            self.client.log_batch(self.parent_id, metrics=[Metric(k, v, ts, 0) for k, v in metrics.items()])
        self.client.set_terminated(self.parent_id, status=status)

    def _log_params(self, run_id: str, params: dict[str, Any]) -> None:
        from mlflow.entities import Param

        items = [Param(k[:250], _param_value(v)) for k, v in sorted(params.items())]
        for i in range(0, len(items), 90):
            self.client.log_batch(run_id, params=items[i : i + 90])

    def runs_url_hint(self) -> str:
        return f"#/experiments/{self.experiment_id}/runs"


def _param_value(value: Any) -> str:
    text = "null" if value is None else str(value)
    return text if len(text) <= _MAX_PARAM else text[: _MAX_PARAM - 3] + "..."


def _now_ms() -> int:
    import time

    return int(time.time() * 1000)
