"""One variant's life: preflight, launch, functional suite, trials, record.

``run_variant`` does it all in one go (a sequential sweep, a ``tune`` trial);
``VariantSession`` exposes the steps for schedules that interleave variants. Whatever
happens, ``finish`` records the status the variant earned, with the trials it finished:
a server that dies mid-measurement fails its variant with the server's own reason
(exit status or signal, last log line), and the windows measured before stay data.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from pathlib import Path

import aiohttp
import httpx

from specexp.config.variant import Variant
from specexp.errors import LaunchError, SuiteFailed
from specexp.launch.base import (
    EffectiveConfig,
    Endpoint,
    Guarded,
    HostMemoryLow,
    Launcher,
    ReportsProgress,
    create_launcher,
    launcher_class,
)
from specexp.launch.plan import LaunchPlan
from specexp.launch.preflight import check_checkpoint
from specexp.measure.long_prompt import load_tokenizer
from specexp.measure.runner import VariantBench, wants_more
from specexp.measure.stats import attach_verdicts, look_confidence
from specexp.record.recorder import Recorder
from specexp.record.results import CaseResult, TrialRecord, VariantResult
from specexp.suite.cases import parse_cases
from specexp.suite.runner import run_suite

Say = Callable[[str], None]


class ServerGone(LaunchError):
    """The server died or stopped answering while it was being measured."""


DEATH_GRACE_S = 5.0


class VariantSession:
    """The steps of one variant, each recorded on ``result`` as it goes."""

    def __init__(
        self,
        variant: Variant,
        plan: LaunchPlan,
        folder: Path,
        recorder: Recorder,
        say: Say | None = None,
        *,
        started: Launcher | None = None,
    ) -> None:
        self.variant, self.plan, self.folder, self.recorder = variant, plan, folder, recorder
        self.say: Say = say or (lambda _m: None)
        self.started = started  # this variant's server, started early (while vLLM validated)
        self.launcher: Launcher | None = None
        self.endpoint: Endpoint | None = None
        self.baseline: VariantResult | None = None
        self.trials: dict[str, list[TrialRecord]] = {}
        self.bench_cfg = variant.config.bench
        self.result = VariantResult(
            label=variant.label,
            variant_hash=variant.hash,
            is_baseline=variant.is_baseline,
            overrides=list(variant.overrides),
            notes=list(variant.notes),
            launch=plan.redacted(),
            baseline_hash=variant.baseline_hash,
        )
        self.peers: list[VariantResult] = []  # results finished before this one in the sweep
        self._t0 = 0.0
        self._finished = False

    @property
    def ok(self) -> bool:
        return self.result.status == "ok"

    # -- steps ---------------------------------------------------------------------------
    def begin(self) -> None:
        self.recorder.start_variant(self.variant, self.result, self.folder)
        self._t0 = time.perf_counter()

    def start(self, stack: contextlib.ExitStack, launch: int = 0) -> None:
        """Preflight, then start this launch's server (stopped when ``stack`` closes)."""
        if launch == 0:
            self._preflight()
        log_dir = self.folder if launch == 0 else self.folder / f"launch-{launch}"
        if launch == 0 and self.started is not None:
            self.launcher, self.started = self.started, None
            stack.callback(self.launcher.stop)
            self.launcher.move_logs(log_dir)
            self.result.notes.append(
                "server started while vLLM validated the sweep; its ready time overlaps that"
            )
        else:
            launcher = create_launcher(self.plan, self.variant.config.launcher, log_dir)
            if isinstance(launcher, ReportsProgress):
                launcher.on_progress(self.say)
            self.launcher = launcher
            stack.enter_context(launcher)
        self.result.launch = self.launcher.plan.redacted()
        self.recorder.launched(self.variant, self.result, self.folder)
        self.say("starting vllm serve" if launch == 0 else f"starting vllm serve (launch {launch + 1})")

    def _preflight(self) -> None:
        # a launcher whose nodes are other machines checks the checkpoint on each of them
        on_nodes = getattr(launcher_class(self.plan.kind), "preflight", None)
        if on_nodes is not None:
            pre = on_nodes(self.variant, self.plan)
        else:
            pre = check_checkpoint(self.variant, self.plan.model_path)
        if not pre.ran:
            return
        self.result.notes.append(pre.message)
        if pre.fixed_patterns:
            self.recorder.tag(self.variant, "specexp.checkpoint_autofix", " ".join(pre.fixed_patterns))
        if not pre.ok:
            raise LaunchError(pre.message)

    def wait_ready(self) -> Endpoint:
        assert self.launcher is not None, "start() first"
        endpoint = self.launcher.wait_ready()
        timing = self.launcher.startup
        self.result.launch_ready_s.append(timing.ready_s or 0.0)
        if self.result.ready_s is None:
            self.result.ready_s = timing.ready_s
            self.result.startup_phases = dict(timing.phases)
            if len(timing.nodes) > 1:  # every node's phases too, as <node>.<phase>
                for node, phases in timing.nodes.items():
                    self.result.startup_phases.update({f"{node}.{k}": v for k, v in phases.items()})
            if timing.prepare_s is not None:  # before the process started: not in ready_s
                self.result.startup_phases["launcher_prepare_s"] = timing.prepare_s
            self._read_back(endpoint)
        self.endpoint = endpoint
        return endpoint

    def _read_back(self, endpoint: Endpoint) -> None:
        assert self.launcher is not None
        for line in self.launcher.substitutions:
            self.result.notes.append(f"server log: {line} (the server ran something else than asked)")
            self.recorder.tag(self.variant, "specexp.substitution", line)
        self.result.notes.extend(getattr(self.launcher, "notes", []))  # what the launcher had to do
        effective = self.launcher.effective_config(endpoint)
        self.result.effective = {k: v for k, v in effective.values.items() if v is not None}
        self.result.effective_sources = dict(effective.sources)
        self.result.notes.extend(f"read-back: {n}" for n in effective.notes)

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
                seed=self.bench_cfg.seed,
                timeout_s=cfg.timeout_s,
                code_timeout_s=cfg.code_timeout_s,
                progress=self.say,
                # the baseline answers twice (its own noise floor); a variant re-asks its
                # flips and is judged against the baseline's answers
                repeat=self.variant.is_baseline,
                baseline=baseline.suite if baseline is not None else None,
                tokenizer=load_tokenizer(endpoint.tokenizer) if endpoint.tokenizer else None,
            )
        )
        self.result.suite = result
        if cfg.fail_fast and result.regressions:
            raise SuiteFailed(
                f"suite {cfg.name}: {len(result.regressions)} regression(s) "
                f"({', '.join(result.regressions)}); benchmarks skipped (suite.fail_fast=true)"
            )

    def bench(self, endpoint: Endpoint, launch: int) -> VariantBench:
        """This launch's measurement, going on from the trials earlier launches measured."""
        return VariantBench(endpoint, self.bench_cfg, self.say, launch=launch, prior=self.trials)

    def keep(self, vb: VariantBench) -> None:
        """Keep every trial measured so far (also when the launch ends in a failure)."""
        self.trials = {name: list(trials) for name, trials in vb.trials.items()}
        self.measured(vb.results())

    def check_alive(self, vb: VariantBench) -> None:
        """After a trial: a server that died during it makes that trial no data and fails the
        variant with the server's reason, not with the client's connection error."""
        reason = self.launcher.failure() if self.launcher is not None else None
        if reason is None:
            reason = _stalled(vb, self.bench_cfg.request_timeout_s)
        if reason is None:
            return
        for trials in vb.trials.values():
            last = trials[-1] if trials else None
            if last is not None and last.error is None and any(not r.ok for r in last.requests):
                last.error = f"the server died during this trial: {reason}"
        self.keep(vb)
        raise ServerGone(reason)

    def measured(self, cases: dict[str, CaseResult]) -> None:
        bench = self.bench_cfg
        self.result.cases = cases
        attach_verdicts(self.result, self.baseline, look_confidence(bench.trials, bench.max_trials))
        failed = sum(c.failed_requests for c in cases.values())
        total = sum(len(t.requests) for c in cases.values() for t in c.trials)
        if total and failed == total:
            self.result.status, self.result.error = "failed", "every measured request failed"

    def note_loops(self) -> None:
        for name, case in self.result.cases.items():
            if case.looping_outputs:
                total = sum(len(t.requests) for t in case.trials)
                self.result.notes.append(
                    f"degenerate output: {case.looping_outputs} of {total} outputs of case {name} loop; "
                    "its acceptance and speed figures are inflated"
                )

    def fail(self, exc: BaseException) -> None:
        """Record why the variant stopped; the server's own reason wins over the client's."""
        if self.result.status != "ok":
            return
        if isinstance(exc, KeyboardInterrupt):
            self.result.status, self.result.error = "interrupted", "interrupted by the user"
            return
        self.result.status = "failed"
        reason = self._server_reason(exc)
        guard = self.launcher.tripped() if isinstance(self.launcher, Guarded) else None
        if guard is None and isinstance(exc, HostMemoryLow):
            guard = exc
        if guard is not None:  # the memory gate stopped it: said in the run, node and figure
            self.recorder.tag(self.variant, "specexp.memory_gate", guard.figure)
            self.result.error = str(guard)
        elif reason is not None:
            self.result.error = reason
        elif isinstance(exc, httpx.TimeoutException | TimeoutError):
            self.result.error = (
                f"the server stopped answering: {type(exc).__name__} on a request that has "
                f"{self.bench_cfg.request_timeout_s:g} s (bench.request_timeout_s) or 10 s (control calls)"
            )
        elif isinstance(exc, LaunchError | SuiteFailed):
            self.result.error = str(exc)
        elif isinstance(exc, Exception):
            self.result.error = f"{type(exc).__name__}: {exc}"
        else:  # SystemExit and the like: never leave the run looking good
            self.result.error = "aborted"

    def _server_reason(self, exc: BaseException) -> str | None:
        """The launcher's reason, if the server is gone. A dead server's sockets close before
        its exit can be collected, so a connection error can reach the client first: after
        one, the launcher gets up to DEATH_GRACE_S to see the exit."""
        if self.launcher is None:
            return None
        connection = isinstance(exc, httpx.TransportError | aiohttp.ClientError | ConnectionError)
        deadline = time.monotonic() + (DEATH_GRACE_S if connection else 0.0)
        while True:
            reason = self.launcher.failure()
            if reason is not None or time.monotonic() >= deadline:
                return reason
            time.sleep(0.05)

    def finish(self) -> None:
        if self._finished:
            return
        self._finished = True
        self.note_loops()
        mark_same_run(self.result, self.peers)
        self.result.wall_s = round(time.perf_counter() - self._t0, 3) if self._t0 else 0.0
        self.recorder.finish_variant(self.variant, self.result, self.baseline, self.folder)


