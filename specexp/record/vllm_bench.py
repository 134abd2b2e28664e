"""Results in ``vllm bench serve --save-result`` form, laid out like ``vllm bench sweep serve``.

One JSON per trial (``run=N.json``) and a ``summary.json`` list per serve × bench
combination, under ``<sweep>/vllm-bench/SERVE-<variant>-BENCH-<case>/``. Field names and
units are vLLM's (``*_ms``, ``spec_decode_acceptance_rate`` in percent, per-position rates
as fractions); serve override keys are carried verbatim (e.g.
``speculative_config.num_speculative_tokens``) so vLLM's own ``sweep plot`` and
``tune_speculative_k`` can group by them. specexp's extra figures carry a ``specexp_`` prefix.
"""

from __future__ import annotations

import statistics
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from specexp.config.variant import Variant
from specexp.record.files import atomic_write_json, safe_name
from specexp.record.results import CaseResult, TrialRecord, VariantResult


def _p99(values: list[float]) -> float:
    """vLLM's ``np.percentile(values, 99)`` (linear interpolation), which is what the
    inclusive method of ``statistics.quantiles`` computes."""
    if len(values) == 1:  # quantiles wants two points (before Python 3.13)
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[98]


def _dist(name: str, values_s: list[float]) -> dict[str, float]:
    ms = [v * 1000 for v in values_s]
    if not ms:
        return {
            f"mean_{name}_ms": 0.0,
            f"median_{name}_ms": 0.0,
            f"std_{name}_ms": 0.0,
            f"p99_{name}_ms": 0.0,
        }
    return {
        f"mean_{name}_ms": statistics.fmean(ms),
        f"median_{name}_ms": statistics.median(ms),
        f"std_{name}_ms": statistics.pstdev(ms),
        f"p99_{name}_ms": _p99(ms),
    }


def run_record(variant: Variant, model_id: str, case: CaseResult, trial: TrialRecord) -> dict[str, Any]:
    ok = [r for r in trial.requests if r.ok]
    out_tokens = sum(r.output_tokens for r in ok)
    in_tokens = sum(r.prompt_tokens or 0 for r in ok)
    dur = trial.duration_s
    tpots = [
        (r.latency_s - r.ttft_s) / (r.output_tokens - 1)
        for r in ok
        if r.latency_s is not None and r.ttft_s is not None and r.output_tokens > 1
    ]
    spec = variant.config.spec
    rec: dict[str, Any] = {
        "date": datetime.now(UTC).strftime("%Y%m%d-%H%M%S"),
        "endpoint_type": "openai-chat",
        "backend": "openai-chat",
        "label": variant.label,
        "model_id": model_id,
        "tokenizer_id": model_id,
        "num_prompts": len(trial.requests),
        "request_rate": case.request_rate if case.request_rate is not None else "inf",
        "burstiness": case.burstiness,
        "max_concurrency": case.concurrency,
        "duration": dur,
        "completed": len(ok),
        "failed": len(trial.requests) - len(ok),
        "total_input_tokens": in_tokens,
        "total_output_tokens": out_tokens,
        "request_throughput": len(ok) / dur if dur else 0.0,
        "request_goodput": trial.metrics.get("goodput_req_s"),
        "output_throughput": out_tokens / dur if dur else 0.0,
        "total_token_throughput": (in_tokens + out_tokens) / dur if dur else 0.0,
        **_dist("ttft", [r.ttft_s for r in ok if r.ttft_s is not None]),
        **_dist("tpot", tpots),
        **_dist("itl", [x for r in ok for x in r.itl_s]),
        **_dist("e2el", [r.latency_s for r in ok if r.latency_s is not None]),
        "run_number": trial.trial,
        "speculative_config.method": spec.method,
        "speculative_config.num_speculative_tokens": spec.depth,
    }
    for item in variant.overrides:
        key, _, value = item.partition("=")
        rec.setdefault(key.lstrip("+~"), value)
    acc = trial.acceptance
    if acc is not None:
        rec |= {
            "spec_decode_acceptance_rate": acc.rate * 100 if acc.rate is not None else None,
            "spec_decode_acceptance_length": acc.mean_length,
            "spec_decode_num_drafts": acc.drafts,
            "spec_decode_draft_tokens": acc.draft_tokens,
            "spec_decode_accepted_tokens": acc.accepted,
            "spec_decode_per_position_acceptance_rates": acc.per_position,
        }
    for key in (
        "ttft_spread_ms",
        "ttft_max_ms",
        "jain_index",
        "looping_outputs",
        "decode_tok_s",
        "prefix_cache_hit_rate",
        "send_late_p99_ms",
    ):
        if key in trial.metrics:
            rec[f"specexp_{key}"] = trial.metrics[key]
    rec |= {"specexp_variant_hash": variant.hash, "specexp_case": case.case}
    return rec


def write_variant(root: Path, variant: Variant, model_id: str, result: VariantResult) -> list[Path]:
    """Write every trial of every case; returns the combination folders written."""
    folders = []
    safe = safe_name(variant.label)
    for name, case in result.cases.items():
        folder = root / f"SERVE-{safe}-BENCH-{name}"
        records = [run_record(variant, model_id, case, t) for t in case.trials]
        for rec in records:
            atomic_write_json(folder / f"run={rec['run_number']}.json", rec)
        atomic_write_json(folder / "summary.json", records)
        folders.append(folder)
    return folders
