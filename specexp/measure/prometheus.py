"""vLLM's ``/metrics`` around a measured window: speculative-decoding counters, the server's
own decode-time histograms, and the marks that show a counter was reset in between.

Everything is read as the difference of two snapshots around the window: the counters
are cumulative since server start, so warm-up and earlier cases would otherwise leak
in. Metric names are matched exactly (prometheus_client's parser), summed across label
sets (several engines), and kept per ``position`` for the per-position rates.
Definitions follow ``vllm bench serve``: rate = Δaccepted / Δdraft_tokens; mean
acceptance length = 1 + Δaccepted / Δdrafts (includes the bonus token); per-position
rate[i] = Δaccepted_per_pos[i] / Δdrafts.

A difference is only a number if the counters were not reset in between: a server that
restarted between the scrapes and whose counters regrew past the "before" values gives
a plausible, wrong delta. ``reset_reason`` catches that from ``process_start_time_seconds``
and the counters' ``*_created`` samples (both change on a restart), and from any counter
that went backwards.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import httpx
from prometheus_client.parser import text_string_to_metric_families

DRAFTS = "vllm:spec_decode_num_drafts_total"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
GENERATION_TOKENS = "vllm:generation_tokens_total"
DECODE_TIME = "vllm:request_decode_time_seconds"  # first to last token of each finished request
TPOT = "vllm:request_time_per_output_token_seconds"  # decode time / (tokens - 1), per request
REQUEST_TOKENS = "vllm:request_generation_tokens"  # output tokens of each finished request
PROCESS_START = "process_start_time_seconds"
HISTOGRAMS = (DECODE_TIME, TPOT, REQUEST_TOKENS)
# Both sides of the acceptance check come from integer counters of the same steps, so
# they agree exactly; the tolerance only absorbs float rounding.
ACCEPTANCE_TOLERANCE = 0.005
_SPEC = (DRAFTS, DRAFT_TOKENS, ACCEPTED)
_COUNTERS = (*_SPEC, ACCEPTED_PER_POS, GENERATION_TOKENS)
_CUMULATIVE = (*_COUNTERS, *(f"{h}_{s}" for h in HISTOGRAMS for s in ("sum", "count")))
_CREATED = tuple(n.removesuffix("_total") + "_created" for n in (*_COUNTERS, *HISTOGRAMS))


def _series(name: str, labels: dict[str, str]) -> str:
    return name + "{" + ",".join(f"{k}={v}" for k, v in sorted(labels.items())) + "}"


@dataclass(frozen=True)
class Snapshot:
    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted: float = 0.0
    accepted_per_pos: dict[int, float] = field(default_factory=dict)
    generation_tokens: float = 0.0
    has_spec: bool = False  # the server exposes spec-decode counters at all
    hist_sum: dict[str, float] = field(default_factory=dict)  # histogram name -> Σ over engines
    hist_count: dict[str, float] = field(default_factory=dict)
    process_start: float | None = None
    created: dict[str, float] = field(default_factory=dict)  # series -> its *_created time
    counters: dict[str, float] = field(default_factory=dict)  # series -> value, every cumulative one read


@dataclass(frozen=True)
class Acceptance:
    drafts: int
    draft_tokens: int
    accepted: int
    rate: float | None  # fraction 0..1
    mean_length: float | None
    per_position: tuple[float, ...]
    # mean length == 1 + Σ per-position rates: both count the same accepted tokens, so a
    # mismatch means the counters disagree (per-position counts off by the data-parallel
    # size, or a per-position parse that found nothing)
    consistent: bool = True
    inconsistency: str | None = None


@dataclass(frozen=True)
class ServerWindow:
    """The server's own timing of the requests that finished inside a window."""

    requests: int  # Δcount of the decode-time histogram
    decode_s: float  # Σ decode time (first to last token) of those requests
    decode_tokens: float  # Σ (output tokens − 1): the tokens produced after the first
    tpot_sum_s: float  # Σ per-request mean time per output token
    tpot_count: int

    @property
    def decode_tok_s(self) -> float | None:
        return self.decode_tokens / self.decode_s if self.decode_s > 0 else None

    @property
    def inverse_mean_tpot(self) -> float | None:
        """1 / mean TPOT: decode tok/s as the average request saw it."""
        return self.tpot_count / self.tpot_sum_s if self.tpot_sum_s > 0 else None


