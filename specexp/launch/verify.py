"""``python -m specexp verify``: does the live server run what the A/B recommended?

Seed 003's production server had drifted back to the value the A/B had rejected, and the
fix was checked "live in the running process, not just in the file". So the running
server is asked (``specexp.launch.effective``: ``/v1/models``, the cache-config labels
and the per-position spec-decode counters in ``/metrics``, ``/server_info`` in dev mode)
and, when it runs on this machine, its process is read too (command line and
environment). Every key the recommendation sets is compared with the most direct
source that shows it; a key no source shows is reported as not visible, never as clean.
"""

from __future__ import annotations

import ipaddress
import json
import math
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

import httpx
import psutil

from specexp.config.variant import Variant
from specexp.errors import LaunchError
from specexp.launch.base import EffectiveConfig, Endpoint
from specexp.launch.effective import process_config, read_effective

# Which source answers a key first: the engine's own config, then its counters and labels,
# then the process's command line.
_PRECEDENCE = ("/server_info", "/metrics", "/v1/models", "process")
_FLAGS = {
    "--block-size": "cache.block_size",
    "--gpu-memory-utilization": "cache.gpu_memory_utilization",
    "--kv-cache-dtype": "cache.cache_dtype",
    "--max-num-seqs": "scheduler.max_num_seqs",
    "--max-num-batched-tokens": "scheduler.max_num_batched_tokens",
    "--max-model-len": "model.max_model_len",
    "--tensor-parallel-size": "parallel.tensor_parallel_size",
    "--pipeline-parallel-size": "parallel.pipeline_parallel_size",
    "--attention-backend": "attention.backend",
}
# Read-back keys a recorded run carries that say what was computed (not where or when).
COMPARED_PREFIXES = ("spec.", "attention.", "cache.", "scheduler.", "parallel.")
COMPARED_KEYS = ("model.max_model_len",)


@dataclass(frozen=True)
class Row:
    key: str
    expected: Any
    live: Any
    source: str | None
    status: str  # ok | drift | not visible
    others: str = ""  # what other sources said, when they disagree

    @property
    def drift(self) -> bool:
        return self.status == "drift"


def expected_from_variant(variant: Variant) -> dict[str, Any]:
    """The keys a recommended variant pins, in read-back names."""
    cfg = variant.config
    spec, server = cfg.spec, cfg.server
    out: dict[str, Any] = {"spec.enabled": spec.method != "none"}
    if spec.method != "none":
        out["spec.method"] = spec.method
        out["spec.depth"] = spec.depth
        if spec.method == "ngram":
            from specexp.tune.depth_model import ngram_window

            out["spec.prompt_lookup_min"], out["spec.prompt_lookup_max"] = ngram_window(spec)
        schedule = spec.extra.get("num_speculative_tokens_per_batch_size")
        if schedule is not None:
            out["spec.num_speculative_tokens_per_batch_size"] = schedule
    if cfg.attention.backend.lower() != "auto":
        out["attention.backend"] = cfg.attention.backend.upper()
    for key, name in (
        ("block_size", "cache.block_size"),
        ("gpu_memory_utilization", "cache.gpu_memory_utilization"),
        ("kv_cache_dtype", "cache.cache_dtype"),
        ("max_num_seqs", "scheduler.max_num_seqs"),
        ("max_num_batched_tokens", "scheduler.max_num_batched_tokens"),
        ("max_model_len", "model.max_model_len"),
    ):
        value = getattr(server, key)
        if value is not None:
            out[name] = value
    if server.tensor_parallel_size != 1:
        out["parallel.tensor_parallel_size"] = server.tensor_parallel_size
    if server.pipeline_parallel_size != 1:
        out["parallel.pipeline_parallel_size"] = server.pipeline_parallel_size
    for key, value in server.env.items():
        out[f"process.env.{key}"] = str(value)
    return out


