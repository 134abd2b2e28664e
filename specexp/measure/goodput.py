"""Goodput: completed requests per second that met every service-level objective.

Defined as ``vllm bench serve --goodput`` and AIPerf's ``--goodput`` define it (DistServe):
a request is good when it succeeded and each configured figure is within its objective;
goodput is good requests divided by the window's duration. The figures are per request:
TTFT, and the request's mean inter-token latency ``(latency − TTFT) / (output tokens − 1)``
(vLLM's ``tpot``, AIPerf's per-request ``inter_token_latency``). With one output token
there is no gap: vLLM counts that as 0 (meets the objective), which specexp follows;
AIPerf cannot compute the figure and counts the request as not good.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from specexp.record.results import RequestRecord


@dataclass(frozen=True)
class Slo:
    ttft_ms: float | None = None
    itl_ms: float | None = None

    @property
    def active(self) -> bool:
        return self.ttft_ms is not None or self.itl_ms is not None


def mean_itl_s(rec: RequestRecord) -> float | None:
    """The request's mean gap between output tokens (0 with a single token)."""
    if rec.ttft_s is None or rec.latency_s is None:
        return None
    if rec.output_tokens <= 1:
        return 0.0
    return (rec.latency_s - rec.ttft_s) / (rec.output_tokens - 1)


def is_good(rec: RequestRecord, slo: Slo) -> bool:
    if not rec.ok or rec.ttft_s is None:
        return False
    if slo.ttft_ms is not None and rec.ttft_s * 1000 > slo.ttft_ms:
        return False
    itl = mean_itl_s(rec)
    return not (slo.itl_ms is not None and (itl is None or itl * 1000 > slo.itl_ms))


def goodput_metrics(records: Sequence[RequestRecord], duration_s: float, slo: Slo) -> dict[str, float]:
    """``goodput_req_s`` and the share of requests that were good; empty without objectives."""
    if not slo.active or not records or duration_s <= 0:
        return {}
    good = sum(1 for r in records if is_good(r, slo))
    return {"goodput_req_s": good / duration_s, "good_fraction": good / len(records)}
