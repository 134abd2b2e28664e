"""From a bench config to what each case sends: its conversations, and per trial its window
(closed loop or a schedule); and the figures only traffic gives (goodput, lateness).

A case takes its requests from its workload (``bench.workload`` or its own), or builds
exact-length prompts (``prompt_tokens``). With ``bench.split_by_slice`` a case whose
workload labels its records with slices becomes one case per slice, named
``<case>.<slice>``, so a knob that wins on one slice and loses on another shows it.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from specexp.config.schema import BenchConfig, CaseConfig
from specexp.errors import ConfigError
from specexp.measure import workload
from specexp.measure.arrivals import rate_offsets, trace_offsets, window_rng
from specexp.measure.goodput import Slo, goodput_metrics
from specexp.measure.loadgen import Window
from specexp.measure.long_prompt import exact_prompt
from specexp.measure.workload_files import Turn, Workload
from specexp.record.results import RequestRecord

UNLABELLED = "unlabelled"


@dataclass(frozen=True)
class CasePlan:
    """One measured case: its settings and the conversations every trial sends."""

    name: str
    case: CaseConfig
    conversations: list[tuple[Turn, ...]]

    @property
    def open_loop(self) -> bool:
        return self.case.request_rate is not None or self.case.timing == "trace"

    @property
    def requests(self) -> int:
        return sum(len(c) for c in self.conversations)

    @property
    def streams(self) -> int:
        """How many requests can be open at once: the closed loop's streams, or for open
        loop the cap (or every request: nothing holds them back)."""
        if not self.open_loop:
            return self.case.concurrency
        return self.case.max_concurrency or self.requests


def _slices(work: Workload) -> list[tuple[str, Workload]]:
    labels = work.slices()
    out = [(label, work.only_slice(label)) for label in labels]
    rest = tuple(t for t in work.turns if t.slice is None)
    if labels and rest:
        out.append((UNLABELLED, Workload(f"{work.name}/{UNLABELLED}", work.source, rest)))
    return out


def _check(name: str, case: CaseConfig, work: Workload) -> None:
    if case.timing == "trace" and not work.has_timestamps:
        raise ConfigError(
            f"bench.cases.{name}.timing=trace: workload {work.source} has no timestamps "
            "(give records a timestamp, or set request_rate instead)"
        )


def plan_cases(
    bench: BenchConfig, tokenizer: str | None = None, *, exact: bool = True
) -> dict[str, CasePlan]:
    """Every case's conversations, split by slice where asked. The tokenizer is needed
    only for ``prompt_tokens`` cases; ``exact=False`` leaves those out."""
    plans: dict[str, CasePlan] = {}
    for index, (name, case) in enumerate(bench.cases.items()):
        if case.prompt_tokens is not None:
            if not exact:
                continue
            if tokenizer is None:
                raise ConfigError(
                    f"bench.cases.{name}.prompt_tokens needs the model's tokenizer on this machine"
                )
            count = case.num_prompts or 1
            convs: list[tuple[Turn, ...]] = [
                (Turn(i + 1, tuple(exact_prompt(tokenizer, case.prompt_tokens, i))),) for i in range(count)
            ]
            plans[name] = CasePlan(name, case, convs)
            continue
        work = workload.resolve(case.workload or bench.workload)
        parts = _slices(work) if bench.split_by_slice else []
        for label, part in parts or [("", work)]:
            _check(name, case, part)
            convs = workload.pick(
                part,
                case.num_prompts,
                seed=bench.seed,
                case_index=index,
                in_file_order=case.timing == "trace",
            )
            full = f"{name}.{label}" if label else name
            plans[full] = CasePlan(full, case, convs)
    return plans


def check_bench(bench: BenchConfig) -> None:
    """Everything about a bench's workloads that can be checked before a server starts:
    each file read whole, and what its cases ask of it (timestamps for ``timing: trace``)."""
    plan_cases(bench, exact=False)


def window(plan: CasePlan, seed: int, trial: int) -> Window:
    """What trial ``trial`` of a case sends: the same conversations every trial; in open loop
    a fresh schedule per trial (the same for every variant)."""
    case = plan.case
    if case.timing == "trace":
        starts = [conv[0].timestamp_s for conv in plan.conversations]
        known = [t for t in starts if t is not None]
        due = trace_offsets(starts)
        return Window(
            plan.conversations,
            due_s=due,
            concurrency=case.max_concurrency,
            trace_start_s=min(known) if known else 0.0,
        )
    if case.request_rate is not None:
        rng = window_rng(seed, plan.name, trial)
        due = rate_offsets(len(plan.conversations), case.request_rate, case.burstiness, rng)
        return Window(plan.conversations, due_s=due, concurrency=case.max_concurrency)
    return Window(plan.conversations, concurrency=case.concurrency)


def _pct(values: Sequence[float], q: float) -> float:
    return (
        statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1] if len(values) > 1 else values[0]
    )


def traffic_metrics(
    records: Sequence[RequestRecord], duration_s: float, slo: Slo, open_loop: bool
) -> dict[str, float]:
    """Goodput (when objectives are set), and for scheduled requests how late they went out
    and the rate actually offered."""
    out = goodput_metrics(records, duration_s, slo)
    late = [r.late_s for r in records if r.late_s is not None and r.turn == 0]
    if open_loop and late:
        out["send_late_p50_ms"] = statistics.median(late) * 1000
        out["send_late_p99_ms"] = _pct(late, 99) * 1000
        out["send_late_max_ms"] = max(late) * 1000
    return out


def slo_of(bench: BenchConfig) -> Slo:
    return Slo(ttft_ms=bench.slo.ttft_ms, itl_ms=bench.slo.itl_ms)