def expected_from_effective(effective: dict[str, Any]) -> dict[str, Any]:
    """What a measured run's server reported running (its ``result.json`` read-back)."""
    return {
        k: v
        for k, v in effective.items()
        if (k.startswith(COMPARED_PREFIXES) or k in COMPARED_KEYS) and v is not None
    }


def from_cmdline(argv: Sequence[str]) -> dict[str, Any]:
    """Keys from a ``vllm serve`` command line (``--flag=value`` or ``--flag value``)."""
    out: dict[str, Any] = {}
    args = list(argv)
    for i, arg in enumerate(args):
        flag, eq, value = arg.partition("=")
        if not eq:
            value = args[i + 1] if i + 1 < len(args) else ""
        if flag in ("--speculative-config", "-sc"):
            try:
                doc = json.loads(value)
            except ValueError:
                continue
            out["spec.method"] = doc.get("method")
            out["spec.depth"] = doc.get("num_speculative_tokens")
            for key in ("prompt_lookup_min", "prompt_lookup_max", "num_speculative_tokens_per_batch_size"):
                if doc.get(key) is not None:
                    out[f"spec.{key}"] = doc[key]
        elif flag in _FLAGS and value:
            out[_FLAGS[flag]] = value.upper() if flag == "--attention-backend" else value
    out["spec.enabled"] = bool(out.get("spec.method"))
    return out


def _local(host: str) -> bool:
    try:
        addr = ipaddress.ip_address(socket.gethostbyname(host))
    except (OSError, ValueError):
        return False
    if addr.is_loopback or addr.is_unspecified:
        return True
    own = {a.address for addrs in psutil.net_if_addrs().values() for a in addrs}
    return str(addr) in own


def listening_pid(url: str) -> int | None:
    """The process on this machine that listens on the endpoint's port."""
    parsed = urlparse(url)
    if not parsed.hostname or not _local(parsed.hostname):
        return None
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        conns = psutil.net_connections(kind="tcp")
    except (psutil.Error, OSError):
        return None
    for c in conns:
        if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.pid:
            return int(c.pid)
    return None


def read_live(url: str, api_key: str | None = None, timeout_s: float = 10.0) -> EffectiveConfig:
    """The live server's configuration from every source; a server that answers neither
    ``/v1/models`` nor ``/metrics`` is a LaunchError (one line, exit 2)."""
    base = url.rstrip("/").removesuffix("/v1")
    endpoint = Endpoint(base, "", api_key=api_key)
    try:
        with httpx.Client(timeout=timeout_s, headers=endpoint.headers()) as client:
            client.get(f"{base}/v1/models")
    except httpx.HTTPError as exc:
        raise LaunchError(f"endpoint {base} does not answer ({type(exc).__name__})") from None
    served = read_effective(endpoint, timeout_s=timeout_s)
    if not any(s in ("/v1/models", "/metrics") for s in served.sources.values()):
        raise LaunchError(
            f"endpoint {base} answers neither /v1/models nor /metrics: {'; '.join(served.notes)}"
        )
    values = dict(served.values)
    sources = dict(served.sources)
    notes = list(served.notes)
    pid = listening_pid(base)
    if pid is not None:
        proc = process_config(pid)
        cmd = proc.get("process.cmdline")
        if isinstance(cmd, list):
            # the process's own view is kept under its own name, so precedence can pick
            for key, value in from_cmdline(cmd).items():
                values[f"process:{key}"] = value
        for key, value in proc.items():
            if key.startswith("process.env."):
                values[key], sources[key] = value, "process"
        notes.append(f"process {pid} on this machine listens on the endpoint")
    else:
        notes.append(
            "no process of this machine listens on the endpoint: command line and environment not read"
        )
    return EffectiveConfig(values=values, sources=sources, notes=tuple(notes))


def _same(expected: Any, live: Any) -> bool:
    if isinstance(expected, bool) or isinstance(live, bool):
        return str(expected).lower() == str(live).lower()
    try:
        a, b = float(expected), float(live)
    except (TypeError, ValueError):
        if isinstance(expected, list | tuple) or isinstance(live, list | tuple):
            return json.loads(json.dumps(expected)) == json.loads(json.dumps(live))
        return str(expected).strip().lower() == str(live).strip().lower()
    return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9)


