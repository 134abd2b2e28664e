"""Result files: one folder per sweep, one per variant; every write is atomic.

A reader (or a resumed sweep) never sees half a file: each file is written to
a temporary name in the same folder and renamed into place (``atomic_write_text``, the
checkpoint tools' writer: one implementation for both).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from checkpoints_tools.files import atomic_write as atomic_write_text
from specexp.record.results import CaseResult


def atomic_write_json(path: Path, data: Any) -> None:
    if isinstance(data, BaseModel):
        text = data.model_dump_json(indent=2)
    else:
        text = json.dumps(data, indent=2, sort_keys=False, default=str)
    atomic_write_text(path, text + "\n")


def safe_name(label: str) -> str:
    """A variant label as a file name: anything but letters, digits and ``-_.=`` becomes ``_``."""
    return "".join(c if c.isalnum() or c in "-_.=" else "_" for c in label)


def variant_dir(sweep_dir: Path, index: int, label: str, variant_hash: str) -> Path:
    return sweep_dir / f"{index:02d}-{safe_name(label)[:60]}-{variant_hash}"


def write_request_records(path: Path, cases: dict[str, CaseResult]) -> None:
    """Every measured request as one JSON line (case and trial added): start, TTFT, ITLs,
    tokens, error, text. The per-request truth behind every summary figure."""
    lines = [
        json.dumps({"case": name, "trial": trial.trial, **req.model_dump()}, separators=(",", ":"))
        for name, case in cases.items()
        for trial in case.trials
        for req in trial.requests
    ]
    atomic_write_text(path, "\n".join(lines) + ("\n" if lines else ""))
