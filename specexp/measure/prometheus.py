"""Speculative-decoding counters from vLLM's ``/metrics``, and their deltas over a window.

Acceptance must be read as the difference of two snapshots around the
measured window: the counters are cumulative since server start, so warm-up
and earlier cases would otherwise leak in. Metric names are matched exactly
(prometheus_client's parser), summed across label sets (several engines), and
kept per ``position`` for the per-position rates. Definitions follow
``vllm bench serve``: rate = Δaccepted / Δdraft_tokens; mean acceptance length
= 1 + Δaccepted / Δdrafts (includes the bonus token); per-position rate[i] =
Δaccepted_per_pos[i] / Δdrafts.
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


@dataclass(frozen=True)
class SpecSnapshot:
    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted: float = 0.0
    accepted_per_pos: dict[int, float] = field(default_factory=dict)
    generation_tokens: float = 0.0
    has_spec: bool = False  # the server exposes spec-decode counters at all


@dataclass(frozen=True)
class Acceptance:
    drafts: int
    draft_tokens: int
    accepted: int
    rate: float | None  # fraction 0..1
    mean_length: float | None
    per_position: tuple[float, ...]


def parse_metrics(text: str) -> SpecSnapshot:
    sums = {DRAFTS: 0.0, DRAFT_TOKENS: 0.0, ACCEPTED: 0.0, GENERATION_TOKENS: 0.0}
    per_pos: dict[int, float] = {}
    has_spec = False
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name
            if name in sums:
                sums[name] += sample.value
                has_spec = has_spec or name != GENERATION_TOKENS
            elif name == ACCEPTED_PER_POS:
                has_spec = True
                pos = int(sample.labels.get("position", "0"))
                per_pos[pos] = per_pos.get(pos, 0.0) + sample.value
    return SpecSnapshot(
        drafts=sums[DRAFTS],
        draft_tokens=sums[DRAFT_TOKENS],
        accepted=sums[ACCEPTED],
        accepted_per_pos=per_pos,
        generation_tokens=sums[GENERATION_TOKENS],
        has_spec=has_spec,
    )


def delta(before: SpecSnapshot, after: SpecSnapshot) -> Acceptance | None:
    """Acceptance over the window between two snapshots; None when speculation is off."""
    if not (before.has_spec or after.has_spec):
        return None
    d_drafts = after.drafts - before.drafts
    d_tokens = after.draft_tokens - before.draft_tokens
    d_acc = after.accepted - before.accepted
    if min(d_drafts, d_tokens, d_acc) < 0:
        raise ValueError("spec-decode counters went backwards: the server restarted mid-window")
    positions = sorted(set(before.accepted_per_pos) | set(after.accepted_per_pos))
    per_pos = (
        tuple(
            (after.accepted_per_pos.get(p, 0.0) - before.accepted_per_pos.get(p, 0.0)) / d_drafts
            for p in positions
        )
        if d_drafts > 0
        else ()
    )
    return Acceptance(
        drafts=int(d_drafts),
        draft_tokens=int(d_tokens),
        accepted=int(d_acc),
        rate=d_acc / d_tokens if d_tokens > 0 else None,
        mean_length=1 + d_acc / d_drafts if d_drafts > 0 else None,
        per_position=per_pos,
    )


async def scrape(client: httpx.AsyncClient, metrics_url: str) -> SpecSnapshot:
    resp = await client.get(metrics_url, timeout=10.0)
    resp.raise_for_status()
    return parse_metrics(resp.text)
