"""Schedules: in which order a sweep's variants are launched and measured.

``sequential``: one server at a time, all its trials in a row (what a GPU with room for
one server needs). ``interleaved``: every variant's server up at once, one trial of each
per round, so slow drift of the machine (thermal, background load) lands on all variants
alike instead of on whichever ran last. On CPU every server but the one measuring is
frozen (a waiting vLLM CPU server polls and steals CPU), and the servers start together.
In both, one variant failing never stops the others.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator

from specexp.launch.base import Endpoint, Pausable
from specexp.measure.runner import VariantBench, wants_more
from specexp.record.results import VariantResult
from specexp.run.variant import VariantSession, run_variant

Done = Callable[[VariantSession], None]


def _baseline_of(session: VariantSession, by_hash: dict[str, VariantResult]) -> VariantResult | None:
    return by_hash.get(session.variant.baseline_hash or "")


def sequential(
    sessions: list[VariantSession],
    done: Done,
    launches: int = 1,
    known: dict[str, VariantResult] | None = None,
) -> None:
    """``known``: results measured before (a resumed sweep), usable as baselines."""
    by_hash: dict[str, VariantResult] = dict(known or {})
    for session in sessions:
        try:
            run_variant(session, _baseline_of(session, by_hash), launches)
        finally:  # an interrupted variant is recorded too, marked as such
            by_hash[session.variant.hash] = session.result
            done(session)


def interleaved(
    sessions: list[VariantSession],
    done: Done,
    *,
    freeze: bool,
    launches: int = 1,
    known: dict[str, VariantResult] | None = None,
) -> None:
    """Every server up at once, then rounds of one trial per variant (baselines first)."""
    sessions = sorted(sessions, key=lambda s: not s.variant.is_baseline)  # baselines answer first
    by_hash = {**(known or {}), **{s.variant.hash: s.result for s in sessions}}
    for s in sessions:
        s.baseline = _baseline_of(s, by_hash)
    parallel_start = all(s.plan.device == "cpu" for s in sessions)
    try:
        for s in sessions:
            s.begin()
        for launch in range(launches):
            live = [s for s in sessions if s.ok]
            if not live:
                break
            _one_launch(live, launch, freeze=freeze, parallel_start=parallel_start)
    except BaseException as exc:
        for s in sessions:
            s.fail(exc)
        raise
    finally:
        for s in sessions:
            s.finish()
            done(s)


def _one_launch(sessions: list[VariantSession], launch: int, *, freeze: bool, parallel_start: bool) -> None:
    with contextlib.ExitStack() as stack:
        try:
            live = _start_all(sessions, stack, launch, parallel_start)
            with _turns(live, freeze) as turn:
                if launch == 0:
                    for s, endpoint in live:
                        try:
                            turn(s)
                            s.check_suite(endpoint, s.baseline)
                        except Exception as exc:  # fail_fast: this variant stops, the others go on
                            _drop(s, exc)
                live = [(s, e) for s, e in live if s.ok]
                if live:
                    asyncio.run(_rounds(live, turn, launch))
        finally:  # all servers wind down together; the stack then waits for each
            for s in sessions:
                if s.launcher is not None:
                    s.launcher.request_stop()


def _drop(session: VariantSession, exc: BaseException) -> None:
    session.fail(exc)
    if session.launcher is not None:
        session.launcher.request_stop()


def _start_all(
    sessions: list[VariantSession], stack: contextlib.ExitStack, launch: int, parallel_start: bool
) -> list[tuple[VariantSession, Endpoint]]:
    """On CPU all servers start at once (startup is mostly one-core imports); a GPU's
    memory profiling at startup must not race another server's, so one at a time there."""
    live: list[tuple[VariantSession, Endpoint]] = []
    started = []
    for s in sessions:
        try:
            s.start(stack, launch)
            started.append(s)
            if not parallel_start:
                live.append((s, s.wait_ready()))
        except Exception as exc:  # this variant failed to start; the others go on
            _drop(s, exc)
    for s in started if parallel_start else []:
        try:
            live.append((s, s.wait_ready()))
        except Exception as exc:
            _drop(s, exc)
    return live


@contextlib.contextmanager
def _turns(
    live: list[tuple[VariantSession, Endpoint]], freeze: bool
) -> Iterator[Callable[[VariantSession], None]]:
    """``turn(s)`` thaws ``s``'s server and freezes every other (when ``freeze`` and the
    launcher can); all are thawed on the way out, however it is left."""
    pausable: dict[str, Pausable] = {}
    for s, _ in live:
        if isinstance(s.launcher, Pausable):
            pausable[s.variant.hash] = s.launcher

    def turn(active: VariantSession) -> None:
        for key, launcher in pausable.items():
            if key != active.variant.hash:
                launcher.freeze()
        if active.variant.hash in pausable:
            pausable[active.variant.hash].thaw()

    try:
        yield turn if freeze else (lambda _s: None)
    finally:
        for launcher in pausable.values():
            launcher.thaw()


async def _rounds(
    live: list[tuple[VariantSession, Endpoint]], turn: Callable[[VariantSession], None], launch: int
) -> None:
    """Round-robin trials. Each variant runs its own ``bench.trials`` (and adaptive batches
    up to its own ``bench.max_trials`` while a case has no clear verdict nor, with
    ``bench.target_width``, an interval that narrow); a variant whose
    server fails leaves the rotation and the others go on."""
    async with contextlib.AsyncExitStack() as stack:
        benches: list[tuple[VariantSession, VariantBench, int]] = []
        for s, endpoint in live:
            try:
                turn(s)  # its warm-up runs alone too
                vb = await stack.enter_async_context(s.bench(endpoint, launch))
                benches.append((s, vb, vb.done + s.bench_cfg.trials))
            except Exception as exc:
                _drop(s, exc)
        targets = {s.variant.hash: target for s, _, target in benches}
        while True:
            progressed = False
            for s, vb, _ in benches:
                target = targets[s.variant.hash]
                if not s.ok or vb.done >= target:
                    continue
                try:
                    turn(s)
                    await vb.run_trial(target)
                    s.check_alive(vb)
                    progressed = True
                except Exception as exc:
                    _drop(s, exc)
                finally:
                    s.keep(vb)
            if progressed:
                continue
            grown = False
            for s, vb, _ in benches:  # adaptive trials: another batch where a verdict is unclear
                bench = s.bench_cfg
                target = targets[s.variant.hash]
                base = s.baseline.cases if s.baseline else None
                if s.ok and target < bench.max_trials and wants_more(bench, vb.results(), base):
                    targets[s.variant.hash] = min(bench.max_trials, target + bench.trials)
                    grown = True
                    # both sides of the comparison grow, so the drift lands on both
                    base_hash = s.variant.baseline_hash or ""
                    if base_hash in targets:
                        targets[base_hash] = max(targets[base_hash], targets[s.variant.hash])
            if not grown:
                break
        for s, vb, _ in benches:
            s.keep(vb)
