"""Result models: what a sweep produced, in units named in the field names.

Failures are data: a request error is a RequestRecord with ``error`` set, a
failed variant is a VariantResult with ``status="failed"`` and the reason, so
nothing needs an exception to be recorded.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RequestRecord(_Model):
    """One streamed request. Times in seconds; ``start_s`` is relative to the trial start."""

    index: int
    start_s: float
    send_delay_s: float = 0.0  # client-side: start → request body on the socket (not in TTFT)
    ttft_s: float | None = None  # request sent → first chunk carrying choices
    itl_s: list[float] = Field(default_factory=list)  # gaps between chunks carrying choices
    latency_s: float | None = None  # request sent → last chunk carrying choices (finish included)
    prompt_tokens: int | None = None
    output_tokens: int = 0  # from the usage block: reasoning and answer tokens together
    reasoning_tokens: int | None = None  # of output_tokens; None when there was no reasoning
    reasoning_tokens_source: Literal["usage", "estimate"] | None = None  # estimate: by characters
    chunks: int = 0  # chunks carrying answer text
    reasoning_chunks: int = 0  # chunks carrying reasoning text
    tool_call_chunks: int = 0  # chunks carrying tool-call deltas
    finish_reason: str | None = None
    text: str = ""  # the answer
    reasoning_text: str = ""  # the reasoning, as the server's reasoning parser split it off
    error: str | None = None
    looping: bool = False  # reasoning or answer repeats itself (see measure.degenerate)

    @property
    def answer_tokens(self) -> int:
        return self.output_tokens - (self.reasoning_tokens or 0)

    # where the request came from in its workload, and when it was due (see measure.loadgen)
    slice: str | None = None
    session: str | None = None
    turn: int = 0  # position in its conversation (0: the first request)
    scheduled_s: float | None = None  # due time from the trial start (open loop, later turns)
    late_s: float | None = None  # request on the socket minus its due time

    @property
    def ok(self) -> bool:
        return self.error is None


class AcceptanceRecord(_Model):
    drafts: int
    draft_tokens: int
    accepted: int
    rate: float | None
    mean_length: float | None
    per_position: list[float]
    consistent: bool = True  # mean length == 1 + Σ per-position rates (see measure.prometheus)
    inconsistency: str | None = None


class TrialRecord(_Model):
    """One measured window of one case."""

    case: str
    trial: int
    launch: int = 0  # which server launch of the variant measured it (bench.launches)
    started_at: float = 0.0  # wall clock (Unix time): shows the order of an interleaved sweep
    duration_s: float
    requests: list[RequestRecord]
    metrics: dict[str, float]
    acceptance: AcceptanceRecord | None = None
    # a window that is not a measurement (the server's counters were reset inside it, the
    # server died or stopped answering in it): kept for the record, left out of every
    # summary and verdict
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


class Summary(_Model):
    median: float
    min: float
    max: float
    n: int
    mad: float = 0.0  # median absolute deviation
    cv: float | None = None  # coefficient of variation (stdev / mean), n >= 2
    outliers: list[int] = Field(default_factory=list)  # trial indices far from the others (shown, kept)


class Verdict(_Model):
    """A variant against its baseline: the ratio (Hodges-Lehmann) with an exact rank interval."""

    metric: str
    ratio: float  # median of the pairwise ratios variant/baseline over trials (Hodges-Lehmann)
    ci_low: float | None  # None: too few trials for any interval at this confidence
    ci_high: float | None
    # "not trusted": outputs loop, so speed and acceptance are inflated whatever the interval says
    verdict: Literal["better", "worse", "no clear difference", "not trusted"]
    reason: str | None = None  # why a verdict is not trusted
    confidence: float = 0.95
    n_baseline: int = 0
    n_variant: int = 0


class CaseResult(_Model):
    case: str
    concurrency: int
    trials: list[TrialRecord]
    summary: dict[str, Summary]  # metric name -> median [min, max] over trials
    failed_requests: int = 0
    looping_outputs: int = 0  # outputs that loop: acceptance and speed of this case are inflated
    primary_metric: str | None = None  # the figure verdicts use, when not the default for its concurrency
    request_rate: float | None = None  # open loop: requests/s offered (None: closed loop or a trace)
    burstiness: float = 1.0  # open loop: shape of the gamma-distributed gaps (1: Poisson)
    verdict: Verdict | None = None  # the case's main figure against the baseline
    failed_trials: int = 0  # windows that are not measurements (TrialRecord.error)
    # trials whose client decode speed and the server's own differ by more than 5 %
    server_disagreements: int = 0
    acceptance_inconsistent: int = 0  # trials whose acceptance counters disagree with each other


class SuiteCaseResult(_Model):
    """One suite case on one variant: the answer, the check's verdict, and against the baseline.

    A pass→fail flip is a regression only when it reproduces: the baseline passed both its
    answers (its own run and its second pass) and the variant failed both of its (its run
    and one re-ask). Any other flip is ``flaky``: speculative decoding is lossless only up
    to numerics, and so is a plain greedy run across batch shapes.
    """

    name: str
    check: str  # the check kind
    passed: bool | None  # None: not run here (a server flag or the code sandbox is missing)
    reason: str
    output: str = ""
    tool_calls: list[dict[str, Any]] = Field(default_factory=list)
    token_ids: list[int] | None = None  # the generated ids as the server reported them
    finish_reason: str | None = None
    completion_tokens: int | None = None
    latency_s: float | None = None
    # baseline only: its second answer (other batch shape), and whether it was the same
    repeat_passed: bool | None = None
    repeat_equivalent: bool | None = None
    repeat_divergence: int | None = None
    # variants: against the baseline
    baseline_passed: bool | None = None
    baseline_stable: bool | None = None  # the baseline answered this case the same way twice
    recheck_passed: bool | None = None  # the variant's re-ask of a pass→fail flip
    recheck_reason: str | None = None
    regression: bool = False  # a flip that reproduced
    flaky: bool = False  # a flip that did not
    equivalent: bool | None = None  # same output as the baseline (greedy decoding)
    first_divergence: int | None = None  # first differing position (see divergence_unit)
    divergence_unit: Literal["token", "retokenized", "char"] = "token"


class SuiteResult(_Model):
    name: str
    cases: list[SuiteCaseResult]
    wall_s: float = 0.0
    repeat: SuiteResult | None = None  # baseline: every case asked again, all at once
    # variants: the baseline's agreement with itself, and whether this variant diverges clearly more
    baseline_self_equivalence: float | None = None
    divergence_p: float | None = None  # one-sided exact McNemar test (see suite.runner)
    diverges_beyond_noise: bool | None = None

    @property
    def passed(self) -> int:
        return sum(1 for c in self.cases if c.passed)

    @property
    def failed(self) -> int:
        return sum(1 for c in self.cases if c.passed is False)

    @property
    def not_run(self) -> int:
        return sum(1 for c in self.cases if c.passed is None)

    @property
    def regressions(self) -> list[str]:
        return [c.name for c in self.cases if c.regression]

    @property
    def flaky(self) -> list[str]:
        return [c.name for c in self.cases if c.flaky]

    @property
    def equivalence_rate(self) -> float | None:
        judged = [c.equivalent for c in self.cases if c.equivalent is not None]
        return sum(judged) / len(judged) if judged else None

    @property
    def self_equivalence_rate(self) -> float | None:
        """Baseline: the share of cases answered identically in both passes."""
        judged = [c.repeat_equivalent for c in self.cases if c.repeat_equivalent is not None]
        return sum(judged) / len(judged) if judged else None


class VariantResult(_Model):
    label: str
    variant_hash: str
    is_baseline: bool
    overrides: list[str]
    notes: list[str] = Field(default_factory=list)
    status: Literal["ok", "failed", "interrupted"] = "ok"
    error: str | None = None
    ready_s: float | None = None
    startup_phases: dict[str, float] = Field(default_factory=dict)
    cases: dict[str, CaseResult] = Field(default_factory=dict)
    suite: SuiteResult | None = None  # functional regression suite, run before the benchmarks
    launch: dict[str, Any] = Field(default_factory=dict)  # redacted LaunchPlan
    wall_s: float | None = None
    launch_ready_s: list[float] = Field(default_factory=list)  # every launch's time to ready
    # What the server said it runs (launch.effective), and where each value was read.
    effective: dict[str, Any] = Field(default_factory=dict)
    effective_sources: dict[str, str] = Field(default_factory=dict)
    # Label of an earlier variant whose server ran exactly the same configuration: the
    # comparison between the two is an A/A, not a verdict about the knob.
    same_run_as: str | None = None
    baseline_hash: str | None = None


class TrackingState(_Model):
    """Where a sweep's results went in the tracking store, so a resumed sweep reuses its
    parent run and ``sync`` logs what the store missed, without duplicates."""

    uri: str | None = None
    experiment_id: str | None = None
    parent_run_id: str | None = None
    runs: dict[str, str] = Field(default_factory=dict)  # variant hash -> child run id
    synced: list[str] = Field(default_factory=list)  # variant hashes fully logged
    error: str | None = None  # why the store was left (unreachable, locked)


class SweepResult(_Model):
    name: str
    started_at: str
    wall_s: float | None = None
    status: Literal["running", "finished", "failed", "interrupted"] = "running"
    plan: dict[str, Any] = Field(default_factory=dict)  # SweepPlan.signature(): what resume must match
    variants: list[VariantResult] = Field(default_factory=list)
    reused: list[str] = Field(default_factory=list)  # variant hashes taken from an earlier attempt
    tracking: TrackingState = Field(default_factory=TrackingState)
