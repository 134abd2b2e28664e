"""The read path: results back from a sweep folder or from MLflow, as VariantResults with
every trial's values (what verdicts, ``compare``, ``--resume`` and ``tune`` need).

A sweep folder is found by name, or the latest one; a variant by its hash across all
sweeps (the same hash always means the same launch and measurement, so a measured
hash need not be launched again); MLflow runs by run id or by sweep name, read from the
``result.json`` artifact each variant run carries.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from specexp.config.schema import TrackingConfig
from specexp.config.variant import Variant
from specexp.errors import ConfigError
from specexp.record.folder import SWEEP_FILE
from specexp.record.results import SweepResult, VariantResult


@dataclass(frozen=True)
class StoredVariant:
    result: VariantResult
    folder: Path | None  # None when read from MLflow
    sweep: str


def _read(path: Path, model: type[SweepResult] | type[VariantResult]) -> SweepResult | VariantResult:
    try:
        return model.model_validate_json(path.read_bytes())
    except (OSError, ValidationError, ValueError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ConfigError(f"cannot read {path}: {first}") from None


def list_sweeps(root: Path) -> list[Path]:
    """Sweep folders under ``root``, oldest first (by their recorded start time)."""
    found = []
    for path in root.glob(f"*/{SWEEP_FILE}"):
        try:
            started = json.loads(path.read_bytes()).get("started_at", "")
        except (OSError, ValueError):
            continue
        found.append((str(started), path.parent.name, path.parent))
    return [folder for _, _, folder in sorted(found)]


def find_sweep(root: Path, name: str | None = None) -> Path:
    """The sweep called ``name`` (a folder name or a path), or the latest one."""
    if name:
        for candidate in (Path(name), root / name):
            if (candidate / SWEEP_FILE).is_file():
                return candidate
        known = ", ".join(p.name for p in list_sweeps(root)[-5:]) or "none"
        raise ConfigError(f"no sweep {name!r} under {root} (latest: {known})")
    sweeps = list_sweeps(root)
    if not sweeps:
        raise ConfigError(f"no sweep under {root} yet (run: python -m specexp sweep ...)")
    return sweeps[-1]


def variant_folders(sweep_folder: Path) -> dict[str, Path]:
    """Variant hash -> its folder (``NN-label-HASH``) in a sweep folder."""
    out = {}
    for result in sorted(sweep_folder.glob("*/result.json")):
        out[result.parent.name.rsplit("-", 1)[-1]] = result.parent
    return out


def load_variant(folder: Path) -> VariantResult:
    result = _read(folder / "result.json", VariantResult)
    assert isinstance(result, VariantResult)
    return result


def load_sweep(folder: Path) -> SweepResult:
    """``sweep.json``, with each variant taken from its own ``result.json`` (the truth: it is
    written before the index, so it is never behind it)."""
    sweep = _read(folder / SWEEP_FILE, SweepResult)
    assert isinstance(sweep, SweepResult)
    folders = variant_folders(folder)
    sweep.variants = [
        load_variant(folders[v.variant_hash]) if v.variant_hash in folders else v for v in sweep.variants
    ]
    return sweep


def find_variant(root: Path, variant_hash: str, *, ok_only: bool = True) -> StoredVariant | None:
    """The latest stored result of ``variant_hash`` in any sweep under ``root``."""
    for sweep in reversed(list_sweeps(root)):
        folder = variant_folders(sweep).get(variant_hash)
        if folder is None:
            continue
        try:
            result = load_variant(folder)
        except ConfigError:
            continue
        if result.status == "ok" or not ok_only:
            return StoredVariant(result, folder, sweep.name)
    return None


def load_runs(tracking: TrackingConfig, run_ids: list[str]) -> list[StoredVariant]:
    """Variant results from MLflow runs (their ``result.json`` artifact)."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    from specexp.record.mlflow_sink import tracking_uri

    client = MlflowClient(tracking_uri(tracking))
    out = []
    for run_id in run_ids:
        try:
            run = client.get_run(run_id)
            with tempfile.TemporaryDirectory(prefix="specexp-run-") as tmp:
                local = Path(client.download_artifacts(run_id, "result.json", tmp))
                result = load_variant(local.parent)
        except MlflowException as exc:
            raise ConfigError(f"MLflow run {run_id}: {str(exc).splitlines()[0]}") from None
        out.append(StoredVariant(result, None, run.data.tags.get("specexp.sweep", "")))
    return out


def runs_of_sweep(tracking: TrackingConfig, sweep_name: str) -> list[str]:
    """The child run ids an MLflow experiment holds for a sweep name (not deleted)."""
    from mlflow.tracking import MlflowClient

    from specexp.record.mlflow_sink import tracking_uri

    client = MlflowClient(tracking_uri(tracking))
    exp = client.get_experiment_by_name(tracking.experiment)
    if exp is None:
        return []
    runs = client.search_runs(
        [exp.experiment_id],
        filter_string=f"tags.`specexp.sweep` = '{sweep_name}' and tags.`specexp.kind` = 'variant'",
        order_by=["attributes.start_time ASC"],
    )
    return [r.info.run_id for r in runs]


def stored_config(folder: Path, result: VariantResult) -> Variant:
    """The Variant a stored result was measured with, rebuilt from its ``config.yaml``."""
    import yaml
    from omegaconf import OmegaConf

    from specexp.config.schema import Config

    try:
        resolved = yaml.safe_load((folder / "config.yaml").read_text()) or {}
        config = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(Config), resolved))
    except (OSError, yaml.YAMLError, ValueError) as exc:
        raise ConfigError(f"cannot read {folder / 'config.yaml'}: {exc}") from None
    assert isinstance(config, Config)
    return Variant(
        config=config,
        resolved=resolved,
        overrides=tuple(result.overrides),
        label=result.label,
        is_baseline=result.is_baseline,
        baseline_hash=result.baseline_hash,
    )
