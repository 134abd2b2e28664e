"""``python -m specexp sync``: log to MLflow what a sweep measured while the store was away.

The sweep folder is the truth; ``sweep.json`` remembers which variants reached the store
(``tracking.synced``) and under which runs. Syncing logs the others, replacing any run an
interrupted attempt left half-logged, so no variant is ever logged twice.
"""

from __future__ import annotations

from pathlib import Path

from specexp.config.schema import TrackingConfig
from specexp.config.sweep_plan import SweepPlan
from specexp.record.files import atomic_write_json
from specexp.record.folder import SWEEP_FILE
from specexp.record.mlflow_sink import MlflowRecorder
from specexp.record.store import load_sweep, stored_config, variant_folders


def sync(folder: Path, tracking: TrackingConfig) -> list[str]:
    """Log every variant of the sweep in ``folder`` that the store lacks; returns their labels."""
    sweep = load_sweep(folder)
    folders = variant_folders(folder)
    variants = [
        stored_config(folders[r.variant_hash], r) for r in sweep.variants if r.variant_hash in folders
    ]
    recorder = MlflowRecorder(tracking)
    if sweep.tracking.uri != recorder.uri:  # another store: everything goes there
        sweep.tracking.synced = []
    missing = [v for v in variants if v.hash not in sweep.tracking.synced]
    if not variants or (not missing and sweep.tracking.parent_run_id and sweep.tracking.uri == recorder.uri):
        return []
    final_status = sweep.status
    recorder.start_sweep(sweep, SweepPlan.resolve(variants, sweep.name), folder)
    by_hash = {r.variant_hash: r for r in sweep.variants}
    for variant in missing:
        result = by_hash[variant.hash]
        recorder.start_variant(variant, result, folders[variant.hash])
        baseline = by_hash.get(variant.baseline_hash or "")
        recorder.finish_variant(variant, result, baseline, folders[variant.hash])
    sweep.status = final_status
    sweep.tracking.error = None
    recorder.end_sweep(sweep, folder)
    atomic_write_json(folder / SWEEP_FILE, sweep)
    return [v.label for v in missing]
