"""MLflow as a sink: one parent run per sweep, one child run per variant.

Runs are opened when work starts and closed with the status the work earned:
FINISHED only after every metric and artifact is logged, FAILED with the
reason, KILLED on Ctrl-C, so no half-logged run ever looks good. The tracking
store is sqlite (``mlflow.db``) with artifacts under ``mlruns/``: MLflow 3.17's
``./mlruns`` file store raises unless explicitly allowed.

A run carries the headline a person compares (each case's main figure, its ratio to
the baseline with the interval, acceptance, TTFT and fairness); every other figure is
in the ``result.json`` artifact. The run ids are kept in ``sweep.json``, so a resumed
sweep goes on in its parent run and ``sync`` never logs a variant twice.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specexp.config.schema import TrackingConfig
from specexp.config.sweep_plan import SweepPlan
from specexp.config.variant import Variant, flatten
from specexp.measure.stats import primary_metric
from specexp.paths import workdir
from specexp.record.results import SweepResult, VariantResult

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

_MAX_PARAM = 6000
VARIANT_FILES = ("config.yaml", "launch.json", "result.json", "suite.json", "requests.jsonl")
_STATUS = {"ok": "FINISHED", "failed": "FAILED", "interrupted": "KILLED"}
_SWEEP_STATUS = {"running": "RUNNING", "finished": "FINISHED", "failed": "FAILED", "interrupted": "KILLED"}
# Figures shown per case besides its main one (when measured).
_HEADLINE = ("acceptance_rate", "acceptance_length", "ttft_ms", "ttft_spread_ms", "jain_index")


def tracking_uri(cfg: TrackingConfig) -> str:
    return cfg.uri or f"sqlite:///{workdir() / 'mlflow.db'}"


def artifact_root(cfg: TrackingConfig) -> Path:
    return Path(cfg.artifact_dir or workdir() / "mlruns").resolve()


def variant_metrics(result: VariantResult) -> dict[str, float]:
    """The headline of a variant: per case its main figure (median over trials), the
    Hodges-Lehmann ratio to the baseline that the table shows and its interval, the
    verdict (+1 better, -1 worse, 0 none), acceptance, TTFT and fairness.

    Order matters: MLflow's compare page plots the first metric every run shares, so the
    cases' main figures come first and startup last."""
    out: dict[str, float] = {}
    for case, cr in result.cases.items():
        main = primary_metric(cr)
        if main in cr.summary:
            out[f"{case}.{main}"] = cr.summary[main].median
    for case, cr in result.cases.items():
        v = cr.verdict
        if v is not None:
            out[f"{case}.{v.metric}.vs_baseline"] = v.ratio
            if v.ci_low is not None and v.ci_high is not None:
                out[f"{case}.{v.metric}.vs_baseline_ci_low"] = v.ci_low
                out[f"{case}.{v.metric}.vs_baseline_ci_high"] = v.ci_high
            out[f"{case}.verdict"] = {"better": 1.0, "worse": -1.0}.get(v.verdict, 0.0)
        for metric in _HEADLINE:
            if metric in cr.summary:
                out[f"{case}.{metric}"] = cr.summary[metric].median
        if cr.failed_requests:
            out[f"{case}.failed_requests"] = float(cr.failed_requests)
        if cr.looping_outputs:
            out[f"{case}.looping_outputs"] = float(cr.looping_outputs)
    if result.suite is not None:
        suite = result.suite
        out["regression.passed"] = float(suite.passed)
        out["regression.failed"] = float(suite.failed)
        out["regression.not_run"] = float(suite.not_run)
        out["regression.regressions"] = float(len(suite.regressions))
        out["regression.flaky"] = float(len(suite.flaky))
        if suite.equivalence_rate is not None:
            out["equivalence.rate"] = suite.equivalence_rate
        if suite.self_equivalence_rate is not None:
            out["equivalence.self_rate"] = suite.self_equivalence_rate
        if suite.baseline_self_equivalence is not None:
            out["equivalence.baseline_self_rate"] = suite.baseline_self_equivalence
        if suite.divergence_p is not None:
            out["equivalence.divergence_p"] = suite.divergence_p
        if suite.diverges_beyond_noise is not None:
            out["equivalence.beyond_noise"] = float(suite.diverges_beyond_noise)
    if isinstance(result.effective.get("nccl.busbw_gbs"), int | float):  # the NCCL preflight
        out["nccl.busbw_gbs"] = float(result.effective["nccl.busbw_gbs"])
    if result.ready_s is not None:
        out["startup.ready_s"] = result.ready_s
    return out


def _param_value(value: Any) -> str:
    text = "null" if value is None else str(value)
    return text if len(text) <= _MAX_PARAM else text[: _MAX_PARAM - 3] + "..."