def mark_same_run(result: VariantResult, earlier: list[VariantResult]) -> None:
    """Variants whose servers reported the same effective configuration ran the same thing
    (e.g. two attention backends that both fell back to CPU_ATTN): said, not hidden."""
    if not result.effective:
        return
    mine = EffectiveConfig(result.effective).fingerprint()
    for other in earlier:
        if other is not result and other.effective and EffectiveConfig(other.effective).fingerprint() == mine:
            result.same_run_as = other.label
            note = f"its server ran the same configuration as {other.label}: the comparison is an A/A"
            if note not in result.notes:
                result.notes.append(note)
            return


def _stalled(vb: VariantBench, timeout_s: float) -> str | None:
    """A trial whose every request timed out: the server is alive but stopped answering."""
    for name, trials in vb.trials.items():
        last = trials[-1] if trials else None
        if last is not None and last.requests and all("Timeout" in (r.error or "") for r in last.requests):
            return (
                f"the server stopped answering: every request of case {name} got no data for "
                f"{timeout_s:g} s (bench.request_timeout_s)"
            )
    return None


async def measure_launch(session: VariantSession, vb: VariantBench, target: int) -> None:
    """Trials of one launch back to back, then (adaptive trials) more batches while a case
    has no clear verdict against the baseline."""
    bench = session.bench_cfg
    base = session.baseline.cases if session.baseline else None
    while vb.done < target:
        await vb.run_trial(target)
        session.check_alive(vb)
        if vb.done == target and target < bench.max_trials and wants_more(bench, vb.results(), base):
            target = min(bench.max_trials, target + bench.trials)


