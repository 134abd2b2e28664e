"""Checkpoint preflight: before a variant that loads MTP layers from the target checkpoint,
scan the safetensors headers for layers stored unquantized that the quantization config
would still load as quantized (seed 003's "256 vs 512" failure after a 13-minute start).

A mismatch stops that variant with the exact fix command, or, with
``checkpoint.autofix=true``, applies the fix (backup first) and says so.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path

from checkpoints_tools.fix import apply_fix
from checkpoints_tools.header import HeaderError
from checkpoints_tools.scan import scan
from specexp.config.variant import Variant


@dataclass(frozen=True)
class Preflight:
    ran: bool
    ok: bool
    message: str = ""
    fixed_patterns: tuple[str, ...] = field(default=())


def loads_mtp_from_target(variant: Variant) -> bool:
    spec = variant.config.spec
    return (spec.method == "mtp" or spec.method.endswith("_mtp")) and not spec.model


def check_checkpoint(
    variant: Variant, model_path: str, *, allow_fix: bool = True, shown_as: str | None = None
) -> Preflight:
    """``shown_as``: the folder's name in messages when ``model_path`` is a local mirror of
    another machine's checkpoint (the multi-node preflight scans header mirrors)."""
    cfg = variant.config.checkpoint
    folder = Path(model_path)
    if not cfg.preflight or not loads_mtp_from_target(variant) or not folder.is_dir():
        return Preflight(ran=False, ok=True)
    try:
        report = scan(folder)
    except HeaderError as exc:
        return Preflight(ran=True, ok=False, message=f"checkpoint preflight: unreadable checkpoint: {exc}")
    if report.consistent:
        return Preflight(ran=True, ok=True, message="checkpoint preflight: consistent")
    fix_cmd = f"python -m checkpoints_tools fix {shlex.quote(shown_as or str(folder))}"
    n = len(report.problems)
    first = report.problems[0]
    summary = (
        f"{n} module(s) stored as the config would not load them "
        f"(e.g. {first.module}: {first.storage}, {first.kind})"
    )
    if cfg.autofix and allow_fix and report.fix_patterns and len(report.fixed_modules) == n:
        apply_fix(folder, report)
        if scan(folder).consistent:
            return Preflight(
                ran=True,
                ok=True,
                fixed_patterns=tuple(report.fix_patterns),
                message=f"checkpoint preflight: {summary}; autofix appended {report.fix_patterns}",
            )
    return Preflight(ran=True, ok=False, message=f"checkpoint preflight: {summary}; fix with: {fix_cmd}")
