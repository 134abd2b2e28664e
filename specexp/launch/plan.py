"""LaunchPlan: the exact ``vllm serve`` argv and environment for a Variant, per node.

Everything a launcher runs is decided here, so ``--dry-run`` prints it,
validation checks it and MLflow records it (secrets redacted) without any of
them knowing how a server is started.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from specexp.assets import hub
from specexp.config.schema import Config
from specexp.config.variant import Variant
from specexp.paths import vllm_venv

_SECRET = re.compile(r"(TOKEN|KEY|SECRET|PASSW|CREDENTIAL|AUTH)", re.IGNORECASE)
_SECRET_FLAGS = ("--api-key", "--hf-token")
ENTRY_SCRIPT = Path(__file__).with_name("vllm_entry.py")
EMBEDDED_PREFIX = "embedded:"


@dataclass(frozen=True)
class NodePlan:
    rank: int
    host: str
    argv: tuple[str, ...]  # the whole command line
    env: dict[str, str]  # set on top of the launching environment


@dataclass(frozen=True)
class LaunchPlan:
    label: str
    variant_hash: str
    kind: str  # launcher kind
    device: str  # cpu | cuda
    model_path: str
    serve_args: tuple[str, ...]  # what follows `vllm serve` on the head node
    nodes: tuple[NodePlan, ...]
    api_host: str
    api_port: int
    served_model: str
    notes: tuple[str, ...] = field(default=())

    @property
    def head(self) -> NodePlan:
        return self.nodes[0]

    def with_port(self, port: int) -> LaunchPlan:
        """The plan with its API port decided (``server.port=0`` leaves the choice to the
        launcher, which finds a free port on the node that serves)."""
        if port == self.api_port:
            return self
        old, new = f"--port={self.api_port}", f"--port={port}"
        head = replace(self.head, argv=tuple(new if a == old else a for a in self.head.argv))
        return replace(
            self,
            nodes=(head, *self.nodes[1:]),
            serve_args=tuple(new if a == old else a for a in self.serve_args),
            api_port=port,
        )

    def with_master_port(self, port: int) -> LaunchPlan:
        """The plan with the multi-node rendezvous port decided (``launcher.master_port=0``
        leaves it to the launcher, which finds a free one on the head)."""
        old, new = "--master-port=0", f"--master-port={port}"
        nodes = tuple(replace(n, argv=tuple(new if a == old else a for a in n.argv)) for n in self.nodes)
        return replace(self, nodes=nodes, serve_args=tuple(new if a == old else a for a in self.serve_args))

    @property
    def base_url(self) -> str:
        host = "127.0.0.1" if self.api_host in ("0.0.0.0", "") else self.api_host
        return f"http://{host}:{self.api_port}"

    def redacted(self) -> dict[str, Any]:
        """JSON-ready view with secret env values and secret flag values masked."""
        return {
            "label": self.label,
            "variant_hash": self.variant_hash,
            "kind": self.kind,
            "device": self.device,
            "model_path": self.model_path,
            "served_model": self.served_model,
            "base_url": self.base_url,
            "nodes": [
                {
                    "rank": n.rank,
                    "host": n.host,
                    "argv": redact_argv(n.argv),
                    "env": redact_env(n.env),
                }
                for n in self.nodes
            ],
            "notes": list(self.notes),
        }


def redact_env(env: dict[str, str]) -> dict[str, str]:
    return {k: ("***" if _SECRET.search(k) else v) for k, v in env.items()}


def redact_argv(argv: tuple[str, ...] | list[str]) -> list[str]:
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append("***")
            hide_next = False
        elif any(arg == f for f in _SECRET_FLAGS):
            out.append(arg)
            hide_next = True
        elif any(arg.startswith(f + "=") for f in _SECRET_FLAGS):
            out.append(arg.split("=", 1)[0] + "=***")
        else:
            out.append(arg)
    return out


def detect_device(requested: str) -> str:
    """``auto`` → ``cuda`` when ``nvidia-smi`` lists a GPU, else ``cpu``."""
    if requested != "auto":
        return requested
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=10)
            if out.returncode == 0 and "GPU" in out.stdout:
                return "cuda"
        except (OSError, subprocess.SubprocessError):
            pass
    return "cpu"


def vllm_python() -> Path | None:
    py = vllm_venv() / "bin" / "python"
    return py if py.exists() else None


def resolve_vllm_command(config: Config, device: str) -> list[str]:
    """The command that stands for ``vllm``.

    Order: ``launcher.vllm_command``; on CPU, the specexp-managed CPU build (through the
    metadata shim) where it exists; otherwise plain ``vllm``, found on the serving node's PATH.
    """
    if config.launcher.vllm_command:
        return list(config.launcher.vllm_command)
    py = vllm_python()
    if py is not None and device == "cpu":
        return [str(py), str(ENTRY_SCRIPT)]
    return ["vllm"]


def resolve_model_path(path: str, *, allow_download: bool = False, revision: str | None = None) -> str:
    """A local folder for ``embedded:NAME`` and for hub ids (``org/name``, from the cache)."""
    if path.startswith(EMBEDDED_PREFIX):
        from specexp.assets.embedded import embedded_model_dir

        return str(embedded_model_dir(path[len(EMBEDDED_PREFIX) :]))
    if hub.is_hub_id(path):
        return str(hub.resolve(path, revision=revision, allow_download=allow_download))
    return path


_handed_out: set[int] = set()


def free_port(host: str = "127.0.0.1") -> int:
    """A free port on this machine, not handed out before in this process: interleaved
    sweeps start several servers before any of them binds."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((host if host not in ("0.0.0.0", "") else "127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in _handed_out:
            _handed_out.add(port)
            return port