def _now_ms() -> int:
    return int(time.time() * 1000)


class MlflowRecorder:
    """A Recorder (specexp.record.recorder) that logs to one MLflow experiment."""

    def __init__(self, cfg: TrackingConfig) -> None:
        os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
        # a store that does not answer must fail within seconds, not after minutes of retries
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
        self.cfg = cfg
        self.uri = tracking_uri(cfg)
        self._client: MlflowClient | None = None
        self.experiment_id: str | None = None
        self.sweep: SweepResult | None = None

    @property
    def client(self) -> MlflowClient:
        if self._client is None:
            from mlflow.tracking import MlflowClient

            # mlflow sets its logger to INFO when imported and logs a traceback before raising
            # a store error; specexp reports a failing store itself, in one line
            logging.getLogger("mlflow").setLevel(logging.CRITICAL)
            logging.getLogger("alembic").setLevel(logging.WARNING)
            client = MlflowClient(tracking_uri=self.uri)
            exp = client.get_experiment_by_name(self.cfg.experiment)
            if exp is None:
                root = artifact_root(self.cfg)
                root.mkdir(parents=True, exist_ok=True)
                self.experiment_id = client.create_experiment(
                    self.cfg.experiment,
                    artifact_location=(root / self.cfg.experiment).as_uri(),
                    tags={"mlflow.experimentKind": "custom_model_development"},
                )
            else:
                self.experiment_id = exp.experiment_id
            self._client = client
        return self._client

    # -- Recorder ------------------------------------------------------------------------
    def start_sweep(self, sweep: SweepResult, plan: SweepPlan, folder: Path) -> None:
        self.sweep = sweep
        client = self.client
        state = sweep.tracking
        if state.parent_run_id and state.uri == self.uri:
            client.update_run(state.parent_run_id, status="RUNNING")  # a resumed sweep goes on in it
            return
        run = client.create_run(
            self._experiment(),
            run_name=sweep.name,
            tags={"specexp.kind": "sweep", "specexp.sweep": sweep.name},
        )
        state.uri, state.experiment_id, state.parent_run_id = self.uri, self._experiment(), run.info.run_id
        state.runs, state.synced = {}, []
        self._log_params(
            run.info.run_id,
            {
                "variants": len(plan.variants),
                "labels": ", ".join(v.label for v in plan.variants),
                "order": plan.order,
                "launches": plan.launches,
                "results_dir": str(folder),
            },
        )

    def start_variant(self, variant: Variant, result: VariantResult, folder: Path) -> None:
        assert self.sweep is not None, "start_sweep first"
        state = self.sweep.tracking
        old = state.runs.get(variant.hash)
        if old is not None:  # an earlier attempt that did not finish: it is replaced, not doubled
            self.client.delete_run(old)
            if variant.hash in state.synced:
                state.synced.remove(variant.hash)
        tags = {
            "specexp.kind": "variant",
            "specexp.sweep": self.sweep.name,
            "specexp.label": variant.label,
            "specexp.hash": variant.hash,
            "specexp.baseline": str(variant.is_baseline).lower(),
            "specexp.overrides": " ".join(variant.overrides)[:5000],
        }
        if variant.notes:
            tags["specexp.notes"] = " | ".join(variant.notes)[:5000]
        if state.parent_run_id:
            tags["mlflow.parentRunId"] = state.parent_run_id
        run = self.client.create_run(self._experiment(), run_name=variant.label, tags=tags)
        state.runs[variant.hash] = run.info.run_id
        params = flatten(variant.resolved)
        params["spec.num_speculative_tokens"] = variant.config.spec.depth
        self._log_params(run.info.run_id, params)

    def launched(self, variant: Variant, result: VariantResult, folder: Path) -> None:
        if result.launch.get("base_url"):
            self.tag(variant, "specexp.base_url", str(result.launch["base_url"]))

    def tag(self, variant: Variant, key: str, value: str) -> None:
        run_id = self._run_of(variant.hash)
        if run_id is not None:
            self.client.set_tag(run_id, key, value[:5000])

    def finish_variant(
        self, variant: Variant, result: VariantResult, baseline: VariantResult | None, folder: Path
    ) -> None:
        """Log metrics and artifacts, then close the run with the status the variant earned."""
        run_id = self._run_of(variant.hash)
        if run_id is None:
            return
        client = self.client
        try:
            metrics = variant_metrics(result)
            if metrics:
                from mlflow.entities import Metric

                ts = _now_ms()
                batch = [Metric(k, float(v), ts, 0) for k, v in metrics.items()]
                for i in range(0, len(batch), 900):
                    client.log_batch(run_id, metrics=batch[i : i + 900])
            tags = {}
            if result.error:
                tags["specexp.error"] = result.error[:5000]
            if result.suite is not None and result.suite.regressions:
                tags["specexp.regressions"] = ", ".join(result.suite.regressions)
            if result.suite is not None and result.suite.flaky:
                tags["specexp.flaky"] = ", ".join(result.suite.flaky)
            if any(cr.looping_outputs for cr in result.cases.values()):
                tags["specexp.degenerate_output"] = "true"
            if result.same_run_as:
                tags["specexp.same_run_as"] = result.same_run_as
            for case, cr in result.cases.items():
                if cr.verdict is not None:
                    tags[f"specexp.verdict.{case}"] = cr.verdict.verdict
            for key, value in tags.items():
                client.set_tag(run_id, key, value)
            for name in VARIANT_FILES:
                if (folder / name).exists():
                    client.log_artifact(run_id, str(folder / name))
            for log in sorted(folder.glob("*.log")):
                client.log_artifact(run_id, str(log), artifact_path="logs")
        except BaseException:
            client.set_terminated(run_id, status="FAILED")
            raise
        client.set_terminated(run_id, status=_STATUS[result.status])
        assert self.sweep is not None
        if variant.hash not in self.sweep.tracking.synced:
            self.sweep.tracking.synced.append(variant.hash)

    def end_sweep(self, sweep: SweepResult, folder: Path) -> None:
        parent = sweep.tracking.parent_run_id
        if parent is None:
            return
        client = self.client
        from mlflow.entities import Metric

        failed = sum(1 for r in sweep.variants if r.status != "ok")
        metrics = {"failed_variants": float(failed)}
        if sweep.wall_s is not None:
            metrics["wall_s"] = sweep.wall_s
        ts = _now_ms()
        client.log_batch(parent, metrics=[Metric(k, v, ts, 0) for k, v in metrics.items()])
        for name in ("sweep.json", "compare.md", "tune.md"):
            if (folder / name).exists():
                client.log_artifact(parent, str(folder / name))
        plots = folder / "plots"
        if plots.is_dir():
            client.log_artifacts(parent, str(plots), artifact_path="plots")
        client.set_terminated(parent, status=_SWEEP_STATUS[sweep.status])

    # -- beyond the Recorder protocol (a tune study's parent run and predictions) ---------
    def tag_parent(self, key: str, value: str) -> None:
        if self.sweep is not None and self.sweep.tracking.parent_run_id:
            self.client.set_tag(self.sweep.tracking.parent_run_id, key, value[:5000])

    def log_metrics(self, variant: Variant, metrics: dict[str, float]) -> None:
        """Extra figures on a variant's run (a prediction beside what was measured)."""
        run_id = self._run_of(variant.hash)
        if run_id is None or not metrics:
            return
        from mlflow.entities import Metric

        ts = _now_ms()
        self.client.log_batch(run_id, metrics=[Metric(k, float(v), ts, 0) for k, v in metrics.items()])

    def log_run(
        self,
        run_name: str,
        tags: dict[str, str],
        params: dict[str, Any],
        metrics: list[tuple[str, float, int]],
        artifacts: list[Path],
        ok: bool,
    ) -> str:
        """A run of its own (not part of a sweep), e.g. ``restarts``: ``metrics`` are
        (key, value, step); closed FINISHED or FAILED once everything is logged."""
        from mlflow.entities import Metric

        client = self.client
        run_id: str = client.create_run(self._experiment(), run_name=run_name, tags=tags).info.run_id
        try:
            self._log_params(run_id, params)
            ts = _now_ms()
            batch = [Metric(k, float(v), ts, step) for k, v, step in metrics]
            for i in range(0, len(batch), 900):
                client.log_batch(run_id, metrics=batch[i : i + 900])
            for path in artifacts:
                client.log_artifact(run_id, str(path))
        except BaseException:
            client.set_terminated(run_id, status="FAILED")
            raise
        client.set_terminated(run_id, status="FINISHED" if ok else "FAILED")
        return run_id

    # -- helpers -------------------------------------------------------------------------
    def _experiment(self) -> str:
        _ = self.client
        assert self.experiment_id is not None
        return self.experiment_id

    def _run_of(self, variant_hash: str) -> str | None:
        return self.sweep.tracking.runs.get(variant_hash) if self.sweep is not None else None

    def _log_params(self, run_id: str, params: dict[str, Any]) -> None:
        from mlflow.entities import Param

        items = [Param(k[:250], _param_value(v)) for k, v in sorted(params.items())]
        for i in range(0, len(items), 90):
            self.client.log_batch(run_id, params=items[i : i + 90])
