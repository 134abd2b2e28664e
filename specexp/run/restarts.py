"""``python -m specexp restarts N [overrides]``: launch one variant N times and time each start.

Seed 003 signed off its configuration after "three scripted restart tests all succeeded on
the first attempt" at 12.5–13.5 minutes each. Here every launch records its time to ready
and the startup phases of every node (from each node's log), or why it failed; the
results go to ``results/restarts-<label>-<time>/restarts.json`` (with each launch's logs)
and to one MLflow run whose metrics have one step per launch.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console

from specexp.config.variant import Variant
from specexp.errors import ConfigError
from specexp.launch.base import create_launcher, launcher_class
from specexp.launch.plan import LaunchPlan
from specexp.launch.preflight import check_checkpoint
from specexp.paths import workdir
from specexp.record.files import atomic_write_json


@dataclass
class Restart:
    launch: int
    ok: bool
    ready_s: float | None = None
    wall_s: float = 0.0  # the whole launch as this machine saw it, connecting and stopping included
    phases: dict[str, dict[str, float]] = field(default_factory=dict)  # node -> phase -> seconds
    prepare_s: float | None = None  # the launcher's time before the server process started
    overhead_s: float | None = None  # prepare_s + the health poll after vLLM said it was up
    error: str | None = None


@dataclass
class RestartsResult:
    label: str
    variant_hash: str
    folder: str
    restarts: list[Restart]

    def summary(self) -> dict[str, float]:
        ready = [r.ready_s for r in self.restarts if r.ok and r.ready_s is not None]
        if not ready:
            return {"ok": 0.0}
        out = {
            "ok": float(len(ready)),
            "ready_s.median": statistics.median(ready),
            "ready_s.min": min(ready),
            "ready_s.max": max(ready),
        }
        overhead = [r.overhead_s for r in self.restarts if r.ok and r.overhead_s is not None]
        if overhead:
            out["overhead_s.median"] = statistics.median(overhead)
            out["overhead_s.max"] = max(overhead)
        return out


def _metrics(r: Restart) -> dict[str, float]:
    out = {"ok": 1.0 if r.ok else 0.0, "wall_s": r.wall_s}
    if r.ready_s is not None:
        out["ready_s"] = r.ready_s
    if r.prepare_s is not None:
        out["prepare_s"] = r.prepare_s
    if r.overhead_s is not None:
        out["overhead_s"] = r.overhead_s
    for node, phases in r.phases.items():
        out.update({f"{node}.{k}": v for k, v in phases.items()})
    return out


def _log_mlflow(variant: Variant, result: RestartsResult, console: Console) -> None:
    """One run, params from the variant, metrics with one step per launch; a tracking store
    that fails costs a warning, never the measurements (they are in restarts.json)."""
    from specexp.config.variant import flatten
    from specexp.record.mlflow_sink import MlflowRecorder

    metrics = [(k, v, r.launch) for r in result.restarts for k, v in _metrics(r).items()]
    metrics += [(f"summary.{k}", v, 0) for k, v in result.summary().items()]
    try:
        MlflowRecorder(variant.config.tracking).log_run(
            f"restarts {variant.label}",
            {"specexp.kind": "restarts", "specexp.label": variant.label, "specexp.hash": variant.hash},
            flatten(variant.resolved),
            metrics,
            [Path(result.folder) / "restarts.json"],
            ok=all(r.ok for r in result.restarts),
        )
    except Exception as exc:  # a sink never loses the measurements
        console.print(f"[yellow]warning[/yellow] MLflow: {type(exc).__name__}: {exc}", highlight=False)


def _preflight(variant: Variant, plan: LaunchPlan) -> None:
    on_nodes = getattr(launcher_class(plan.kind), "preflight", None)
    pre = on_nodes(variant, plan) if on_nodes is not None else check_checkpoint(variant, plan.model_path)
    if not pre.ok:
        raise ConfigError(pre.message)


def _write(result: RestartsResult) -> None:
    doc: dict[str, Any] = {**asdict(result), "summary": result.summary()}
    atomic_write_json(Path(result.folder) / "restarts.json", doc)


def run_restarts(n: int, variant: Variant, plan: LaunchPlan, console: Console) -> RestartsResult:
    if n < 1:
        raise ConfigError(f"restarts: N={n} must be >= 1")
    _preflight(variant, plan)
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    folder = workdir() / variant.config.sweep.results_dir / f"restarts-{variant.label}-{stamp}"
    folder.mkdir(parents=True, exist_ok=False)
    result = RestartsResult(variant.label, variant.hash, str(folder), [])
    for i in range(n):
        t0 = time.perf_counter()
        launcher = create_launcher(plan, variant.config.launcher, folder / f"launch-{i}")
        restart = Restart(launch=i, ok=False)
        try:
            with launcher:
                launcher.wait_ready()
                timing = launcher.startup
                restart.ok, restart.ready_s = True, timing.ready_s
                restart.phases = dict(timing.nodes) or {"server": dict(timing.phases)}
                restart.prepare_s, restart.overhead_s = timing.prepare_s, timing.overhead_s
        except Exception as exc:
            restart.error = str(exc)
        restart.wall_s = round(time.perf_counter() - t0, 3)
        result.restarts.append(restart)
        _write(result)  # after every launch: a Ctrl-C in launch 3 keeps launches 1 and 2
        if restart.ok:
            slowest = {node: max(p.items(), key=lambda kv: kv[1]) for node, p in restart.phases.items() if p}
            detail = ", ".join(
                f"{node} longest {k.removesuffix('_s')} {v:.1f}s" for node, (k, v) in slowest.items()
            )
            if restart.overhead_s is not None:
                detail += f"; launcher overhead {restart.overhead_s:.2f}s"
            console.print(f"[green]✓[/green] launch {i + 1}/{n}: ready in {restart.ready_s:.1f}s ({detail})")
        else:
            console.print(f"[red]✗ launch {i + 1}/{n}: {restart.error}[/red]", highlight=False)
    if variant.config.tracking.enabled:
        _log_mlflow(variant, result, console)
    s = result.summary()
    if s.get("ok"):
        overhead = ""
        if "overhead_s.median" in s:
            overhead = f"; launcher overhead median {s['overhead_s.median']:.2f}s"
        console.print(
            f"{int(s['ok'])}/{n} launches ready; time to ready median {s['ready_s.median']:.1f}s "
            f"[{s['ready_s.min']:.1f}–{s['ready_s.max']:.1f}]{overhead} · {folder}",
            highlight=False,
        )
    return result
