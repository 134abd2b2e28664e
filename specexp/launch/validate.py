"""Validate LaunchPlans against the installed vLLM before anything starts.

A wrong flag found after a 13-minute restart costs 13 minutes; found here it
costs seconds. vLLM lives in its own virtualenv, so the checks run there
(``vllm_validate.py``), all variants in one process. For plans that run on
other machines, whose vLLM may differ, failures are warnings.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from specexp.launch.plan import LaunchPlan, vllm_python

CHECKER = Path(__file__).with_name("vllm_validate.py")


@dataclass(frozen=True)
class ValidationResult:
    label: str
    ok: bool
    error: str | None = None
    checked: tuple[str, ...] = field(default=())
    remote: bool = False  # checked against this machine's vLLM, not the target's
    skipped: str | None = None  # why nothing was checked


def _python_with_vllm() -> Path | None:
    """The managed vLLM venv's python, else the interpreter behind a ``vllm`` on PATH."""
    py = vllm_python()
    if py is not None:
        return py
    script = shutil.which("vllm")
    if script:
        first = Path(script).read_text(errors="replace").splitlines()[:1]
        if first and first[0].startswith("#!"):
            candidate = Path(first[0][2:].strip().split()[0])
            if candidate.exists():
                return candidate
    return None


def validate_plans(plans: list[LaunchPlan], timeout_s: float = 180.0) -> list[ValidationResult]:
    py = _python_with_vllm()
    if py is None:
        reason = "no vLLM installed on this machine: validation skipped"
        return [ValidationResult(p.label, True, skipped=reason, remote=p.kind != "local") for p in plans]
    requests = [
        {
            "id": str(i),
            "argv": list(p.serve_args),
            "engine": p.kind == "local" and Path(p.model_path).exists(),
        }
        for i, p in enumerate(plans)
    ]
    try:
        # vLLM's imports leave caches in the temp folder (torchinductor_<user>): give them
        # one of their own and remove it, so validating leaves nothing behind
        with tempfile.TemporaryDirectory(prefix="specexp-validate-") as tmp:
            proc = subprocess.run(
                [str(py), str(CHECKER)],
                input=json.dumps(requests),
                capture_output=True,
                text=True,
                timeout=timeout_s,
                env={**os.environ, "TMPDIR": tmp},
            )
        answers = {a["id"]: a for a in json.loads(proc.stdout)}
    except (subprocess.SubprocessError, json.JSONDecodeError, OSError) as exc:
        reason = f"vLLM validator did not answer ({type(exc).__name__}): validation skipped"
        return [ValidationResult(p.label, True, skipped=reason, remote=p.kind != "local") for p in plans]
    results = []
    for i, p in enumerate(plans):
        a = answers.get(str(i), {"ok": False, "error": "no answer", "checked": []})
        results.append(
            ValidationResult(
                label=p.label,
                ok=bool(a["ok"]),
                error=a.get("error"),
                checked=tuple(a.get("checked", ())),
                remote=p.kind != "local",
            )
        )
    return results
