"""``restarts``: each launch of one variant timed, failures kept with their reason, the
record written after every launch, no server left behind (fake servers: the phases come
from log lines the fake prints as vLLM does)."""

from __future__ import annotations

import json
from pathlib import Path

import psutil
import pytest
from rich.console import Console

from specexp.config.compose import plan_sweep
from specexp.config.variant import Variant
from specexp.errors import ConfigError
from specexp.run.restarts import run_restarts
from tests.launch.test_local import fake_plan


@pytest.fixture(autouse=True)
def _workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECEXP_WORKDIR", str(tmp_path))


def _variant() -> Variant:
    (variant,) = plan_sweep(["spec=none", "tracking=none"], with_baseline=False)
    return variant


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def test_every_launch_is_timed_and_recorded() -> None:
    before = _children()
    out = Console(record=True, width=200)
    result = run_restarts(2, _variant(), fake_plan("serve"), out)
    assert [r.ok for r in result.restarts] == [True, True]
    assert all(r.ready_s is not None and r.ready_s > 0 for r in result.restarts)
    assert all(r.phases for r in result.restarts)
    for r in result.restarts:  # the launcher's share: before the process, and the health poll after it
        assert r.prepare_s is not None and r.overhead_s is not None
        assert r.overhead_s == round(r.prepare_s + r.phases["server"]["health_s"], 3)
    doc = json.loads((Path(result.folder) / "restarts.json").read_text())
    assert [r["ready_s"] for r in doc["restarts"]] == [r.ready_s for r in result.restarts]
    assert doc["summary"]["ok"] == 2.0
    assert sorted(p.name for p in Path(result.folder).iterdir()) == ["launch-0", "launch-1", "restarts.json"]
    said = out.export_text()
    assert "2/2 launches ready" in said
    overheads = [r.overhead_s for r in result.restarts if r.overhead_s is not None]
    assert doc["summary"]["overhead_s.max"] == max(overheads)
    assert f"launcher overhead median {sum(overheads) / 2:.2f}s" in said
    assert _children() <= before  # every server stopped


def test_a_launch_that_fails_is_kept_with_its_reason() -> None:
    result = run_restarts(2, _variant(), fake_plan("crash"), Console(width=200))
    assert [r.ok for r in result.restarts] == [False, False]
    assert all("KV cache" in (r.error or "") for r in result.restarts)
    doc = json.loads((Path(result.folder) / "restarts.json").read_text())
    assert doc["summary"] == {"ok": 0.0} and len(doc["restarts"]) == 2


def test_n_below_one_is_refused_before_anything_starts(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="N=0 must be >= 1"):
        run_restarts(0, _variant(), fake_plan("serve"), Console())
    assert not (tmp_path / "results").exists()
