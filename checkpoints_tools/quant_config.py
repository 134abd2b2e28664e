"""Where a checkpoint declares its quantization, and every ignore/exclude list that applies.

vLLM reads ``quantization_config`` from ``config.json`` (top level, or under
``text_config`` for multimodal wrappers) and falls back to the legacy
``hf_quant_config.json``. A fix has to reach every list that exists: seed 003
appended its patterns to both ``quantization_config.ignore`` and
``text_config.quantization_config.ignore``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from checkpoints_tools.header import HeaderError

Format = Literal["modelopt", "compressed-tensors"]


@dataclass(frozen=True)
class IgnoreList:
    file: str  # config file name inside the model folder
    path: tuple[str, ...]  # JSON keys down to the list
    patterns: tuple[str, ...]

    @property
    def where(self) -> str:
        return f"{self.file}:{'.'.join(self.path)}"


@dataclass(frozen=True)
class QuantConfig:
    format: Format | None  # None: no quantization declared
    algo: str | None
    lists: tuple[IgnoreList, ...]
    num_hidden_layers: int | None
    num_mtp_layers: int


def _load_json(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise HeaderError(f"{path.name}: cannot read ({exc})") from None
    if not isinstance(doc, dict):
        raise HeaderError(f"{path.name}: not a JSON object")
    return doc


def _format_of(qc: dict[str, Any]) -> tuple[Format | None, str | None]:
    method = str(qc.get("quant_method", "")).lower()
    if method == "compressed-tensors":
        return "compressed-tensors", str(qc.get("format", ""))
    if method in ("modelopt", "modelopt_fp4") or "quant_algo" in qc:
        return "modelopt", str(qc.get("quant_algo", "")).upper() or None
    return None, method or None


def _list_key(qc: dict[str, Any], fmt: Format) -> str:
    if fmt == "compressed-tensors":
        return "ignore"
    return "ignore" if "ignore" in qc or "exclude_modules" not in qc else "exclude_modules"


def load(model_dir: Path) -> QuantConfig:
    cfg_path = model_dir / "config.json"
    cfg = _load_json(cfg_path) if cfg_path.exists() else {}
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else {}
    assert isinstance(text, dict)
    num_layers = cfg.get("num_hidden_layers", text.get("num_hidden_layers"))
    n_mtp = 0
    for key in ("num_nextn_predict_layers", "mtp_num_hidden_layers"):
        n_mtp = n_mtp or int(cfg.get(key) or text.get(key) or 0)

    lists: list[IgnoreList] = []
    fmt: Format | None = None
    algo: str | None = None
    for prefix, node in ((("quantization_config",), cfg), (("text_config", "quantization_config"), text)):
        qc = node.get("quantization_config")
        if not isinstance(qc, dict):
            continue
        f, a = _format_of(qc)
        if f is None:
            continue
        fmt, algo = fmt or f, algo or a
        key = _list_key(qc, f)
        raw = qc.get(key) or []
        lists.append(IgnoreList("config.json", (*prefix, key), tuple(str(p) for p in raw)))
    legacy = model_dir / "hf_quant_config.json"
    if legacy.exists():
        doc = _load_json(legacy)
        q = doc.get("quantization")
        if isinstance(q, dict):
            if fmt is None:
                fmt, algo = "modelopt", str(q.get("quant_algo", "")).upper() or None
            if fmt == "modelopt":
                raw = q.get("exclude_modules") or []
                lists.append(
                    IgnoreList(
                        "hf_quant_config.json", ("quantization", "exclude_modules"), tuple(map(str, raw))
                    )
                )
    return QuantConfig(
        format=fmt,
        algo=algo,
        lists=tuple(lists),
        num_hidden_layers=int(num_layers) if num_layers is not None else None,
        num_mtp_layers=n_mtp,
    )
