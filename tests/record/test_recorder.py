from __future__ import annotations

from pathlib import Path

import pytest

from specexp.config.compose import plan_sweep
from specexp.config.sweep_plan import SweepPlan
from specexp.config.variant import Variant
from specexp.record.folder import FolderRecorder
from specexp.record.recorder import RecorderSet
from specexp.record.results import SweepResult, VariantResult


class Broken:
    """A sink whose store does not answer."""

    calls = 0

    def start_sweep(self, sweep: SweepResult, plan: SweepPlan, folder: Path) -> None:
        self.calls += 1
        raise ConnectionError("database is locked")

    def start_variant(self, variant: Variant, result: VariantResult, folder: Path) -> None:
        self.calls += 1

    def launched(self, variant: Variant, result: VariantResult, folder: Path) -> None:
        self.calls += 1

    def tag(self, variant: Variant, key: str, value: str) -> None:
        self.calls += 1

    def finish_variant(
        self, variant: Variant, result: VariantResult, baseline: VariantResult | None, folder: Path
    ) -> None:
        self.calls += 1

    def end_sweep(self, sweep: SweepResult, folder: Path) -> None:
        self.calls += 1


def test_a_failing_sink_is_one_warning_and_the_folder_still_gets_everything(tmp_path: Path) -> None:
    (variant,) = plan_sweep(["spec=none"], with_baseline=False)
    plan = SweepPlan.resolve([variant])
    sweep = SweepResult(name="s", started_at="t", plan=plan.signature())
    warnings: list[str] = []
    broken = Broken()
    recorders = RecorderSet(FolderRecorder(), [broken], warnings.append)
    recorders.start_sweep(sweep, plan, tmp_path)
    result = VariantResult(label="baseline", variant_hash=variant.hash, is_baseline=True, overrides=[])
    recorders.start_variant(variant, result, tmp_path / "v")
    sweep.variants.append(result)
    recorders.finish_variant(variant, result, None, tmp_path / "v")
    recorders.end_sweep(sweep, tmp_path)
    assert len(warnings) == 1 and "database is locked" in warnings[0] and "specexp sync" in warnings[0]
    assert broken.calls == 1  # dropped after its first failure
    assert sweep.tracking.error == "ConnectionError: database is locked"
    assert (tmp_path / "v" / "result.json").exists() and (tmp_path / "v" / "config.yaml").exists()
    assert SweepResult.model_validate_json((tmp_path / "sweep.json").read_text()).tracking.error


def test_a_locked_sqlite_store_is_one_warning_line_and_no_traceback(
    workdir: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    import sqlite3

    from specexp.record.mlflow_sink import MlflowRecorder

    (variant,) = plan_sweep(["spec=none", "tracking.experiment=locked"], with_baseline=False)
    _ = MlflowRecorder(variant.config.tracking).client  # the store exists
    holder = sqlite3.connect(workdir / "mlflow.db", isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")  # another process holds it
    try:
        plan = SweepPlan.resolve([variant])
        sweep = SweepResult(name="s", started_at="t", plan=plan.signature())
        warnings: list[str] = []
        recorders = RecorderSet(FolderRecorder(), [MlflowRecorder(variant.config.tracking)], warnings.append)
        recorders.start_sweep(sweep, plan, workdir / "s")
    finally:
        holder.close()
    assert len(warnings) == 1 and "database is locked" in warnings[0]
    assert not recorders.sinks
    captured = capfd.readouterr()
    assert "Traceback" not in captured.err + captured.out