def parse_metrics(text: str) -> Snapshot:
    sums = {DRAFTS: 0.0, DRAFT_TOKENS: 0.0, ACCEPTED: 0.0, GENERATION_TOKENS: 0.0}
    per_pos: dict[int, float] = {}
    hist_sum: dict[str, float] = {}
    hist_count: dict[str, float] = {}
    created: dict[str, float] = {}
    counters: dict[str, float] = {}
    process_start: float | None = None
    has_spec = False
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name
            if name in _CUMULATIVE:
                counters[_series(name, sample.labels)] = sample.value
            elif name in _CREATED:
                created[_series(name, sample.labels)] = sample.value
            if name in sums:
                sums[name] += sample.value
                has_spec = has_spec or name != GENERATION_TOKENS
            elif name == ACCEPTED_PER_POS:
                has_spec = True
                pos = int(sample.labels.get("position", "0"))
                per_pos[pos] = per_pos.get(pos, 0.0) + sample.value
            elif name == PROCESS_START:
                process_start = sample.value
            elif name.endswith(("_sum", "_count")) and name.rsplit("_", 1)[0] in HISTOGRAMS:
                base, kind = name.rsplit("_", 1)
                into = hist_sum if kind == "sum" else hist_count
                into[base] = into.get(base, 0.0) + sample.value
    return Snapshot(
        drafts=sums[DRAFTS],
        draft_tokens=sums[DRAFT_TOKENS],
        accepted=sums[ACCEPTED],
        accepted_per_pos=per_pos,
        generation_tokens=sums[GENERATION_TOKENS],
        has_spec=has_spec,
        hist_sum=hist_sum,
        hist_count=hist_count,
        process_start=process_start,
        created=created,
        counters=counters,
    )


def reset_reason(before: Snapshot, after: Snapshot) -> str | None:
    """Why the two snapshots are not of one uninterrupted server, or None when they are."""
    start, now_start = before.process_start, after.process_start
    if start is not None and now_start is not None and now_start != start:
        return (
            f"the server restarted between the scrapes (process_start_time_seconds "
            f"{start:.0f} → {now_start:.0f})"
        )
    for series, when in before.created.items():
        now = after.created.get(series)
        if now is not None and now != when:
            return f"{series.split('{')[0]} was recreated between the scrapes (a server restart)"
    for series, value in before.counters.items():
        now = after.counters.get(series)
        if now is None:
            return f"{series.split('{')[0]} disappeared between the scrapes (a server restart)"
        if now < value:
            return f"{series.split('{')[0]} went backwards ({value:g} → {now:g}): the server restarted"
    return None


def delta(before: Snapshot, after: Snapshot) -> Acceptance | None:
    """Acceptance over the window between two snapshots; None when speculation is off.
    The caller checks ``reset_reason`` first: a delta across a reset is not a number."""
    if not (before.has_spec or after.has_spec):
        return None
    d_drafts = after.drafts - before.drafts
    d_tokens = after.draft_tokens - before.draft_tokens
    d_acc = after.accepted - before.accepted
    if min(d_drafts, d_tokens, d_acc) < 0:
        raise ValueError("spec-decode counters went backwards: the server restarted mid-window")
    positions = sorted(set(before.accepted_per_pos) | set(after.accepted_per_pos))
    d_pos = [after.accepted_per_pos.get(p, 0.0) - before.accepted_per_pos.get(p, 0.0) for p in positions]
    per_pos = tuple(d / d_drafts for d in d_pos) if d_drafts > 0 else ()
    mean_length = 1 + d_acc / d_drafts if d_drafts > 0 else None
    consistent, why = True, None
    if mean_length is not None:
        if not per_pos:
            consistent, why = False, "no per-position counts although drafts were made"
        elif abs((1 + sum(per_pos)) - mean_length) > ACCEPTANCE_TOLERANCE:
            consistent = False
            why = (
                f"mean acceptance length {mean_length:.3f} but 1 + Σ per-position rates = "
                f"{1 + sum(per_pos):.3f} ({sum(d_pos):g} accepted by position, {d_acc:g} in total)"
            )
    return Acceptance(
        drafts=int(d_drafts),
        draft_tokens=int(d_tokens),
        accepted=int(d_acc),
        rate=d_acc / d_tokens if d_tokens > 0 else None,
        mean_length=mean_length,
        per_position=per_pos,
        consistent=consistent,
        inconsistency=why,
    )


def server_window(before: Snapshot, after: Snapshot) -> ServerWindow | None:
    """The server's decode figures over the window, or None when it exposes no histograms."""
    if DECODE_TIME not in after.hist_count or REQUEST_TOKENS not in after.hist_count:
        return None

    def d(store: str, name: str) -> float:
        a = after.hist_sum if store == "sum" else after.hist_count
        b = before.hist_sum if store == "sum" else before.hist_count
        return a.get(name, 0.0) - b.get(name, 0.0)

    requests = d("count", DECODE_TIME)
    return ServerWindow(
        requests=round(requests),
        decode_s=d("sum", DECODE_TIME),
        decode_tokens=d("sum", REQUEST_TOKENS) - d("count", REQUEST_TOKENS),
        tpot_sum_s=d("sum", TPOT),
        tpot_count=round(d("count", TPOT)),
    )


async def scrape(client: httpx.AsyncClient, metrics_url: str) -> Snapshot:
    resp = await client.get(metrics_url, timeout=10.0)
    resp.raise_for_status()
    return parse_metrics(resp.text)
