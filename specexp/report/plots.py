"""Plots people would rather look at than read, as PNG files (matplotlib, Agg backend).

- ``throughput.png``: per case, each variant's main figure with every trial as a point
  and its median and range: one collapsed trial is visible, not averaged away;
- ``acceptance.png``: per case, the per-position acceptance curve of each variant, one
  line per depth (where acceptance falls off is where a deeper draft stops paying);
- ``fairness.png``: for concurrent cases, TTFT of each stream (request index) over the
  trials, per variant: the seed's "one long prompt holds the others back".
"""

from __future__ import annotations

import os
import statistics
from pathlib import Path
from typing import Any

from specexp.measure.stats import primary_metric
from specexp.record.results import VariantResult


def _pyplot() -> Any:
    os.environ.setdefault("MPLBACKEND", "Agg")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, path: Path) -> None:
    """Written whole or not at all: a reader never sees half a PNG."""
    plt = _pyplot()
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        fig.savefig(tmp, dpi=110, format="png")
        tmp.replace(path)
    finally:
        plt.close(fig)
        tmp.unlink(missing_ok=True)


def _cases(results: list[VariantResult]) -> list[str]:
    return list(dict.fromkeys(c for r in results for c in r.cases))


def throughput(results: list[VariantResult], path: Path) -> Path | None:
    cases = _cases(results)
    if not cases:
        return None
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(cases), figsize=(4.2 * len(cases), 4.2), squeeze=False)
    for ax, case in zip(axes[0], cases, strict=True):
        metric = None
        for x, r in enumerate(results):
            cr = r.cases.get(case)
            if cr is None:
                continue
            metric = primary_metric(cr)
            values = [t.metrics[metric] for t in cr.trials if metric in t.metrics and t.error is None]
            if not values:
                continue
            ax.scatter([x] * len(values), values, s=18, alpha=0.7, color="tab:blue", zorder=3)
            ax.vlines(x, min(values), max(values), color="tab:gray", linewidth=1)
            ax.hlines(statistics.median(values), x - 0.25, x + 0.25, color="black", linewidth=2)
        ax.set_xticks(range(len(results)), [r.label for r in results], rotation=30, ha="right", fontsize=8)
        ax.set_title(case)
        ax.set_ylabel(f"{metric or 'tok/s'} (every trial; bar = median)")
        ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    _save(fig, path)
    return path


def acceptance(results: list[VariantResult], path: Path) -> Path | None:
    curves: dict[str, list[tuple[str, list[float]]]] = {}
    for case in _cases(results):
        for r in results:
            cr = r.cases.get(case)
            if cr is None:
                continue
            per = [
                t.acceptance.per_position
                for t in cr.trials
                if t.acceptance is not None and t.acceptance.per_position
            ]
            if per:
                width = max(len(p) for p in per)
                curve = [statistics.median(p[i] for p in per if len(p) > i) for i in range(width)]
                curves.setdefault(case, []).append((r.label, curve))
    if not curves:
        return None
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(curves), figsize=(4.2 * len(curves), 4.0), squeeze=False)
    for ax, (case, lines) in zip(axes[0], curves.items(), strict=True):
        for label, curve in lines:
            ax.plot(range(1, len(curve) + 1), curve, marker="o", label=f"{label} (k={len(curve)})")
        ax.set_title(case)
        ax.set_xticks(range(1, max(len(c) for _, c in lines) + 1))
        ax.set_xlabel("draft position")
        ax.set_ylabel("accepted per draft step (median over trials)")
        ax.set_ylim(0, 1.05)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    _save(fig, path)
    return path


def fairness(results: list[VariantResult], path: Path) -> Path | None:
    panels = []
    for case in _cases(results):
        for r in results:
            cr = r.cases.get(case)
            if cr is None or cr.concurrency < 2:
                continue
            streams: dict[int, list[float]] = {}
            for t in cr.trials:
                for q in t.requests:
                    if q.ok and q.ttft_s is not None:
                        streams.setdefault(q.index, []).append(q.ttft_s * 1000)
            if streams:
                panels.append((f"{case} · {r.label}", streams))
    if not panels:
        return None
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(panels), figsize=(3.6 * len(panels), 3.8), squeeze=False, sharey=True)
    for ax, (title, streams) in zip(axes[0], panels, strict=True):
        order = sorted(streams)
        ax.boxplot([streams[i] for i in order], positions=range(len(order)), widths=0.6)
        ax.set_xticks(range(len(order)), [str(i) for i in order], fontsize=7)
        ax.set_xlabel("stream (request index)")
        ax.set_title(title, fontsize=9)
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].set_ylabel("TTFT ms over trials")
    fig.tight_layout()
    _save(fig, path)
    return path


def write_all(results: list[VariantResult], folder: Path) -> list[Path]:
    """Every plot the results have data for, into ``folder``; returns what was written."""
    folder.mkdir(parents=True, exist_ok=True)
    made = [
        throughput(results, folder / "throughput.png"),
        acceptance(results, folder / "acceptance.png"),
        fairness(results, folder / "fairness.png"),
    ]
    return [p for p in made if p is not None]