def compare(expected: dict[str, Any], live: EffectiveConfig) -> list[Row]:
    rows = []
    for key in sorted(expected):
        want = expected[key]
        seen: list[tuple[str, Any]] = []
        if key.startswith("process.env."):
            if key in live.values:
                seen.append(("process", live.values[key]))
        else:
            if key in live.values:
                seen.append((live.sources.get(key, "?"), live.values[key]))
            if f"process:{key}" in live.values:
                seen.append(("process", live.values[f"process:{key}"]))
        if not seen:
            rows.append(Row(key, want, None, None, "not visible"))
            continue
        seen.sort(key=lambda s: _PRECEDENCE.index(s[0]) if s[0] in _PRECEDENCE else len(_PRECEDENCE))
        source, value = seen[0]
        others = [f"{s}: {v}" for s, v in seen[1:] if not _same(value, v)]
        rows.append(Row(key, want, value, source, "ok" if _same(want, value) else "drift", "; ".join(others)))
    return rows


def _expected(against: str) -> tuple[dict[str, Any], str]:
    """From ``conf/experiment/NAME.yaml``, or from an MLflow run (what its server ran)."""
    from specexp.config.compose import plan_sweep
    from specexp.paths import conf_dir

    if (conf_dir() / "experiment" / f"{against}.yaml").is_file():
        variants = plan_sweep([f"experiment={against}"], with_baseline=False)
        return expected_from_variant(variants[0]), f"experiment {against}"
    from specexp.config.compose import compose_config, hydra_context
    from specexp.errors import ConfigError
    from specexp.record.store import load_runs

    with hydra_context():
        cfg, _ = compose_config([])
    try:
        stored = load_runs(cfg.tracking, [against])[0]
    except ConfigError as exc:
        raise ConfigError(f"--against {against}: no conf/experiment/{against}.yaml, and {exc}") from None
    result = stored.result
    expected: dict[str, Any] = {}
    try:
        variants = plan_sweep(list(result.overrides), with_baseline=False)
        expected.update(expected_from_variant(variants[0]))
    except ConfigError:
        pass  # the config tree moved on since: the read-back alone says what ran
    expected.update(expected_from_effective(result.effective))
    return expected, f"run {against} ({result.label})"


def verify_command(args: Any, console: Any) -> int:
    """Print the table; 1 on drift, 0 when clean (a dead endpoint raises: one line, exit 2)."""
    from rich.table import Table

    from specexp.launch.base import api_key_from_env

    expected, what = _expected(args.against)
    live = read_live(args.endpoint, api_key_from_env(args.api_key_env))
    rows = compare(expected, live)
    table = Table(title=f"{args.endpoint} against {what}", title_justify="left")
    for col in ("key", "recommended", "live", "source", ""):
        table.add_column(col, overflow="fold")
    style = {"ok": "green", "drift": "bold red", "not visible": "yellow"}
    for r in rows:
        shown = "–" if r.live is None else str(r.live)
        if r.others:
            shown += f" ({r.others})"
        table.add_row(r.key, str(r.expected), shown, r.source or "–", f"[{style[r.status]}]{r.status}[/]")
    console.print(table)
    for note in live.notes:
        console.print(f"  note: {note}", highlight=False, style="dim")
    drift = [r for r in rows if r.drift]
    if drift:
        named = ", ".join(f"{r.key} {r.live} (recommended {r.expected})" for r in drift)
        console.print(f"[bold red]DRIFT[/bold red]: {named}", highlight=False, soft_wrap=True)
        return 1
    hidden = sum(1 for r in rows if r.status == "not visible")
    tail = f" ({hidden} key(s) not visible from here)" if hidden else ""
    console.print(f"[green]clean[/green]: the live server runs the recommendation{tail}", highlight=False)
    return 0
