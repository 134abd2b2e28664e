from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Results, mlflow.db and mlruns/ go to a temporary folder instead of the repository."""
    monkeypatch.setenv("SPECEXP_WORKDIR", str(tmp_path))
    return tmp_path
