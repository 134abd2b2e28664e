"""``python -m checkpoints_tools scan|fix|rollback MODEL_DIR``.

Exit codes (for scripts and the sweep preflight): 0 consistent (or fixed), 1 mismatch
found (or left), 2 unreadable input.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from checkpoints_tools.fix import apply_fix, hf_overrides, rollback
from checkpoints_tools.header import HeaderError
from checkpoints_tools.scan import UNQUANTIZED, ScanReport, scan


def _print_report(r: ScanReport) -> None:
    print(f"{r.model_dir}: {r.tensors} tensors; quantization: {r.format or 'none'} {r.algo or ''}".rstrip())
    print("  storage: " + ", ".join(f"{k} {v}" for k, v in r.storage_counts.items()))
    print("  MTP layers: " + (", ".join(r.mtp_layers) or "none found"))
    for lst in r.lists:
        print(f"  {lst['where']}: {len(lst['patterns'])} pattern(s)")
    if r.consistent:
        print("  consistent: every module is stored the way the config loads it")
        return
    groups: dict[tuple[str | None, str, str], list[str]] = {}
    for p in r.problems:
        groups.setdefault((p.mtp_layer, p.kind, p.storage), []).append(p.module)
    for (layer, kind, storage), names in groups.items():
        what = "stored unquantized but not ignored" if kind == UNQUANTIZED else "quantized but ignored"
        where = f"MTP layer {layer}: " if layer else ""
        shown = ", ".join(names[:3]) + (f", … ({len(names)} in all)" if len(names) > 3 else "")
        print(f"  MISMATCH {where}{len(names)} module(s) {storage}, {what}: {shown}")
    if r.fix_patterns:
        print("  fix appends: " + json.dumps(r.fix_patterns))
        print(f"  run: python -m checkpoints_tools fix {shlex.quote(r.model_dir)}")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m checkpoints_tools", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("scan", help="report how modules are stored vs how the config loads them")
    s.add_argument("model_dir", type=Path)
    s.add_argument("--json", action="store_true")
    f = sub.add_parser("fix", help="append the missing ignore patterns (backup, atomic, idempotent)")
    f.add_argument("model_dir", type=Path)
    f.add_argument("--emit", choices=["hf-overrides"], help="print the fix instead of writing files")
    rb = sub.add_parser("rollback", help="restore the files of the last fix from their backups")
    rb.add_argument("model_dir", type=Path)
    args = ap.parse_args(argv)
    try:
        if args.cmd == "rollback":
            restored = rollback(args.model_dir)
            for file, backup in restored.items():
                print(f"restored {file} from {backup}")
            return 0
        report = scan(args.model_dir)
        if args.cmd == "scan":
            if args.json:
                print(json.dumps(report.to_json(), indent=2))
            else:
                _print_report(report)
            return 0 if report.consistent else 1
        if args.emit == "hf-overrides":
            print(json.dumps(hf_overrides(args.model_dir, report), separators=(",", ":")))
            return 0 if report.fix_patterns or report.consistent else 1
        result = apply_fix(args.model_dir, report)
        if not result.changed:
            print("nothing to change" + ("" if report.consistent else " by appending; see scan"))
        else:
            sys.stdout.write(result.diff)
            for file, backup in result.changed.items():
                print(f"backed up {file} to {backup}")
        after = scan(args.model_dir)
        if not after.consistent:
            _print_report(after)
        return 0 if after.consistent else 1
    except (HeaderError, FileNotFoundError) as exc:
        print(f"checkpoints_tools: error: {exc}", file=sys.stderr)
        return 2
