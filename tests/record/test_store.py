from __future__ import annotations

from pathlib import Path

import pytest

from specexp.config.compose import plan_sweep
from specexp.config.sweep_plan import SweepPlan
from specexp.errors import ConfigError
from specexp.record import store
from specexp.record.files import variant_dir
from specexp.record.folder import FolderRecorder
from specexp.record.results import SweepResult, VariantResult
from specexp.record.sync import sync
from tests.report.test_compare import BASE, K3


def write_sweep(root: Path, name: str, started: str, results: list[VariantResult]) -> Path:
    """A sweep folder as a sweep writes it (through the folder recorder)."""
    variants = plan_sweep(["spec.depth=3", "tracking.experiment=t"])
    plan = SweepPlan.resolve(variants, name)
    folder = root / name
    sweep = SweepResult(name=name, started_at=started, plan=plan.signature())
    rec = FolderRecorder()
    rec.start_sweep(sweep, plan, folder)
    for i, (variant, result) in enumerate(zip(variants, results, strict=True)):
        result = result.model_copy(update={"variant_hash": variant.hash, "label": variant.label})
        vdir = variant_dir(folder, i, variant.label, variant.hash)
        rec.start_variant(variant, result, vdir)
        sweep.variants.append(result)
        rec.finish_variant(variant, result, None, vdir)
    sweep.status = "finished"
    rec.end_sweep(sweep, folder)
    return folder


def test_sweeps_are_found_by_name_or_as_the_latest_and_read_back_whole(tmp_path: Path) -> None:
    write_sweep(tmp_path, "b-older", "2026-11-29T00:00:00", [BASE, K3])
    newer = write_sweep(tmp_path, "a-newer", "2026-11-30T00:00:00", [BASE, K3])
    assert store.find_sweep(tmp_path) == newer  # by start time, not by name
    assert store.find_sweep(tmp_path, "b-older").name == "b-older"
    with pytest.raises(ConfigError, match=r"^no sweep 'nope' under .* \(latest: b-older, a-newer\)$"):
        store.find_sweep(tmp_path, "nope")
    sweep = store.load_sweep(newer)
    assert [v.label for v in sweep.variants] == ["baseline", "ngram-k3"]
    trials = sweep.variants[1].cases["c4"].trials
    assert [t.metrics["output_tok_s"] for t in trials] == [90, 92, 88, 91, 93]  # every trial's value


def test_a_variant_hash_is_found_in_any_sweep(tmp_path: Path) -> None:
    folder = write_sweep(tmp_path, "s", "2026-11-30T00:00:00", [BASE, K3])
    k3_hash = store.load_sweep(folder).variants[1].variant_hash
    found = store.find_variant(tmp_path, k3_hash)
    assert found is not None and found.sweep == "s" and found.result.label == "ngram-k3"
    assert store.find_variant(tmp_path, "0" * 12) is None


def test_a_corrupt_sweep_file_is_one_line(tmp_path: Path) -> None:
    folder = write_sweep(tmp_path, "s", "2026-11-30T00:00:00", [BASE, K3])
    (folder / "sweep.json").write_text('{"name": ')
    with pytest.raises(ConfigError, match=r"^cannot read .*sweep.json: "):
        store.load_sweep(folder)


def test_sync_logs_what_the_store_missed_once(tmp_path: Path, workdir: Path) -> None:
    from mlflow.tracking import MlflowClient

    folder = write_sweep(tmp_path, "s", "2026-11-30T00:00:00", [BASE, K3])
    (variant,) = plan_sweep(["spec=none", "tracking.experiment=t"], with_baseline=False)
    assert sorted(sync(folder, variant.config.tracking)) == ["baseline", "ngram-k3"]
    assert sync(folder, variant.config.tracking) == []
    client = MlflowClient(f"sqlite:///{workdir / 'mlflow.db'}")
    exp = client.get_experiment_by_name("t")
    assert exp is not None
    runs = client.search_runs([exp.experiment_id])
    assert sorted(r.data.tags.get("specexp.label", "parent") for r in runs) == [
        "baseline",
        "ngram-k3",
        "parent",
    ]
    k3 = next(r for r in runs if r.data.tags.get("specexp.label") == "ngram-k3")
    assert k3.data.metrics["c4.output_tok_s"] == 91.0
    assert store.load_sweep(folder).tracking.synced  # remembered in sweep.json
