"""Variant: one fully resolved configuration of a sweep, and nothing downstream reads Hydra."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from specexp.config.schema import Config

# Keys that do not change what is launched or measured; they stay out of the hash.
_UNHASHED = ("tracking", "sweep")


@dataclass(frozen=True)
class Variant:
    """A resolved config plus where it came from.

    ``hash`` identifies the launch and measurement: the same hash always means
    the same ``vllm serve`` and the same workload (resume, caching and Optuna
    de-duplication rely on it).
    """

    config: Config
    resolved: dict[str, Any]
    overrides: tuple[str, ...]
    label: str
    is_baseline: bool = False
    notes: tuple[str, ...] = field(default=())
    baseline_hash: str | None = None  # the no-speculation variant this one is read against
    # >0: a repeat of an identical configuration (an A/A check): measured as its own variant
    replica: int = 0

    @property
    def hash(self) -> str:
        return config_hash(self.resolved, self.replica)


def config_hash(resolved: dict[str, Any], replica: int = 0) -> str:
    payload: dict[str, Any] = {k: v for k, v in resolved.items() if k not in _UNHASHED}
    if replica:
        payload["replica"] = replica
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` → ``{"a.b": 1}``; lists and empty dicts stay whole (JSON)."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flatten(value, name + "."))
        elif isinstance(value, list | dict):
            out[name] = json.dumps(value, separators=(",", ":"))
        else:
            out[name] = value
    return out
