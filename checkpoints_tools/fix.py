"""Append the missing ignore patterns to every applicable list, with a backup; roll back.

Never replaces a list: patterns already there stay, only missing ones are appended, so a
second run changes nothing. Each changed file is backed up first (``<file>.bak-<time>``,
a byte-for-byte copy) and rewritten atomically; the backups of the last fix are listed in
``.checkpoints_tools-backup.json`` so ``rollback`` restores exactly those bytes.
"""

from __future__ import annotations

import copy
import difflib
import json
import shutil
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from checkpoints_tools import quant_config
from checkpoints_tools.files import atomic_write
from checkpoints_tools.scan import ScanReport

MANIFEST = ".checkpoints_tools-backup.json"


@dataclass
class FixResult:
    changed: dict[str, str]  # file -> backup file
    diff: str


def _indent_of(text: str) -> int | None:
    for line in text.splitlines()[1:]:
        stripped = line.lstrip(" ")
        if stripped and len(stripped) < len(line):
            return len(line) - len(stripped)
        if stripped:
            return None
    return 2


def _dump(doc: dict[str, Any], like: str) -> str:
    text = json.dumps(doc, indent=_indent_of(like), ensure_ascii=False)
    return text + ("\n" if like.endswith("\n") else "")


def _append(doc: dict[str, Any], path: tuple[str, ...], patterns: list[str]) -> bool:
    node = doc
    for key in path[:-1]:
        node = node[key]
    current = node.get(path[-1]) or []
    missing = [p for p in patterns if p not in current]
    if missing:
        node[path[-1]] = [*current, *missing]
    return bool(missing)


def planned_documents(model_dir: Path, report: ScanReport) -> dict[str, tuple[str, dict[str, Any]]]:
    """file -> (old text, new document) for every file whose lists gain patterns."""
    qc = quant_config.load(model_dir)
    out: dict[str, tuple[str, dict[str, Any]]] = {}
    for lst in qc.lists:
        old_text, doc = out.get(lst.file, (None, None))
        if doc is None:
            old_text = (model_dir / lst.file).read_text(encoding="utf-8")
            doc = json.loads(old_text)
        assert old_text is not None
        if _append(doc, lst.path, report.fix_patterns) or lst.file in out:
            out[lst.file] = (old_text, doc)
    return out


def apply_fix(model_dir: Path, report: ScanReport) -> FixResult:
    docs = planned_documents(model_dir, report)
    if not docs:
        return FixResult({}, "")
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    diff_parts: list[str] = []
    changed: dict[str, str] = {}
    new_texts = {f: _dump(doc, old) for f, (old, doc) in docs.items()}
    # back everything up before the first write, so a failure leaves originals recoverable
    for file in docs:
        src = model_dir / file
        backup = src.with_name(f"{file}.bak-{stamp}")
        n = 1
        while backup.exists():
            backup = src.with_name(f"{file}.bak-{stamp}.{n}")
            n += 1
        shutil.copy2(src, backup)
        changed[file] = backup.name
    atomic_write(model_dir / MANIFEST, json.dumps({"created": stamp, "backups": changed}, indent=2) + "\n")
    for file, (old, _) in docs.items():
        atomic_write(model_dir / file, new_texts[file])
        diff_parts += difflib.unified_diff(
            old.splitlines(keepends=True),
            new_texts[file].splitlines(keepends=True),
            fromfile=f"a/{file}",
            tofile=f"b/{file}",
        )
    return FixResult(changed, "".join(diff_parts))


def rollback(model_dir: Path) -> dict[str, str]:
    """Restore the files of the last fix from their backups, byte for byte."""
    manifest = model_dir / MANIFEST
    if not manifest.exists():
        raise FileNotFoundError(f"{model_dir}: no fix to roll back ({MANIFEST} not found)")
    backups: dict[str, str] = json.loads(manifest.read_text())["backups"]
    for backup in backups.values():
        if not (model_dir / backup).exists():
            raise FileNotFoundError(f"{model_dir / backup}: backup missing, nothing restored")
    for file, backup in backups.items():
        atomic_write(model_dir / file, (model_dir / backup).read_bytes())
    manifest.unlink()
    return backups


def hf_overrides(model_dir: Path, report: ScanReport) -> dict[str, Any]:
    """The ``--hf-overrides`` JSON that applies the fix without touching files.

    A dict-valued override replaces the whole attribute in vLLM, so the whole
    quantization config is emitted, with the patterns appended.
    """
    cfg = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    out: dict[str, Any] = {}
    qc = quant_config.load(model_dir)
    for lst in qc.lists:
        if lst.file != "config.json":
            continue
        node = cfg
        for key in lst.path[:-2]:
            node = node[key]
        section = copy.deepcopy(node[lst.path[-2]])
        _append({"q": section}, ("q", lst.path[-1]), report.fix_patterns)
        target = out
        for key in lst.path[:-2]:
            target = target.setdefault(key, {})
        target[lst.path[-2]] = section
    return out
