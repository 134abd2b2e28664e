"""Validate LaunchPlans against the installed vLLM before anything starts.

A wrong flag found after a 13-minute restart costs 13 minutes; found here it
costs seconds. vLLM lives in its own virtualenv, so the checks run there
(``vllm_validate.py``), all variants in one process. For plans that run on
other machines, whose vLLM may differ, failures are warnings.

Importing vLLM is most of that cost (about 30 s on a small CPU machine), so answers
are kept under ``$SPECEXP_HOME/validated``, keyed by everything they depend on: the
checker, the vLLM installation (its interpreter and dist-info), ``VLLM_*`` variables,
the argv without the port this run picked, and the model folder's files (name, size,
mtime). A dry run and
the sweep after it, or a sweep started again, import vLLM once.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from checkpoints_tools.files import atomic_write
from specexp.launch.plan import LaunchPlan, vllm_python
from specexp.paths import home

CHECKER = Path(__file__).with_name("vllm_validate.py")


@dataclass(frozen=True)
class ValidationResult:
    label: str
    ok: bool
    error: str | None = None
    checked: tuple[str, ...] = field(default=())
    remote: bool = False  # checked against this machine's vLLM, not the target's
    skipped: str | None = None  # why nothing was checked
    cached: bool = False  # the same check's answer from an earlier run


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


_PORT = re.compile(r"--port=\d+")


def cache_dir() -> Path:
    return home() / "validated"


def _stat_line(path: Path) -> str:
    st = path.stat()
    return f"{path.name}:{st.st_size}:{st.st_mtime_ns}"


def _context(py: Path) -> dict[str, Any]:
    """What every answer of one checker run depends on: the checker, the vLLM the interpreter
    imports (the interpreter and vLLM's dist-info) and the ``VLLM_*`` variables."""
    found = sorted(py.parent.parent.glob("lib/python*/site-packages/vllm-*.dist-info"))
    return {
        "checker": hashlib.sha256(CHECKER.read_bytes()).hexdigest(),
        "vllm": [str(py.resolve()), *(f"{d}:{d.stat().st_mtime_ns}" for d in found)],
        "env": sorted(f"{k}={v}" for k, v in os.environ.items() if k.startswith("VLLM_")),
    }


def _model_files(model_path: str) -> list[str]:
    folder = Path(model_path)
    if not folder.is_dir():
        return [model_path]  # a hub id or a path on another machine: the name is all there is
    return sorted(_stat_line(f) for f in folder.iterdir() if f.is_file())


def _cache_key(context: dict[str, Any], request: dict[str, Any], model_path: str) -> str:
    material = {
        **context,
        "argv": [_PORT.sub("--port=<port>", a) for a in request["argv"]],
        "engine": request["engine"],
        "model": _model_files(model_path) if request["engine"] else [],
    }
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()[:32]


def _cached(key: str) -> dict[str, object] | None:
    try:
        answer = json.loads((cache_dir() / f"{key}.json").read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return answer if isinstance(answer, dict) and "ok" in answer else None


def _remember(key: str, answer: dict[str, object]) -> None:
    try:
        cache_dir().mkdir(parents=True, exist_ok=True)
        atomic_write(cache_dir() / f"{key}.json", json.dumps(answer) + "\n")
    except OSError:
        pass  # a cache that cannot be written costs the next run the import, nothing else


def validate_plans(plans: list[LaunchPlan], timeout_s: float = 180.0) -> list[ValidationResult]:
    py = _python_with_vllm()
    if py is None:
        reason = "no vLLM installed on this machine: validation skipped"
        return [ValidationResult(p.label, True, skipped=reason, remote=p.kind != "local") for p in plans]
    requests: list[dict[str, Any]] = [
        {
            "id": str(i),
            "argv": list(p.serve_args),
            "engine": p.kind == "local" and Path(p.model_path).exists(),
        }
        for i, p in enumerate(plans)
    ]
    context = _context(py)
    keys = {str(r["id"]): _cache_key(context, r, p.model_path) for r, p in zip(requests, plans, strict=True)}
    known = {i: a for i, k in keys.items() if (a := _cached(k)) is not None}
    todo = [r for r in requests if r["id"] not in known]
    answers: dict[str, dict[str, object]] = {}
    if todo:
        fresh = _run_checker(py, todo, timeout_s)
        if isinstance(fresh, str):
            return [ValidationResult(p.label, True, skipped=fresh, remote=p.kind != "local") for p in plans]
        for rid, a in fresh.items():
            if "ok" in a:
                _remember(keys[rid], a)
        answers.update(fresh)
    results = []
    for i, p in enumerate(plans):
        a = known.get(str(i)) or answers.get(str(i), {"ok": False, "error": "no answer", "checked": []})
        checked = a.get("checked", ())
        error = a.get("error")
        results.append(
            ValidationResult(
                label=p.label,
                ok=bool(a["ok"]),
                error=str(error) if error is not None else None,
                checked=tuple(str(c) for c in checked) if isinstance(checked, list | tuple) else (),
                remote=p.kind != "local",
                cached=str(i) in known,
            )
        )
    return results


def _run_checker(
    py: Path, requests: list[dict[str, Any]], timeout_s: float
) -> dict[str, dict[str, object]] | str:
    """The checker's answers by request id, or why it gave none."""
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
        return {str(a["id"]): a for a in json.loads(proc.stdout)}
    except (subprocess.SubprocessError, json.JSONDecodeError, OSError) as exc:
        return f"vLLM validator did not answer ({type(exc).__name__}): validation skipped"
