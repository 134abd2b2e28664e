"""SweepPlan: the settings that belong to a whole sweep, resolved once from its variants.

Order, the launch schedule, tracking, the results folder and the baseline policy cannot
differ between the variants of one sweep (one MLflow parent run, one folder, one
schedule). Variants that disagree are refused in one line naming the key, instead of
silently taking the first variant's value. Per-variant settings (trials, cases, ...)
stay on each variant.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from specexp.config.schema import TrackingConfig
from specexp.config.variant import Variant
from specexp.errors import ConfigError
from specexp.paths import workdir

# Dotted keys that must agree across a sweep's variants.
SWEEP_WIDE = (
    "bench.order",
    "bench.freeze_idle",
    "bench.launches",
    "tracking",
    "sweep.results_dir",
    "sweep.name",
    "sweep.baseline",
    "sweep.aa",
    "sweep.validate",
)


def _get(tree: dict[str, Any], dotted: str) -> Any:
    node: Any = tree
    for part in dotted.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


@dataclass(frozen=True)
class SweepPlan:
    variants: tuple[Variant, ...]
    order: str  # sequential | interleaved
    freeze_idle: str  # auto | on | off
    launches: int  # server launches per variant; trials are nested in launches
    tracking: TrackingConfig
    results_dir: Path  # where sweep folders go
    name: str | None
    baseline: bool
    aa: bool
    validate: bool

    @classmethod
    def resolve(cls, variants: list[Variant], name: str | None = None) -> SweepPlan:
        if not variants:
            raise ConfigError("the sweep has no variants")
        first = variants[0]
        for key in SWEEP_WIDE:
            want = _get(first.resolved, key)
            for v in variants[1:]:
                got = _get(v.resolved, key)
                if got != want:
                    raise ConfigError(
                        f"{key} is sweep-wide but differs between variants "
                        f"({first.label}: {want}, {v.label}: {got}); set it once for the sweep"
                    )
        cfg = first.config
        base = Path(cfg.sweep.results_dir)
        return cls(
            variants=tuple(variants),
            order=cfg.bench.order,
            freeze_idle=cfg.bench.freeze_idle,
            launches=cfg.bench.launches,
            tracking=cfg.tracking,
            results_dir=base if base.is_absolute() else workdir() / base,
            name=name or cfg.sweep.name,
            baseline=cfg.sweep.baseline,
            aa=cfg.sweep.aa,
            validate=cfg.sweep.validate,
        )

    def default_name(self) -> str:
        return self.name or f"sweep-{datetime.now(UTC):%Y%m%d-%H%M%S}"

    def signature(self) -> dict[str, Any]:
        """What must be equal for a sweep to be resumed by this plan: the variants (by hash,
        in order) and the schedule. Tracking and the folder may move."""
        return {
            "variants": [f"{v.label}={v.hash}" for v in self.variants],
            "order": self.order,
            "launches": self.launches,
        }
