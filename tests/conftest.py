from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Results, mlflow.db and mlruns/ go to a temporary folder instead of the repository."""
    monkeypatch.setenv("SPECEXP_WORKDIR", str(tmp_path))
    return tmp_path


GPUSTACK_REAL = "tests/e2e/test_gpustack_real.py"


def _starts_vllm(nodeid: str) -> bool:
    return nodeid.startswith("tests/e2e/") and not nodeid.startswith(GPUSTACK_REAL)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """xdist's ``loadscope`` (a test module stays on one worker, so module fixtures such as
    a network-namespace cluster are made once), with every test that starts real vLLM in
    one scope: those run one after another on one worker, since two vLLM servers starting
    at once on a 2-core machine starve each other. The other worker takes the unit tests
    meanwhile (``-n 2`` in pyproject's addopts), and the real GPUStack servers, which run
    no model and are light beside vLLM."""
    from xdist.scheduler import LoadScopeScheduling

    class RealServersInTurn(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return "e2e" if _starts_vllm(nodeid) else super()._split_scope(nodeid)

    return RealServersInTurn(config, log)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests that start real vLLM first: they are the longest path, so the worker that
    runs them starts on them while the other takes the rest (every worker collects the
    same order)."""
    items.sort(key=lambda item: not _starts_vllm(item.nodeid))