def speculative_json(config: Config) -> str | None:
    """The ``--speculative-config`` value: compact JSON in a stable key order."""
    spec = config.spec
    if spec.method == "none":
        return None
    doc: dict[str, Any] = {"method": spec.method, "num_speculative_tokens": spec.depth}
    if spec.model:
        doc["model"] = spec.model
    if spec.prompt_lookup_min is not None:
        doc["prompt_lookup_min"] = spec.prompt_lookup_min
    if spec.prompt_lookup_max is not None:
        doc["prompt_lookup_max"] = spec.prompt_lookup_max
    if spec.moe_backend:
        doc["moe_backend"] = spec.moe_backend
    draft_backend = spec.attention_backend
    if draft_backend is None and config.attention.draft_backend:
        draft = config.attention.draft_backend
        draft_backend = config.attention.backend if draft == "same" else draft
    if draft_backend and draft_backend.lower() != "auto":
        doc["attention_backend"] = draft_backend.upper()
    if spec.draft_tensor_parallel_size is not None:
        doc["draft_tensor_parallel_size"] = spec.draft_tensor_parallel_size
    for key, value in spec.extra.items():
        doc[key] = value
    return json.dumps(doc, separators=(",", ":"))


def serve_args(config: Config, model_path: str, device: str, port: int) -> list[str]:
    """Flags after ``vllm serve``, in ``--flag=value`` form (as GPUStack and the seeds write them)."""
    s = config.server
    args = [model_path, f"--host={s.host}", f"--port={port}"]
    if config.model.served_name:
        args.append(f"--served-model-name={config.model.served_name}")
    if config.model.trust_remote_code:
        args.append("--trust-remote-code")
    if s.tensor_parallel_size != 1:
        args.append(f"--tensor-parallel-size={s.tensor_parallel_size}")
    if s.pipeline_parallel_size != 1:
        args.append(f"--pipeline-parallel-size={s.pipeline_parallel_size}")
    for name in (
        "max_model_len",
        "gpu_memory_utilization",
        "max_num_seqs",
        "max_num_batched_tokens",
        "kv_cache_dtype",
        "block_size",
    ):
        value = getattr(s, name)
        if value is not None:
            args.append(f"--{name.replace('_', '-')}={value}")
    eager = s.enforce_eager if s.enforce_eager is not None else device == "cpu"
    if eager:
        args.append("--enforce-eager")
    if config.attention.backend.lower() != "auto":
        args.append(f"--attention-backend={config.attention.backend.upper()}")
    spec = speculative_json(config)
    if spec:
        args.append(f"--speculative-config={spec}")
    args += list(s.extra_args)
    return args


def _cpu_env(config: Config) -> dict[str, str]:
    env = {
        "VLLM_CPU_KVCACHE_SPACE": f"{config.launcher.cpu_kv_cache_gib:g}",
        "VLLM_CPU_OMP_THREADS_BIND": config.launcher.cpu_omp_threads_bind,
    }
    s = config.server
    if s.tensor_parallel_size * s.pipeline_parallel_size == 1 and len(config.launcher.nodes) <= 1:
        # One worker: vLLM's CPU build would spawn it as a process of its own (its mp executor)
        # unless engine multiprocessing is off. Off, the worker runs inside the engine core,
        # as vLLM runs one GPU, and a start skips a process's import (~15 s of ~55 s on a 2-core
        # VM; decode speed unchanged). server.env.VLLM_ENABLE_V1_MULTIPROCESSING=1 restores it.
        env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    mode = config.launcher.intel_openmp
    lib = vllm_venv() / "lib" / "libiomp5.so"
    if mode == "on" or (mode == "auto" and lib.exists()):
        # vLLM warns that speculation on CPU loses much speed without Intel OpenMP preloaded.
        env["LD_PRELOAD"] = str(lib)
    return env


