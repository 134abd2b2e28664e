"""Read back what a running vLLM really runs: the config in the file is not the config that runs.

Every source that exists is read, and each value says where it came from:
``/v1/models`` (served name, model path, context length; through the proxy, when there
is one), ``/metrics`` (the
``vllm:cache_config_info`` labels; speculative decoding on/off and its depth from the
per-position acceptance counters), ``/server_info`` (the whole VllmConfig, mounted only
with ``VLLM_SERVER_DEV_MODE=1``), and, for a server on this machine, the command line
and environment of its process. The same reader serves every launcher, ``verify`` and
``deploy``.
"""

from __future__ import annotations

import contextlib
import json
import re
from typing import Any

import httpx
import psutil
from prometheus_client.parser import text_string_to_metric_families

from specexp.launch.base import EffectiveConfig, Endpoint
from specexp.launch.plan import redact_argv, redact_env

PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
CACHE_INFO = "vllm:cache_config_info"
# The process environment worth reading back (what decides speed, placement and comms).
ENV_PREFIXES = ("VLLM_", "NCCL_", "GLOO_", "CUDA_VISIBLE", "OMP_", "LD_PRELOAD", "DSPARK_")
_CACHE_KEYS = ("block_size", "cache_dtype", "gpu_memory_utilization", "enable_prefix_caching")


# VllmConfig section -> (our prefix, the keys that decide what is computed)
_SECTIONS: dict[str, tuple[str, tuple[str, ...]]] = {
    "cache_config": (
        "cache",
        ("block_size", "cache_dtype", "gpu_memory_utilization", "enable_prefix_caching"),
    ),
    "scheduler_config": (
        "scheduler",
        ("max_num_seqs", "max_num_batched_tokens", "long_prefill_token_threshold", "async_scheduling"),
    ),
    "parallel_config": ("parallel", ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size")),
    "model_config": ("model", ("dtype", "max_model_len", "enforce_eager", "quantization")),
}


def _backend_name(value: Any) -> str | None:
    """``vllm.v1.attention.backends.flashinfer.FlashInferBackend`` → ``FLASHINFER``."""
    if not value:
        return None
    text = str(value).rsplit(".", 1)[-1]
    text = text.removesuffix("Backend")
    return text.upper() if text else None


def from_server_info(info: dict[str, Any]) -> dict[str, Any]:
    """Flatten the parts of ``/server_info``'s VllmConfig that decide what is computed."""
    vc = info.get("vllm_config") or {}
    if isinstance(vc, str):
        vc = json.loads(vc)
    out: dict[str, Any] = {}
    spec = vc.get("speculative_config") or None
    out["spec.method"] = spec.get("method") if spec else "none"
    out["spec.depth"] = int(spec.get("num_speculative_tokens") or 0) if spec else 0
    if spec:
        for key in ("prompt_lookup_min", "prompt_lookup_max", "moe_backend", "attention_backend"):
            if spec.get(key) is not None:
                out[f"spec.{key}"] = spec[key]
        if spec.get("num_speculative_tokens_per_batch_size") is not None:
            out["spec.num_speculative_tokens_per_batch_size"] = spec["num_speculative_tokens_per_batch_size"]
    attention = _backend_name((vc.get("attention_config") or {}).get("backend"))
    out["attention.backend"] = attention or "AUTO"
    for section, (prefix, keys) in _SECTIONS.items():
        node = vc.get(section) or {}
        out.update({f"{prefix}.{key}": node[key] for key in keys if key in node})
    return out


def from_metrics(text: str) -> dict[str, Any]:
    """Speculation and its depth from the per-position counters; the cache config labels."""
    out: dict[str, Any] = {}
    positions: set[int] = set()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == PER_POS:
                positions.add(int(sample.labels.get("position", "0")))
            elif sample.name == CACHE_INFO:
                for key in _CACHE_KEYS:
                    if key in sample.labels:
                        out[f"cache.{key}"] = _scalar(sample.labels[key])
    out["spec.enabled"] = bool(positions)
    if positions:
        out["spec.depth"] = max(positions) + 1
    return out


def _scalar(text: str) -> Any:
    """Prometheus labels are strings: give numbers and booleans their type back."""
    if text in ("True", "False"):
        return text == "True"
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def read_effective(endpoint: Endpoint, timeout_s: float = 10.0) -> EffectiveConfig:
    """Ask the server every question it answers; a source that does not answer is a note."""
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    notes: list[str] = []

    def put(found: dict[str, Any], source: str) -> None:
        for key, value in found.items():
            if value is None:  # not reported (GPUStack's /v1/models has no max_model_len)
                continue
            values[key] = value
            sources[key] = source

    with httpx.Client(timeout=timeout_s, headers=endpoint.headers()) as client:
        try:
            models = client.get(f"{endpoint.base_url}/v1/models").raise_for_status().json()
            cards = [c for c in models.get("data") or [] if isinstance(c, dict)]
            # a proxy (GPUStack) lists every model it serves: read the one measured
            card: dict[str, Any] = next(
                (c for c in cards if c.get("id") == endpoint.model), cards[0] if cards else {}
            )
            put(
                {
                    "model.served_name": card.get("id"),
                    "model.path": card.get("root"),
                    "model.max_model_len": card.get("max_model_len"),
                },
                "/v1/models",
            )
        except (httpx.HTTPError, ValueError) as exc:
            notes.append(f"/v1/models did not answer: {type(exc).__name__}")
        try:
            put(from_metrics(client.get(endpoint.metrics_url).raise_for_status().text), "/metrics")
        except (httpx.HTTPError, ValueError) as exc:
            notes.append(f"/metrics did not answer: {type(exc).__name__}")
        try:
            resp = client.get(f"{endpoint.control_base}/server_info", params={"config_format": "json"})
            if resp.status_code == 404:
                notes.append("/server_info is off (VLLM_SERVER_DEV_MODE=1 turns it on)")
            else:
                put(from_server_info(resp.raise_for_status().json()), "/server_info")
        except (httpx.HTTPError, ValueError) as exc:
            notes.append(f"/server_info did not answer: {type(exc).__name__}")
        with contextlib.suppress(httpx.HTTPError, ValueError):
            version = client.get(f"{endpoint.control_base}/version").json().get("version")
            put({"server.version": version}, "/version")
    return EffectiveConfig(values=values, sources=sources, notes=tuple(notes))


_SUBSTITUTED = re.compile(r"Cannot use (?:AttentionBackendEnum\.)?(\S+) backend on (\w+)")


def substituted_backend(line: str) -> str | None:
    """The backend vLLM really uses after a ``Cannot use X backend on CPU`` line: on CPU
    every request falls back to the platform's own attention."""
    m = _SUBSTITUTED.search(line)
    if m is None:
        return None
    return "CPU_ATTN" if m.group(2).upper() == "CPU" else None


def process_config(pid: int | None) -> dict[str, Any]:
    """The command line and the relevant environment of a local server process."""
    if pid is None:
        return {}
    try:
        proc = psutil.Process(pid)
        cmdline = proc.cmdline()
        env = proc.environ()
    except (psutil.Error, OSError):
        return {}
    out: dict[str, Any] = {"process.cmdline": redact_argv(cmdline)}
    kept = redact_env({k: v for k, v in env.items() if k.startswith(ENV_PREFIXES)})
    out.update({f"process.env.{key}": kept[key] for key in sorted(kept)})
    return out