async def _bench_launch(session: VariantSession, endpoint: Endpoint, launch: int) -> None:
    async with session.bench(endpoint, launch) as vb:
        try:
            await measure_launch(session, vb, vb.done + session.bench_cfg.trials)
        finally:
            session.keep(vb)


# Runs while the first launch's server is still up after its trials (e.g. ``tune`` asks it
# for the greedy token ids behind the measured outputs); it records its own failures.
AfterBench = Callable[[VariantSession, Endpoint], None]


def run_variant(
    session: VariantSession,
    baseline: VariantResult | None,
    launches: int = 1,
    *,
    after_bench: AfterBench | None = None,
) -> VariantResult:
    """The whole life of one variant in one go; any failure is recorded, Ctrl-C re-raised."""
    session.baseline = baseline
    session.begin()
    try:
        for launch in range(launches):
            with contextlib.ExitStack() as stack:
                session.start(stack, launch)
                endpoint = session.wait_ready()
                if launch == 0:
                    session.check_suite(endpoint, baseline)
                asyncio.run(_bench_launch(session, endpoint, launch))
                if launch == 0 and after_bench is not None and session.ok:
                    after_bench(session, endpoint)
                session.say("stopping server")
    except BaseException as exc:
        session.fail(exc)
        if not isinstance(exc, Exception):
            raise
    finally:
        session.finish()
    return session.result
