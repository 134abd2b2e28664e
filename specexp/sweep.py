"""Run a sweep: plan → validate → (per variant) launch → measure → record → table.

Every arrow hands on a plain value. Stopping (normally, on a failed variant,
on Ctrl-C or SIGTERM) leaves no server running: each launch is a context
manager, and the MLflow runs are closed with the status they earned.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import signal
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType

import yaml
from omegaconf import OmegaConf
from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TaskID, TextColumn, TimeElapsedColumn

from specexp.assets import embedded
from specexp.config.schema import BenchConfig
from specexp.config.variant import Variant
from specexp.errors import ConfigError, LaunchError, SuiteFailed, ValidationFailed
from specexp.launch.base import Endpoint
from specexp.launch.local import LocalLauncher
from specexp.launch.plan import EMBEDDED_PREFIX, LaunchPlan, build_plan
from specexp.launch.preflight import check_checkpoint
from specexp.launch.validate import ValidationResult, validate_plans
from specexp.measure import workload
from specexp.measure.long_prompt import load_tokenizer
from specexp.measure.runner import VariantBench, measure, undecided
from specexp.measure.stats import attach_verdicts, look_confidence
from specexp.paths import workdir
from specexp.record import vllm_bench
from specexp.record.files import atomic_write_json, atomic_write_text, variant_dir, write_request_records
from specexp.record.mlflow_sink import MlflowSink
from specexp.record.results import CaseResult, SweepResult, VariantResult
from specexp.report.table import describe_check, describe_suite, print_plan, suite_table, summary_table
from specexp.suite.cases import parse_cases
from specexp.suite.runner import judge_against_baseline, run_suite


@dataclass
class SweepOutcome:
    result: SweepResult
    directory: Path
    mlflow_uri: str | None


def _plans(variants: list[Variant], resolve_model: bool) -> list[LaunchPlan]:
    return [build_plan(v, resolve_model=resolve_model) for v in variants]


def dry_run(variants: list[Variant], console: Console, validate: bool = True) -> list[ValidationResult]:
    """Print every variant's exact argv and env, and what vLLM's own checks say about it."""
    check_suites(variants)
    plans = _plans(variants, resolve_model=True)
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
def _sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM (e.g. from a job scheduler) unwinds like Ctrl-C, so servers get stopped."""

    def handler(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def check_suites(variants: list[Variant]) -> None:
    """A bad suite case or an unknown workload is a one-line error before anything starts."""
    for v in variants:
        parse_cases(v.config.suite.cases, v.config.suite.name)
        for case in v.config.bench.cases.values():
            workload.load(case.workload or v.config.bench.workload)


def run_sweep(variants: list[Variant], console: Console, *, name: str | None = None) -> SweepOutcome:
    check_suites(variants)
    for v in variants:
        if v.config.launcher.kind != "local":
            raise ConfigError(
                f"variant {v.label!r}: launcher.kind={v.config.launcher.kind} cannot run yet "
                "(cluster launchers are a later issue); use --dry-run to see its plan"
            )
    # Build the embedded model before validation: the engine-config check needs its files.
    for path in sorted(
        {v.config.model.path for v in variants if v.config.model.path.startswith(EMBEDDED_PREFIX)}
    ):
        model = path[len(EMBEDDED_PREFIX) :]
        if not embedded.is_built(model):
            console.print(f"building embedded model {model} (once) …")
            embedded.build(model)
    plans = _plans(variants, resolve_model=True)
    # The first server starts while vLLM validates the sweep; an interleaved sweep on CPU
    # starts them all (it would start them together right after anyway).
    together = variants[0].config.bench.order == "interleaved" and all(p.device == "cpu" for p in plans)
    n_early = len(plans) if together else 1
    early = [_start_early(v, p) for v, p in zip(variants[:n_early], plans[:n_early], strict=True)]
    try:
        with _sigterm_as_interrupt():
            console.print(f"validating {len(plans)} variant(s) against the installed vLLM …")
            check_or_raise(validate_plans(plans), console)
        return _run_validated(variants, plans, console, name, early)
    finally:
        for e in early:  # a no-op when its variant stopped it; the only stop on bad input
            if e is not None:
                e.launcher.stop()
                e.discard_log()


@dataclass
class _Early:
    """A variant's server, started before validation so the two overlap.

    Validation imports vLLM in its own process (10-20 s); so does the server. Started
    together they cost one wait instead of two. The log goes to a temporary file until the
    variant's folder exists; on bad input the server is stopped and the file removed, so
    nothing is left behind.
    """

    launcher: LocalLauncher
    temp_log: Path

    def discard_log(self) -> None:
        if self.launcher.log_path == self.temp_log:
            self.temp_log.unlink(missing_ok=True)


def _start_early(variant: Variant, plan: LaunchPlan) -> _Early | None:
    if plan.kind != "local" or not check_checkpoint(variant, plan.model_path, allow_fix=False).ok:
        return None  # a failing preflight is reported by the variant's own launch
    fd, name = tempfile.mkstemp(prefix="specexp-server-", suffix=".log")
    os.close(fd)
    launcher = LocalLauncher(
        plan,
        Path(name),
        ready_timeout_s=variant.config.launcher.ready_timeout_s,
        stop_timeout_s=variant.config.launcher.stop_timeout_s,
    )
    try:
        launcher.start()
    except LaunchError:  # the variant's own launch tries again and records the failure
        Path(name).unlink(missing_ok=True)
        return None
    return _Early(launcher, Path(name))


def _run_validated(
    variants: list[Variant],
    plans: list[LaunchPlan],
    console: Console,
    name: str | None,
    early: list[_Early | None],
) -> SweepOutcome:
    first = variants[0].config
    started = datetime.now(UTC)
    sweep_name = name or first.sweep.name or f"sweep-{started:%Y%m%d-%H%M%S}"
    base = Path(first.sweep.results_dir)
    sweep_dir = (base if base.is_absolute() else workdir() / base) / sweep_name
    n = 2
    while sweep_dir.exists() and any(sweep_dir.iterdir()):  # never overwrite an earlier sweep
        sweep_dir = sweep_dir.with_name(f"{sweep_name}-{n}")
        n += 1
    sweep_name = sweep_dir.name
    sweep_dir.mkdir(parents=True, exist_ok=True)
    sweep = SweepResult(name=sweep_name, started_at=started.isoformat())
    sink = MlflowSink(first.tracking) if first.tracking.enabled else None
    if sink:
        sink.start_sweep(
            sweep_name,
            {
                "variants": len(variants),
                "labels": ", ".join(v.label for v in variants),
                "results_dir": str(sweep_dir),
            },
        )
    for v in variants:
        for note in v.notes:
            console.print(f"[yellow]note[/yellow] {v.label}: {note}", highlight=False)
    by_hash: dict[str, VariantResult] = {}
    t0 = time.perf_counter()
    status = "FINISHED"
    try:
        with (
            _sigterm_as_interrupt(),
            Progress(
                SpinnerColumn(),
                TextColumn("{task.description}"),
                TimeElapsedColumn(),
                console=console,
                transient=True,
            ) as progress,
        ):
            overall = progress.add_task("sweep", total=len(variants))
            runs = [
                VariantRun(
                    variant,
                    plan,
                    variant_dir(sweep_dir, i, variant.label, variant.hash),
                    sink,
                    functools.partial(
                        _describe, progress, overall, f"[{i + 1}/{len(variants)}] {variant.label}"
                    ),
                    e.launcher if i < len(early) and (e := early[i]) is not None else None,
                )
                for i, (variant, plan) in enumerate(zip(variants, plans, strict=True))
            ]

            def done(run: VariantRun) -> None:
                by_hash[run.variant.hash] = run.result
                sweep.variants.append(run.result)
                if run.result.cases:
                    vllm_bench.write_variant(
                        sweep_dir / "vllm-bench", run.variant, run.plan.served_model, run.result
                    )
                atomic_write_json(sweep_dir / "sweep.json", sweep)
                progress.advance(overall)
                _report_variant(console, run.result)

            if first.bench.order == "interleaved":
                _run_interleaved(runs, done)
            else:
                for run in runs:
                    try:
                        run.execute(by_hash.get(run.variant.baseline_hash or ""))
                    finally:  # an interrupted variant is in sweep.json too, marked as such
                        done(run)
    except KeyboardInterrupt:
        status = "KILLED"
        console.print("[red]interrupted: servers stopped, partial results kept and marked[/red]")
        raise
    finally:
        sweep.wall_s = round(time.perf_counter() - t0, 3)
        atomic_write_json(sweep_dir / "sweep.json", sweep)
        if sink:
            failed = sum(1 for r in sweep.variants if r.status != "ok")
            if status == "FINISHED" and failed:
                status = "FAILED" if failed == len(sweep.variants) else "FINISHED"
            sink.end_sweep(status, {"wall_s": sweep.wall_s, "failed_variants": float(failed)})
    console.print(summary_table(sweep.variants))
    if any(r.suite is not None for r in sweep.variants):
        console.print(suite_table(sweep.variants))
    console.print(f"sweep wall time {sweep.wall_s:.1f}s · results: {sweep_dir}", highlight=False)
    return SweepOutcome(sweep, sweep_dir, sink.uri if sink else None)


def _describe(progress: Progress, task: TaskID, label: str, msg: str) -> None:
    progress.update(task, description=f"{label}: {msg}")


def _report_variant(console: Console, r: VariantResult) -> None:
    for note in r.notes:
        if note.startswith(("server log:", "degenerate output:")):
            console.print(f"[yellow]warning[/yellow] {r.label}: {note}", highlight=False)
    if r.suite is not None:
        console.print(f"  {r.label}: {describe_suite(r.suite)}", highlight=False)
    if r.status == "ok":
        phases = ", ".join(f"{k.removesuffix('_s')} {v:.1f}s" for k, v in r.startup_phases.items())
        console.print(
            f"[green]✓[/green] {r.label}: ready in {r.ready_s:.1f}s ({phases}); measured in {r.wall_s:.0f}s",
            highlight=False,
        )
    else:
        console.print(f"[red]✗ {r.label}: {r.status}: {r.error}[/red]", highlight=False)


class VariantRun:
    """One variant's life: files and MLflow run, preflight, server, measurement, record.

    ``execute`` does it all for a sequential sweep; an interleaved sweep calls the steps
    itself (``begin`` and ``launch`` for every variant, measuring round-robin, then
    ``finish``). Whatever happens, ``finish`` records the status the run earned.
    """

    def __init__(
        self,
        variant: Variant,
        plan: LaunchPlan,
        vdir: Path,
        sink: MlflowSink | None,
        say: Callable[[str], None],
        started: LocalLauncher | None = None,
    ) -> None:
        self.variant, self.plan, self.vdir, self.sink, self.say = variant, plan, vdir, sink, say
        self.started = started  # this variant's server, already started (during validation)
        self.result = VariantResult(
            label=variant.label,
            variant_hash=variant.hash,
            is_baseline=variant.is_baseline,
            overrides=list(variant.overrides),
            notes=list(variant.notes),
            launch=plan.redacted(),
        )
        self.run_id: str | None = None
        self.baseline: VariantResult | None = None
        self.launcher: LocalLauncher | None = None
        self._t0 = 0.0

    def begin(self) -> None:
        self.vdir.mkdir(parents=True, exist_ok=True)
        atomic_write_text(self.vdir / "config.yaml", yaml.safe_dump(self.variant.resolved, sort_keys=False))
        atomic_write_json(self.vdir / "launch.json", self.plan.redacted())
        self.run_id = self.sink.start_variant(self.variant) if self.sink else None
        self._t0 = time.perf_counter()

    def launch(self, stack: contextlib.ExitStack) -> Endpoint:
        """Preflight, start the server (stopped when ``stack`` closes) and wait until it is ready."""
        self.start_server(stack)
        return self.wait_ready()

    def start_server(self, stack: contextlib.ExitStack) -> None:
        """Preflight and start the server, without waiting for it (stopped when ``stack`` closes)."""
        cfg = self.variant.config
        pre = check_checkpoint(self.variant, self.plan.model_path)
        if pre.ran:
            self.result.notes.append(pre.message)
            if self.sink and self.run_id and pre.fixed_patterns:
                self.sink.client.set_tag(
                    self.run_id, "specexp.checkpoint_autofix", " ".join(pre.fixed_patterns)
                )
            if not pre.ok:
                raise LaunchError(pre.message)
        if self.started is not None:
            self.launcher = self.started
            stack.callback(self.launcher.stop)
            self.launcher.move_log(self.vdir / "server.log")
            self.result.notes.append(
                "server started while vLLM validated the sweep; its ready time overlaps that"
            )
        else:
            self.launcher = stack.enter_context(
                LocalLauncher(
                    self.plan,
                    self.vdir / "server.log",
                    ready_timeout_s=cfg.launcher.ready_timeout_s,
                    stop_timeout_s=cfg.launcher.stop_timeout_s,
                )
            )
        self.say("starting vllm serve")

    def wait_ready(self) -> Endpoint:
        assert self.launcher is not None, "start_server() first"
        endpoint = self.launcher.wait_ready()
        self.result.ready_s = self.launcher.startup.ready_s
        self.result.startup_phases = self.launcher.startup.phases
        for line in self.launcher.substitutions:
            self.result.notes.append(f"server log: {line} (the server ran something else than asked)")
            if self.sink and self.run_id:
                self.sink.client.set_tag(self.run_id, "specexp.substitution", line)
        return endpoint

    def check_suite(self, endpoint: Endpoint, baseline: VariantResult | None) -> None:
        """The functional suite, judged against the baseline's answers; may stop the variant."""
        cfg = self.variant.config.suite
        if not cfg.cases:
            return
        result = asyncio.run(
            run_suite(
                endpoint,
                cfg.name,
                parse_cases(cfg.cases, cfg.name),
                server_args=self.plan.serve_args,
                seed=self.variant.config.bench.seed,
                timeout_s=cfg.timeout_s,
                code_timeout_s=cfg.code_timeout_s,
                progress=self.say,
            )
        )
        if baseline is not None and baseline.suite is not None:
            tokenizer = load_tokenizer(endpoint.tokenizer) if endpoint.tokenizer else None
            judge_against_baseline(result, baseline.suite, tokenizer)
        self.result.suite = result
        if cfg.fail_fast and result.regressions:
            raise SuiteFailed(
                f"suite {cfg.name}: {len(result.regressions)} regression(s) "
                f"({', '.join(result.regressions)}); benchmarks skipped (suite.fail_fast=true)"
            )

    def measured(self, cases: dict[str, CaseResult], baseline: VariantResult | None) -> None:
        bench = self.variant.config.bench
        self.result.cases, self.baseline = cases, baseline
        attach_verdicts(self.result, baseline, look_confidence(bench.trials, bench.max_trials))
        for name, case in cases.items():
            if case.looping_outputs:
                total = sum(len(t.requests) for t in case.trials)
                self.result.notes.append(
                    f"degenerate output: {case.looping_outputs} of {total} outputs of case {name} loop; "
                    "its acceptance and speed figures are inflated"
                )
        failed = sum(c.failed_requests for c in cases.values())
        total = sum(len(t.requests) for c in cases.values() for t in c.trials)
        if total and failed == total:
            self.result.status, self.result.error = "failed", "every measured request failed"

    def fail(self, exc: BaseException) -> None:
        if isinstance(exc, KeyboardInterrupt):
            self.result.status, self.result.error = "interrupted", "interrupted by the user"
        elif isinstance(exc, Exception):
            self.result.status = "failed"
            plain = isinstance(exc, LaunchError | SuiteFailed)
            self.result.error = str(exc) if plain else f"{type(exc).__name__}: {exc}"
        else:  # SystemExit and the like: never leave the run looking good
            self.result.status, self.result.error = "failed", "aborted"

    def finish(self) -> None:
        self.result.wall_s = round(time.perf_counter() - self._t0, 3) if self._t0 else 0.0
        atomic_write_json(self.vdir / "result.json", self.result)
        files = ["config.yaml", "launch.json", "server.log", "result.json"]
        if self.result.suite is not None:
            atomic_write_json(self.vdir / "suite.json", self.result.suite)
            files.append("suite.json")
        if self.result.cases:
            write_request_records(self.vdir / "requests.jsonl", self.result.cases)
            files.append("requests.jsonl")
        if self.sink and self.run_id:
            self.sink.finish_variant(self.run_id, self.result, self.baseline, [self.vdir / f for f in files])

    def execute(self, baseline: VariantResult | None) -> None:
        """Sequential sweep: the whole life in one go; any failure is recorded, Ctrl-C re-raised."""
        self.begin()
        try:
            with contextlib.ExitStack() as stack:
                endpoint = self.launch(stack)
                self.check_suite(endpoint, baseline)
                self.measured(
                    asyncio.run(measure(endpoint, self.variant.config.bench, self.say, baseline)), baseline
                )
                self.say("stopping server")
        except BaseException as exc:
            self.fail(exc)
            if not isinstance(exc, Exception):
                raise
        finally:
            self.finish()


def _run_interleaved(runs: list[VariantRun], done: Callable[[VariantRun], None]) -> None:
    """Every server up at once, then rounds of one trial per variant (baselines first).

    Slow drift of the machine (thermal, background load) then lands on every variant
    alike instead of on whichever ran last. Adaptive trials add rounds while a case of
    any variant has no clear verdict.
    """
    live: list[tuple[VariantRun, Endpoint]] = []
    on_cpu = all(run.plan.device == "cpu" for run in runs)
    try:
        for run in runs:
            run.begin()
        with contextlib.ExitStack() as stack:
            # On CPU all servers start at once (startup is mostly one-core imports); a GPU's
            # memory profiling at startup must not race another server's, so one at a time.
            started = []
            for run in runs:
                try:
                    run.start_server(stack)
                    started.append(run)
                    if not on_cpu:
                        live.append((run, run.wait_ready()))
                except Exception as exc:  # this variant failed to start; the others go on
                    run.fail(exc)
                    if run.launcher is not None:
                        run.launcher.stop()
            for run in started if on_cpu else []:
                try:
                    live.append((run, run.wait_ready()))
                except Exception as exc:
                    run.fail(exc)
                    assert run.launcher is not None
                    run.launcher.stop()
            by_hash = {run.variant.hash: run for run, _ in live}
            live.sort(key=lambda x: not x[0].variant.is_baseline)  # baselines answer the suite first

            def baseline_of(run: VariantRun) -> VariantResult | None:
                base = by_hash.get(run.variant.baseline_hash or "")
                return base.result if base else None

            ready = [run for run, _ in live]
            with _turns(ready, _freezes_idle(ready)) as turn:
                checked = []
                for run, endpoint in live:
                    try:
                        turn(run)
                        run.check_suite(endpoint, baseline_of(run))
                        checked.append((run, endpoint))
                    except Exception as exc:  # fail_fast: this variant stops here, the others go on
                        run.fail(exc)
                live = checked
                try:
                    if live:
                        results = asyncio.run(_measure_round_robin(live, turn))
                        for run, _ in live:
                            run.measured(results[run.variant.hash], baseline_of(run))
                finally:  # all servers wind down together; the stack then waits for each
                    for run in runs:
                        if run.launcher is not None:
                            run.launcher.request_stop()
    except BaseException as exc:
        for run in runs:  # measurement is joint: no variant still "ok" got to finish it
            if run.result.status == "ok":
                run.fail(exc)
        raise
    finally:
        for run in runs:
            run.finish()
            done(run)


def _freezes_idle(runs: list[VariantRun]) -> bool:
    setting = runs[0].variant.config.bench.freeze_idle
    return setting == "on" or (setting == "auto" and all(run.plan.device == "cpu" for run in runs))


@contextlib.contextmanager
def _turns(runs: list[VariantRun], freeze: bool) -> Iterator[Callable[[VariantRun], None]]:
    """``turn(run)`` thaws ``run`` and freezes every other server (when ``freeze``); all
    are thawed on the way out, however it is left."""

    def turn(active: VariantRun) -> None:
        for run in runs:
            if run.launcher is not None and run is not active:
                run.launcher.freeze()
        if active.launcher is not None:
            active.launcher.thaw()

    try:
        yield turn if freeze else (lambda _run: None)
    finally:
        for run in runs:
            if run.launcher is not None:
                run.launcher.thaw()


async def _measure_round_robin(
    live: list[tuple[VariantRun, Endpoint]], turn: Callable[[VariantRun], None]
) -> dict[str, dict[str, CaseResult]]:
    bench = live[0][0].variant.config.bench
    confidence = look_confidence(bench.trials, bench.max_trials)
    async with contextlib.AsyncExitStack() as stack:
        benches = []
        for run, endpoint in live:
            turn(run)  # its warm-up runs alone too
            vb = VariantBench(endpoint, run.variant.config.bench, run.say)
            benches.append((run, await stack.enter_async_context(vb)))
        return await _rounds(benches, turn, bench, confidence)


async def _rounds(
    benches: list[tuple[VariantRun, VariantBench]],
    turn: Callable[[VariantRun], None],
    bench: BenchConfig,
    confidence: float,
) -> dict[str, dict[str, CaseResult]]:
    by_hash = {run.variant.hash: vb for run, vb in benches}
    target = bench.trials
    while True:
        for _ in range(target - min(vb.done for _, vb in benches)):
            for run, vb in benches:
                turn(run)
                await vb.run_trial(target)
        if target >= bench.max_trials:
            break
        pending = False
        for run, vb in benches:
            base = by_hash.get(run.variant.baseline_hash or "")
            if base is not None:
                pending = pending or bool(undecided(vb.results(), base.results(), confidence))
        if not pending:
            break
        target = min(bench.max_trials, target + bench.trials)
    return {run.variant.hash: vb.results() for run, vb in benches}


def resolved_yaml(variant: Variant) -> str:
    return OmegaConf.to_yaml(OmegaConf.create(variant.resolved))