def build_plan(
    variant: Variant, *, device: str | None = None, port: int | None = None, resolve_model: bool = True
) -> LaunchPlan:
    """The LaunchPlan of a Variant, for ``device`` as found on the node that serves (the
    launcher knows how to ask it). ``port`` 0 (``server.port``'s default) leaves the port
    to the launcher. ``resolve_model=False`` leaves ``embedded:`` paths symbolic."""
    config = variant.config
    device = device or detect_device(config.launcher.device)
    model = config.model
    # a hub id resolves through this machine's cache only for a local launch
    resolve = resolve_model and (config.launcher.kind == "local" or not hub.is_hub_id(model.path))
    model_path = (
        resolve_model_path(model.path, allow_download=model.allow_download, revision=model.revision)
        if resolve
        else model.path
    )
    if port is None:
        port = config.server.port
    head_args = serve_args(config, model_path, device, port)
    vllm_cmd = resolve_vllm_command(config, device)

    env: dict[str, str] = {"HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}
    if config.launcher.dev_mode:
        env["VLLM_SERVER_DEV_MODE"] = "1"
    if device == "cpu":
        env.update(_cpu_env(config))
    env.update({k: str(v) for k, v in config.server.env.items()})

    nodes: list[NodePlan] = []
    configured = config.launcher.nodes
    addresses = [n.address or n.host for n in configured] or [config.server.host]
    if len(addresses) == 1:
        node_env = {**env, **(configured[0].env if configured else {})}
        host = configured[0].host if configured else config.server.host
        nodes.append(NodePlan(0, host, (*vllm_cmd, "serve", *head_args), node_env))
    else:
        multi = [
            f"--nnodes={len(addresses)}",
            f"--master-addr={addresses[0]}",
            f"--master-port={config.launcher.master_port}",
        ]
        for rank, node in enumerate(configured):
            node_env = {**env, **node.env}
            node_env.setdefault("VLLM_HOST_IP", addresses[rank])
            if rank == 0:
                argv = (*vllm_cmd, "serve", *head_args, *multi, "--node-rank=0")
            else:
                follower = [a for a in head_args if not a.startswith(("--host=", "--port="))]
                argv = (*vllm_cmd, "serve", *follower, *multi, f"--node-rank={rank}", "--headless")
            nodes.append(NodePlan(rank, node.host, argv, node_env))
    # Requests go to the head: to its cluster address when the API listens on every interface.
    api_host = config.server.host
    if configured and api_host in ("0.0.0.0", "", "::"):
        api_host = addresses[0]
    return LaunchPlan(
        label=variant.label,
        variant_hash=variant.hash,
        kind=config.launcher.kind,
        device=device,
        model_path=model_path,
        serve_args=tuple(nodes[0].argv[len(vllm_cmd) + 1 :]),
        nodes=tuple(nodes),
        api_host=api_host,
        api_port=port,
        served_model=config.model.served_name or model_path,
        notes=(*variant.notes, *device_notes(config, device)),
    )


# What vLLM's CPU platform runs whatever backend is asked for (vllm/platforms/cpu.py): any
# other name is replaced silently, so two such variants would run the same thing.
CPU_ATTENTION = frozenset({"AUTO", "CPU_ATTN", "CPU_MLA", "AMX_MLA"})


def device_notes(config: Config, device: str) -> tuple[str, ...]:
    """Requests the device cannot honour, said before launch rather than found after."""
    if device != "cpu":
        return ()
    notes = []
    asked = [("attention.backend", config.attention.backend)]
    if config.spec.method != "none" and config.spec.attention_backend:
        asked.append(("spec.attention_backend", config.spec.attention_backend))
    for key, backend in asked:
        if backend.upper() not in CPU_ATTENTION:
            notes.append(f"{key}: {backend.lower()} is not available on cpu; vLLM will use CPU_ATTN")
    return tuple(notes)


def launch_env(plan_env: dict[str, str]) -> dict[str, str]:
    """The full environment of a local launch: ours on top of the caller's."""
    return {**os.environ, **plan_env}
