from __future__ import annotations

import json
from pathlib import Path

from specexp.config.compose import plan_sweep
from specexp.launch.preflight import check_checkpoint
from tests.fixtures.checkpoints import glm_like


def mtp_variant(path: Path, *extra: str):  # type: ignore[no-untyped-def]
    (v,) = plan_sweep([f"model.path={path}", "model.has_mtp=true", "spec=mtp", *extra], with_baseline=False)
    return v


def test_mismatch_stops_the_variant_with_the_fix_command(tmp_path: Path) -> None:
    glm_like(tmp_path)
    before = (tmp_path / "config.json").read_bytes()
    pre = check_checkpoint(mtp_variant(tmp_path), str(tmp_path))
    assert pre.ran and not pre.ok
    assert f"python -m checkpoints_tools fix {tmp_path}" in pre.message
    assert "model.layers.5." in pre.message
    assert (tmp_path / "config.json").read_bytes() == before


def test_autofix_appends_patterns_and_says_so(tmp_path: Path) -> None:
    glm_like(tmp_path)
    pre = check_checkpoint(mtp_variant(tmp_path, "checkpoint.autofix=true"), str(tmp_path))
    assert pre.ok and pre.fixed_patterns == ("model.layers.5.*",)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["quantization_config"]["ignore"][-1] == "model.layers.5.*"
    assert any(p.name.startswith("config.json.bak-") for p in tmp_path.iterdir())


def test_only_methods_that_load_mtp_from_the_target_are_scanned(tmp_path: Path) -> None:
    glm_like(tmp_path)
    (ngram,) = plan_sweep([f"model.path={tmp_path}", "spec=ngram"], with_baseline=False)
    assert not check_checkpoint(ngram, str(tmp_path)).ran
    off = mtp_variant(tmp_path, "checkpoint.preflight=false")
    assert not check_checkpoint(off, str(tmp_path)).ran
