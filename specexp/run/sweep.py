"""Run a sweep: plan → validate → schedule the variants → record → table.

Every arrow hands on a plain value. Stopping (normally, on a failed variant, on Ctrl-C
or SIGTERM) leaves no server running: each launch is a context manager, and the
tracking runs are closed with the status they earned. A sweep can be resumed: variants
whose hash already has an ok result in the sweep's folder are reused, the others run
again, in the same folder and the same MLflow parent run.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any

from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TaskID, TextColumn, TimeElapsedColumn

from specexp.assets import embedded
from specexp.config.sweep_plan import SweepPlan
from specexp.config.variant import Variant
from specexp.errors import ConfigError, LaunchError, ValidationFailed
from specexp.launch.base import Launcher, create_launcher, launcher_class, target_device
from specexp.launch.plan import EMBEDDED_PREFIX, LaunchPlan, build_plan
from specexp.launch.preflight import check_checkpoint
from specexp.launch.validate import ValidationResult, validate_plans
from specexp.measure.traffic import check_bench
from specexp.record.files import variant_dir
from specexp.record.folder import FolderRecorder
from specexp.record.recorder import Recorder, RecorderSet
from specexp.record.results import SweepResult, VariantResult
from specexp.record.store import find_sweep, list_sweeps, load_sweep, variant_folders
from specexp.report.table import describe_check, describe_suite, print_plan, suite_table, summary_table
from specexp.run import schedule
from specexp.run.variant import VariantSession
from specexp.suite.cases import parse_cases


@dataclass
class SweepOutcome:
    result: SweepResult
    directory: Path
    mlflow_uri: str | None


# -- before anything starts ---------------------------------------------------------------
def check_inputs(variants: list[Variant]) -> None:
    """A bad suite case, an unknown workload or a bad record in a workload file is a one-line
    error before anything starts."""
    for v in variants:
        parse_cases(v.config.suite.cases, v.config.suite.name)
        check_bench(v.config.bench)


def launch_plans(
    variants: list[Variant], *, resolve_model: bool = True, connect: bool = True
) -> list[LaunchPlan]:
    """Each variant's plan, for the device of the node that serves it (asked once per
    distinct launcher setting; a dry run never connects anywhere)."""
    devices: dict[str, str | None] = {}
    plans = []
    for v in variants:
        key = json.dumps(v.resolved.get("launcher"), sort_keys=True, default=str)
        if key not in devices:
            devices[key] = target_device(v.config.launcher, connect=connect)
        plans.append(build_plan(v, device=devices[key], resolve_model=resolve_model))
    return plans


def dry_run(variants: list[Variant], console: Console, validate: bool = True) -> list[ValidationResult]:
    """Print every variant's exact argv and env, and what vLLM's own checks say about it."""
    check_inputs(variants)
    plans = launch_plans(variants, connect=False)
    checks: list[ValidationResult | None] = list(validate_plans(plans)) if validate else [None] * len(plans)
    console.print(f"{len(plans)} variant(s)", highlight=False)
    for i, (variant, plan, check) in enumerate(zip(variants, plans, checks, strict=True)):
        print_plan(console, i, plan, check)
        pre = check_checkpoint(variant, plan.model_path, allow_fix=False)
        if pre.ran:
            console.print(f"    {pre.message}", highlight=False, soft_wrap=True)
    return [c for c in checks if c is not None]


def check_or_raise(checks: list[ValidationResult], console: Console | None = None) -> None:
    """Raise on the first local validation error; print warnings and skips when given a console."""
    for check in checks:
        if console is not None and (check.skipped or (not check.ok and check.remote)):
            console.print(f"[yellow]{check.label}: {describe_check(check)}[/yellow]", highlight=False)
    bad = [c for c in checks if not c.ok and not c.remote and not c.skipped]
    if bad:
        raise ValidationFailed(
            f"variant {bad[0].label!r} rejected by vLLM: {bad[0].error}"
            + (f" (and {len(bad) - 1} more)" if len(bad) > 1 else "")
        )


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM (e.g. from a job scheduler) unwinds like Ctrl-C, so servers get stopped."""

    def handler(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _build_models(variants: list[Variant], console: Console) -> None:
    """The embedded model is built before validation: the engine-config check needs its files."""
    for path in sorted(
        {v.config.model.path for v in variants if v.config.model.path.startswith(EMBEDDED_PREFIX)}
    ):
        model = path[len(EMBEDDED_PREFIX) :]
        if not embedded.is_built(model):
            console.print(f"building embedded model {model} (once) …")
            embedded.build(model)


MIN_FREE_BYTES = 50 * 2**20  # a sweep writes logs and every request: refuse to start on less


def check_writable(folder: Path) -> None:
    """The results must be keepable before anything is measured: the folder (or its nearest
    existing parent) takes a file, and has room. Nothing is left behind by the check."""
    probe = folder
    while not probe.exists():
        probe = probe.parent
    try:
        fd, name = tempfile.mkstemp(dir=probe, prefix=".specexp-probe-")
        os.close(fd)
        Path(name).unlink()
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise ConfigError(f"results folder {folder}: cannot write in {probe} ({reason})") from None
    free = shutil.disk_usage(probe).free
    if free < MIN_FREE_BYTES:
        raise ConfigError(f"results folder {folder}: only {free // 1024} KiB free in {probe}; need 50 MiB")


# -- resume ---------------------------------------------------------------------------------
@dataclass
class _Resumed:
    folder: Path
    sweep: SweepResult
    reused: dict[str, VariantResult]  # hash -> ok result kept as it is


def _describe_difference(want: dict[str, Any], got: dict[str, Any]) -> str:
    for key in ("variants", "order", "launches"):
        if want.get(key) != got.get(key):
            if key == "variants":
                a, b = set(map(str, got.get(key) or [])), set(map(str, want.get(key) or []))
                gone, new = sorted(a - b), sorted(b - a)
                parts = ([f"not in this plan: {', '.join(gone)}"] if gone else []) + (
                    [f"new here: {', '.join(new)}"] if new else []
                )
                return "variants differ (" + ("; ".join(parts) or "order differs") + ")"
            return f"{key} differs (resumed: {got.get(key)}, this plan: {want.get(key)})"
    return "the plans differ"


def _find_resumable(plan: SweepPlan, name: str | None) -> _Resumed:
    want = plan.signature()
    if name:
        folder = find_sweep(plan.results_dir, name)
        sweep = load_sweep(folder)
        if sweep.plan != want:
            raise ConfigError(
                f"cannot resume {folder.name}: {_describe_difference(want, sweep.plan)}; "
                "resume with the same overrides, or start a new sweep"
            )
    else:
        sweeps = list_sweeps(plan.results_dir)
        matching = [f for f in sweeps if load_sweep(f).plan == want]
        if not matching:
            latest = (
                f"; the latest, {sweeps[-1].name}: {_describe_difference(want, load_sweep(sweeps[-1]).plan)}"
                if sweeps
                else "; run without --resume"
            )
            raise ConfigError(f"no sweep under {plan.results_dir} has this plan to resume{latest}")
        folder = matching[-1]
        sweep = load_sweep(folder)
    folders = variant_folders(folder)
    reused = {v.variant_hash: v for v in sweep.variants if v.status == "ok" and v.variant_hash in folders}
    return _Resumed(folder, sweep, reused)


# -- the sweep --------------------------------------------------------------------------------
@dataclass
class _Early:
    """A variant's server, started before validation so the two overlap.

    Validation imports vLLM in its own process (10-20 s); so does the server. Started
    together they cost one wait instead of two. The log goes to a temporary folder until
    the variant's folder exists; on bad input the server is stopped and the folder
    removed, so nothing is left behind.
    """

    launcher: Launcher
    temp_dir: Path

    def discard(self) -> None:
        self.launcher.stop()
        shutil.rmtree(self.temp_dir, ignore_errors=True)


def _start_early(variant: Variant, plan: LaunchPlan) -> _Early | None:
    if not getattr(launcher_class(plan.kind), "overlaps_validation", False):
        return None
    if not check_checkpoint(variant, plan.model_path, allow_fix=False).ok:
        return None  # a failing preflight is reported by the variant's own launch
    temp_dir = Path(tempfile.mkdtemp(prefix="specexp-early-"))
    try:
        launcher = create_launcher(plan, variant.config.launcher, temp_dir)
        launcher.start()
    except (LaunchError, ConfigError):  # the variant's own launch tries again and records it
        shutil.rmtree(temp_dir, ignore_errors=True)
        return None
    return _Early(launcher, temp_dir)


def _sinks(plan: SweepPlan) -> list[Recorder]:
    if not plan.tracking.enabled:
        return []
    from specexp.record.mlflow_sink import MlflowRecorder

    return [MlflowRecorder(plan.tracking)]


def run_sweep(
    plan: SweepPlan, console: Console, *, resume: bool = False, resume_name: str | None = None
) -> SweepOutcome:
    variants = list(plan.variants)
    check_inputs(variants)
    for kind in sorted({v.config.launcher.kind for v in variants}):
        launcher_class(kind)  # a kind this build cannot run is one line, before anything starts
    resumed = _find_resumable(plan, resume_name) if resume else None
    check_writable(resumed.folder if resumed else plan.results_dir)
    _build_models(variants, console)
    plans = launch_plans(variants)
    todo = [i for i, v in enumerate(variants) if resumed is None or v.hash not in resumed.reused]
    # The first server starts while vLLM validates the sweep; an interleaved sweep on CPU
    # starts them all (it would start them together right after anyway).
    together = plan.order == "interleaved" and all(plans[i].device == "cpu" for i in todo)
    early: dict[int, _Early] = {}
    for i in todo[: len(todo) if together else 1]:
        e = _start_early(variants[i], plans[i])
        if e is not None:
            early[i] = e
    try:
        if plan.validate:
            with sigterm_as_interrupt():
                console.print(f"validating {len(todo)} variant(s) against the installed vLLM …")
                check_or_raise(validate_plans([plans[i] for i in todo]), console)
        return _run_validated(plan, plans, console, early, resumed)
    finally:
        for e in early.values():  # stopping is a no-op where its variant already stopped it
            e.discard()


def _open_sweep(plan: SweepPlan, resumed: _Resumed | None) -> tuple[SweepResult, Path]:
    if resumed is not None:
        sweep = resumed.sweep
        sweep.status, sweep.reused = "running", sorted(resumed.reused)
        sweep.variants = [v for v in sweep.variants if v.variant_hash in resumed.reused]
        return sweep, resumed.folder
    name = plan.default_name()
    folder = plan.results_dir / name
    n = 2
    while folder.exists() and any(folder.iterdir()):  # never overwrite an earlier sweep
        folder = folder.with_name(f"{name}-{n}")
        n += 1
    sweep = SweepResult(name=folder.name, started_at=datetime.now(UTC).isoformat(), plan=plan.signature())
    return sweep, folder


def _run_validated(
    plan: SweepPlan,
    plans: list[LaunchPlan],
    console: Console,
    early: dict[int, _Early],
    resumed: _Resumed | None,
) -> SweepOutcome:
    variants = list(plan.variants)
    sweep, folder = _open_sweep(plan, resumed)
    warn = functools.partial(_warn, console)
    recorder = RecorderSet(FolderRecorder(), _sinks(plan), warn)
    recorder.start_sweep(sweep, plan, folder)
    for lp in plans:
        for note in lp.notes:
            console.print(f"[yellow]note[/yellow] {lp.label}: {note}", highlight=False)
    for r in sweep.variants:
        console.print(
            f"[cyan]reused[/cyan] {r.label}: measured in an earlier attempt of {sweep.name}", highlight=False
        )
    t0 = time.perf_counter()
    finished: list[VariantResult] = list(sweep.variants)
    try:
        with (
            sigterm_as_interrupt(),
            Progress(
                SpinnerColumn(),
                TextColumn("{task.description}"),
                TimeElapsedColumn(),
                console=console,
                transient=True,
            ) as progress,
        ):
            overall = progress.add_task("sweep", total=len(variants))
            progress.advance(overall, len(sweep.variants))
            sessions = []
            for i, (variant, lp) in enumerate(zip(variants, plans, strict=True)):
                if resumed is not None and variant.hash in resumed.reused:
                    continue
                vdir = variant_dir(folder, i, variant.label, variant.hash)
                if vdir.exists():  # an earlier attempt that did not finish: measured anew
                    shutil.rmtree(vdir)
                say = functools.partial(
                    _describe, progress, overall, f"[{i + 1}/{len(variants)}] {variant.label}"
                )
                started = early[i].launcher if i in early else None
                session = VariantSession(variant, lp, vdir, recorder, say, started=started)
                session.peers = finished
                sessions.append(session)
            reused = {r.variant_hash: r for r in sweep.variants}

            def done(session: VariantSession) -> None:
                finished.append(session.result)
                sweep.variants = sorted(
                    [r for r in sweep.variants if r.variant_hash != session.variant.hash] + [session.result],
                    key=lambda r: [v.hash for v in variants].index(r.variant_hash),
                )
                progress.advance(overall)
                _report_variant(console, session.result)

            if plan.order == "interleaved":
                freeze = plan.freeze_idle == "on" or (
                    plan.freeze_idle == "auto" and all(s.plan.device == "cpu" for s in sessions)
                )
                schedule.interleaved(sessions, done, freeze=freeze, launches=plan.launches, known=reused)
            else:
                schedule.sequential(sessions, done, launches=plan.launches, known=reused)
        sweep.status = (
            "failed" if sweep.variants and all(r.status != "ok" for r in sweep.variants) else "finished"
        )
    except KeyboardInterrupt:
        sweep.status = "interrupted"
        console.print("[red]interrupted: servers stopped, partial results kept and marked[/red]")
        raise
    except BaseException:
        sweep.status = "failed"
        raise
    finally:
        sweep.wall_s = round(time.perf_counter() - t0, 3)
        _write_report(sweep, folder, warn)
        recorder.end_sweep(sweep, folder)
    console.print(summary_table(sweep.variants))
    if any(r.suite is not None for r in sweep.variants):
        console.print(suite_table(sweep.variants))
    console.print(f"sweep wall time {sweep.wall_s:.1f}s · results: {folder}", highlight=False)
    uri = sweep.tracking.uri if recorder.sinks else None
    return SweepOutcome(sweep, folder, uri)


def _write_report(sweep: SweepResult, folder: Path, warn: Callable[[str], None]) -> None:
    """``compare.md`` and the plots, in the sweep folder (and so in the parent MLflow run)."""
    from specexp.record.files import atomic_write_text
    from specexp.record.store import StoredVariant
    from specexp.report import compare, plots

    stored = [StoredVariant(r, None, sweep.name) for r in sweep.variants]
    try:
        rows, _ = compare.compare_rows(stored)
        atomic_write_text(folder / "compare.md", compare.markdown(rows, f"sweep {sweep.name}"))
        plots.write_all(sweep.variants, folder / "plots")
    except (OSError, ValueError) as exc:  # the results themselves are already on disk
        warn(f"could not write the comparison or plots: {exc}")


def _warn(console: Console, message: str) -> None:
    console.print(f"[yellow]warning[/yellow] {message}", highlight=False, soft_wrap=True)


def _describe(progress: Progress, task: TaskID, label: str, msg: str) -> None:
    progress.update(task, description=f"{label}: {msg}")


def _report_variant(console: Console, r: VariantResult) -> None:
    for note in r.notes:
        if note.startswith(("server log:", "degenerate output:", "its server ran")):
            console.print(f"[yellow]warning[/yellow] {r.label}: {note}", highlight=False)
    if r.suite is not None:
        console.print(f"  {r.label}: {describe_suite(r.suite)}", highlight=False)
    if r.status == "ok":
        phases = ", ".join(f"{k.removesuffix('_s')} {v:.1f}s" for k, v in r.startup_phases.items())
        ready = f"{r.ready_s:.1f}s" if r.ready_s is not None else "–"
        console.print(
            f"[green]✓[/green] {r.label}: ready in {ready} ({phases}); measured in {r.wall_s or 0:.0f}s",
            highlight=False,
        )
    else:
        console.print(f"[red]✗ {r.label}: {r.status}: {r.error}[/red]", highlight=False)
