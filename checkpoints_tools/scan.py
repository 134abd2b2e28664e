"""Compare how a checkpoint's modules are stored with how its quantization config will load them.

Two kinds of mismatch:
- ``unquantized-not-ignored``: stored BF16/F16/F32 but not excluded, so vLLM allocates
  quantized parameters and loading fails (seed 003: the BF16 MTP layer 45 of an NVFP4
  checkpoint, "256 vs 512");
- ``quantized-but-ignored``: quantized weights inside an excluded module.
The fix for the first kind is computed here: a whole-layer pattern where every linear
module of an MTP layer needs it, exact names otherwise.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from checkpoints_tools import matching, modules, mtp, quant_config
from checkpoints_tools.header import read_checkpoint

UNQUANTIZED = "unquantized-not-ignored"
OVER_IGNORED = "quantized-but-ignored"


@dataclass(frozen=True)
class Problem:
    module: str
    kind: str
    storage: str
    mtp_layer: str | None


@dataclass
class ScanReport:
    model_dir: str
    format: str | None
    algo: str | None
    lists: list[dict[str, Any]]
    tensors: int
    storage_counts: dict[str, int]
    mtp_layers: list[str]
    problems: list[Problem] = field(default_factory=list)
    fix_patterns: list[str] = field(default_factory=list)  # what `fix` appends to each list
    fixed_modules: list[str] = field(default_factory=list)

    @property
    def consistent(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["consistent"] = self.consistent
        return out


def scan(model_dir: Path) -> ScanReport:
    model_dir = Path(model_dir)
    tensors = read_checkpoint(model_dir)
    qc = quant_config.load(model_dir)
    mods = modules.group(tensors)
    counts: dict[str, int] = {}
    for m in mods.values():
        counts[m.storage] = counts.get(m.storage, 0) + 1
    layers = mtp.mtp_prefixes(mods, qc.num_hidden_layers, qc.num_mtp_layers)
    report = ScanReport(
        model_dir=str(model_dir),
        format=qc.format,
        algo=qc.algo,
        lists=[{"where": lst.where, "patterns": list(lst.patterns)} for lst in qc.lists],
        tensors=len(tensors),
        storage_counts=dict(sorted(counts.items())),
        mtp_layers=layers,
    )
    if qc.format is None or not qc.lists:
        return report  # nothing declares quantization: nothing can be mismatched
    fmt = qc.format
    patterns = qc.lists[0].patterns  # the list vLLM reads; the others are kept in step by `fix`
    linear = {n: m for n, m in mods.items() if m.linear}
    is_ignored = matching.ignore_matcher(fmt, patterns)
    for name, m in linear.items():
        ignored = is_ignored(name)
        if not m.quantized and not ignored and not _forced_unquantized(fmt, name):
            report.problems.append(Problem(name, UNQUANTIZED, m.storage, mtp.owner(name, layers)))
        elif m.quantized and ignored:
            report.problems.append(Problem(name, OVER_IGNORED, m.storage, mtp.owner(name, layers)))
    report.problems.sort(key=lambda p: p.module)
    report.fix_patterns, report.fixed_modules = _fix_patterns(fmt, report.problems, linear, layers, patterns)
    return report


def _forced_unquantized(fmt: str, name: str) -> bool:
    # vLLM hard-codes Qwen3-Next/3.5 `mtp.fc` unquantized for modelopt_fp4 (qwen3_next_mtp.py).
    return fmt == "modelopt" and name == "mtp.fc"


def _fix_patterns(
    fmt: quant_config.Format,
    problems: list[Problem],
    linear: dict[str, modules.Module],
    layers: list[str],
    existing: tuple[str, ...],
) -> tuple[list[str], list[str]]:
    todo = [p for p in problems if p.kind == UNQUANTIZED]
    out: list[str] = []
    covered: list[str] = []
    by_layer: dict[str | None, list[Problem]] = {}
    for p in todo:
        by_layer.setdefault(p.mtp_layer, []).append(p)
    for layer, probs in by_layer.items():
        members = [n for n in linear if layer is not None and mtp.owner(n, [layer])]
        whole = layer is not None and all(not linear[n].quantized for n in members)
        if whole:
            assert layer is not None
            out += matching.unit_patterns(fmt, layer, whole_prefix=True)
        else:
            for p in probs:
                out += matching.unit_patterns(fmt, p.module, whole_prefix=False)
        covered += [p.module for p in probs]
    deduped = [p for i, p in enumerate(out) if p not in out[:i] and p not in existing]
    return deduped, covered
