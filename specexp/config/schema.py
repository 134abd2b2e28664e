"""Typed schema of a specexp configuration.

Registered in Hydra's ConfigStore as ``schema`` and listed first in
``conf/config.yaml``'s defaults, so every YAML file and every override is
checked against it at compose time: an unknown key or a wrong type fails with
the key's full name before anything launches. ``__post_init__`` holds the
checks types cannot express; it runs when ``OmegaConf.to_object`` builds the
dataclasses.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore

from specexp.launch.base import kinds as launcher_kinds

# Methods specexp knows how to configure; vLLM's own list is checked by validation.
SPEC_METHODS = frozenset(
    {"none", "ngram", "ngram_gpu", "mtp", "eagle", "eagle3", "draft_model", "suffix", "dflash"}
)
NEEDS_DRAFT_MODEL = frozenset({"eagle", "eagle3", "draft_model", "dflash"})
DEVICES = frozenset({"auto", "cpu", "cuda"})


@dataclass
class ModelConfig:
    """The target checkpoint: a folder, ``embedded:NAME`` (a model specexp builds itself) or a
    Hugging Face hub id ``org/name`` (from the local cache)."""

    name: str = "smollm2-135m-instruct"
    path: str = "embedded:smollm2-135m-instruct"
    served_name: str | None = None
    # Whether the checkpoint carries MTP / next-token layers (decides what spec.method=mtp means).
    has_mtp: bool = False
    trust_remote_code: bool = False
    # A path of the form org/name is a Hugging Face hub id, resolved through the local
    # cache; it is downloaded only when this is true (and HF_HUB_OFFLINE is unset).
    allow_download: bool = False
    revision: str | None = None  # hub ids: a branch, tag or commit (null: main)


@dataclass
class SpecConfig:
    """Speculative decoding; becomes one ``--speculative-config`` JSON argument."""

    method: str = "none"
    depth: int = 0  # the user's name for num_speculative_tokens
    model: str | None = None  # draft / eagle head checkpoint
    prompt_lookup_min: int | None = None
    prompt_lookup_max: int | None = None
    moe_backend: str | None = None
    attention_backend: str | None = None  # the draft's backend; vLLM never inherits the target's
    draft_tensor_parallel_size: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # any other SpeculativeConfig key
    # What spec.method=mtp becomes on a model without MTP layers (null: refuse).
    mtp_fallback: str | None = "ngram"

    def __post_init__(self) -> None:
        if self.method not in SPEC_METHODS and not self.method.endswith("_mtp"):
            raise ValueError(f"spec.method: {self.method!r} is not one of {', '.join(sorted(SPEC_METHODS))}")
        if self.method == "none" and self.depth != 0:
            raise ValueError(f"spec.depth={self.depth} needs a speculative method (spec.method=none)")
        if self.method != "none" and self.depth < 1:
            raise ValueError(f"spec.depth must be >= 1 for spec.method={self.method}")
        if self.method in NEEDS_DRAFT_MODEL and not self.model:
            raise ValueError(f"spec.model is required for spec.method={self.method}")
        lo, hi = self.prompt_lookup_min, self.prompt_lookup_max
        if lo is not None and hi is not None and lo > hi:
            raise ValueError(f"spec.prompt_lookup_min={lo} > spec.prompt_lookup_max={hi}")


@dataclass
class AttentionConfig:
    backend: str = "auto"  # auto = let vLLM choose; otherwise an AttentionBackendEnum name
    # Backend for the draft path: null = vLLM's choice, "same" = the target's backend.
    draft_backend: str | None = None


@dataclass
class ServerConfig:
    """``vllm serve`` flags specexp knows by name; anything else goes in ``extra_args``."""

    host: str = "127.0.0.1"
    port: int = 0  # 0 = a free port at launch
    block_size: int | None = None
    gpu_memory_utilization: float | None = None
    max_model_len: int | None = None
    kv_cache_dtype: str | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    enforce_eager: bool | None = None  # null = on for the CPU build, off on GPUs
    extra_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)  # per-variant env (NCCL_*, GLOO_*, ...)

    def __post_init__(self) -> None:
        if self.gpu_memory_utilization is not None and not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(f"server.gpu_memory_utilization={self.gpu_memory_utilization} is not in (0, 1]")
        for key in ("tensor_parallel_size", "pipeline_parallel_size"):
            if getattr(self, key) < 1:
                raise ValueError(f"server.{key} must be >= 1")
        if not 0 <= self.port < 65536:
            raise ValueError(f"server.port={self.port} is not a port")
        # a key on the command line is readable by every user of the node (ps) and would be
        # one missed redaction away from a record; the launcher hands it to vLLM privately
        if any(a == "--api-key" or a.startswith("--api-key=") for a in self.extra_args) or (
            "VLLM_API_KEY" in self.env
        ):
            raise ValueError(
                "server: the API key goes in an environment variable named by launcher.api_key_env "
                "(e.g. launcher.api_key_env=VLLM_KEY), not in server.extra_args or server.env"
            )


GPUSTACK_SOURCES = frozenset({"local_path", "huggingface", "model_scope"})
GPUSTACK_RESTORE = frozenset({"previous", "keep"})


@dataclass
class GpustackConfig:
    """``launcher=gpustack``: a model on a GPUStack v2 server, updated per variant.

    The API key comes from the variable named by ``launcher.api_key_env`` (never from here).
    """

    url: str | None = None  # the server, e.g. http://gpustack.lan (its /v2 API and /v1 OpenAI API)
    cluster: str = "default"  # cluster name or id
    model_name: str | None = None  # GPUStack model name; null = model.served_name, else model.name
    source: str = "local_path"  # local_path (model.path on the workers) | huggingface | model_scope
    backend: str = "vLLM"
    backend_version: str | None = None
    image_name: str | None = None  # a custom image (2.3.0 refuses it together with backend_version)
    replicas: int = 1
    placement_strategy: str | None = None  # spread | binpack
    worker_selector: dict[str, str] = field(default_factory=dict)
    gpu_ids: list[str] = field(default_factory=list)  # gpu_selector.gpu_ids, e.g. ["spark1:cuda:0"]
    gpus_per_replica: int | None = None
    distributed: bool | None = None  # distributed_inference_across_workers
    # previous: at the end of the sweep put the model back as it was before (delete it if the
    # sweep created it); keep: leave the last variant's config running (what deploy does).
    restore: str = "previous"
    # Read /metrics (acceptance), /server_info and the prefix-cache reset from the instance's
    # own address (worker_ip:port); GPUStack's proxy forwards only the OpenAI API.
    instance_direct: bool = True
    poll_interval_s: float = 2.0
    # With no worker in the cluster an instance can never start: fail after this long.
    no_worker_timeout_s: float = 120.0
    request_timeout_s: float = 30.0

    def __post_init__(self) -> None:
        if self.source not in GPUSTACK_SOURCES:
            raise ValueError(
                f"launcher.gpustack.source: {self.source!r} is not one of "
                f"{', '.join(sorted(GPUSTACK_SOURCES))}"
            )
        if self.restore not in GPUSTACK_RESTORE:
            raise ValueError(f"launcher.gpustack.restore: {self.restore!r} is not previous or keep")
        if self.replicas < 1:
            raise ValueError("launcher.gpustack.replicas must be >= 1")
        if self.placement_strategy not in (None, "spread", "binpack"):
            raise ValueError(
                f"launcher.gpustack.placement_strategy: {self.placement_strategy!r} is not spread or binpack"
            )
        if self.url is not None and not self.url.startswith(("http://", "https://")):
            raise ValueError(f"launcher.gpustack.url: {self.url!r} is not an http(s) URL")


@dataclass
class SshConfig:
    """How to reach the nodes; a node's own ``user``/``key``/``port`` win over these."""

    user: str | None = None  # null = the local user name
    key: str | None = None  # private key file; null = the default keys and the agent
    port: int = 22
    # known_hosts file for the nodes' host keys; null = ~/.ssh/known_hosts. Host keys are
    # always checked: an unknown node is an error naming the file to add it to.
    known_hosts: str | None = None
    connect_timeout_s: float = 15.0
    keepalive_s: float = 5.0  # a dropped connection is noticed after ~3 of these


@dataclass
class NodeConfig:
    """One machine of a multi-node launch (head first)."""

    host: str  # where SSH connects, and the node's address for vLLM unless ``address`` is set
    address: str | None = None  # the node's address on the cluster network (VLLM_HOST_IP, master)
    user: str | None = None
    key: str | None = None
    port: int | None = None
    name: str | None = None  # label in logs and messages (default node<rank>)
    # Per-node environment: GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME, NCCL_IB_HCA, VLLM_HOST_IP, ...
    env: dict[str, str] = field(default_factory=dict)


@dataclass
class LauncherConfig:
    kind: str = "local"  # a registered launcher (specexp.launch.base)
    device: str = "auto"  # auto: cuda when nvidia-smi answers (on the node that serves), else the CPU build
    vllm_command: list[str] = field(default_factory=list)  # empty = find it (see launch.plan)
    # Multi-node: the nodes, head first. ``hosts`` is the short form (addresses only) and
    # ``nnodes`` follows the list; with neither, one node on this machine.
    nodes: list[NodeConfig] = field(default_factory=list)
    nnodes: int = 1
    hosts: list[str] = field(default_factory=list)
    master_port: int = 29501  # 0 = a free port found on the head node
    ssh: SshConfig = field(default_factory=SshConfig)
    distributed_executor_backend: str = "mp"  # mp (vLLM's own multi-node mode) | ray
    ready_timeout_s: float = 900.0
    stop_timeout_s: float = 15.0
    # Host-memory gate: before each launch and every memory_check_s while it runs, every
    # node must have at least this much available memory, or the variant is stopped.
    min_available_gib: float = 3.0
    memory_check_s: float = 5.0
    # Startup-hang doctor: no new log line on any node for this long during startup ->
    # py-spy stacks, listening addresses, hostname resolution, Gloo interface (0 = off).
    stall_s: float = 120.0
    doctor_timeout_s: float = 60.0
    py_spy: list[str] = field(default_factory=lambda: ["py-spy"])  # on the nodes (e.g. [sudo, -n, py-spy])
    # NCCL bandwidth preflight (all_reduce_perf from nccl-tests, when the nodes have it).
    nccl_preflight: bool = False
    nccl_test_command: list[str] = field(
        default_factory=lambda: ["all_reduce_perf", "-b", "256M", "-e", "256M", "-g", "1"]
    )
    cpu_kv_cache_gib: float = 1.0
    cpu_omp_threads_bind: str = "nobind"
    intel_openmp: str = "auto"  # auto/on/off: LD_PRELOAD libiomp5 for the CPU build
    dev_mode: bool = True  # VLLM_SERVER_DEV_MODE=1: cache reset between trials, /server_info
    # Name of the environment variable holding the server's API key (vllm serve --api-key,
    # a GPUStack key, a protected endpoint): sent as a bearer token, never recorded.
    api_key_env: str | None = None
    base_url: str | None = None  # launcher=endpoint: the server someone else started
    gpustack: GpustackConfig = field(default_factory=GpustackConfig)

    def __post_init__(self) -> None:
        if self.kind not in launcher_kinds():
            raise ValueError(f"launcher.kind: {self.kind!r} is not one of {', '.join(launcher_kinds())}")
        if self.device not in DEVICES:
            raise ValueError(f"launcher.device: {self.device!r} is not one of {sorted(DEVICES)}")
        if self.intel_openmp not in ("auto", "on", "off"):
            raise ValueError(f"launcher.intel_openmp: {self.intel_openmp!r} is not auto/on/off")
        if self.distributed_executor_backend not in ("mp", "ray"):
            raise ValueError(
                f"launcher.distributed_executor_backend: {self.distributed_executor_backend!r} "
                "is not mp or ray"
            )
        if self.nodes and self.hosts:
            raise ValueError("launcher.nodes and launcher.hosts both list the nodes: keep one")
        if self.hosts and not self.nodes:
            self.nodes = [NodeConfig(host=h) for h in self.hosts]
        if self.nodes and self.nnodes not in (1, len(self.nodes)):
            raise ValueError(
                f"launcher.nodes lists {len(self.nodes)} nodes for launcher.nnodes={self.nnodes}"
            )
        if self.nodes:
            self.nnodes = len(self.nodes)
        if self.nnodes < 1:
            raise ValueError("launcher.nnodes must be >= 1")
        if self.nnodes > 1 and not self.nodes:
            raise ValueError(f"launcher.nnodes={self.nnodes} needs launcher.nodes (or launcher.hosts)")
        if not 0 <= self.master_port < 65536:
            raise ValueError(f"launcher.master_port={self.master_port} is not a port")
        if self.min_available_gib < 0 or self.memory_check_s <= 0:
            raise ValueError("launcher.min_available_gib must be >= 0 and launcher.memory_check_s > 0")
        if self.stall_s < 0:
            raise ValueError("launcher.stall_s must be >= 0 (0 = no stall detection)")
        names = [n.name for n in self.nodes if n.name]
        if len(names) != len(set(names)):
            raise ValueError(f"launcher.nodes: node names repeat ({', '.join(names)})")

    def node_name(self, rank: int) -> str:
        name = self.nodes[rank].name if rank < len(self.nodes) else None
        return name or f"node{rank}"


@dataclass
class CaseConfig:
    """One measured scenario: how many streams at once, how many requests, how long."""

    concurrency: int = 1
    # Requests per trial, taken from the workload as whole conversations; null: every
    # request of the workload, in file order.
    num_prompts: int | None = 2
    max_tokens: int = 128
    # Exact prompt length in tokens (chat template included), built with the model's
    # tokenizer from realistic text; null = the workload's own prompts.
    prompt_tokens: int | None = None
    # This case's prompt set (a workload slice, e.g. smart_home); null = bench.workload
    workload: str | None = None
    # Always generate max_tokens (vLLM's ignore_eos). Only for matching another tool's
    # fixed-length grid: a small model then loops, and the degenerate-output guard says so.
    ignore_eos: bool = False
    # Open loop: requests arrive at this rate (per second) whether or not the server is
    # done, instead of `concurrency` streams. Gaps are gamma-distributed with shape
    # `burstiness` (1: Poisson; <1 burstier; .inf: even), seeded per trial, as vllm bench
    # serve draws them. timing: trace replays the workload file's own timestamps instead.
    request_rate: float | None = None
    burstiness: float = 1.0
    timing: str | None = None  # null (closed loop or request_rate) or "trace"
    max_concurrency: int | None = None  # open loop: cap on requests open at once (null: none)

    def __post_init__(self) -> None:
        if (
            self.concurrency < 1
            or (self.num_prompts is not None and self.num_prompts < 1)
            or self.max_tokens < 1
        ):
            raise ValueError("bench.cases: concurrency, num_prompts and max_tokens must be >= 1")
        if self.prompt_tokens is not None and self.prompt_tokens < 1:
            raise ValueError("bench.cases: prompt_tokens must be >= 1")
        if self.request_rate is not None and not self.request_rate > 0:
            raise ValueError(f"bench.cases: request_rate={self.request_rate} must be > 0")
        if not self.burstiness > 0:
            raise ValueError(f"bench.cases: burstiness={self.burstiness} must be > 0")
        if self.timing not in (None, "trace"):
            raise ValueError(f"bench.cases: timing={self.timing!r} is not trace (or null)")
        if self.timing == "trace" and self.request_rate is not None:
            raise ValueError("bench.cases: timing=trace replays the file's timestamps; drop request_rate")
        if self.max_concurrency is not None:
            if self.max_concurrency < 1:
                raise ValueError("bench.cases: max_concurrency must be >= 1")
            if self.request_rate is None and self.timing is None:
                raise ValueError("bench.cases: max_concurrency caps open loop (request_rate or timing=trace)")
        if self.prompt_tokens is not None and self.timing == "trace":
            raise ValueError("bench.cases: prompt_tokens prompts have no timestamps for timing=trace")


@dataclass
class SloConfig:
    """Objectives a request must meet to count towards goodput (null: not checked)."""

    ttft_ms: float | None = None
    itl_ms: float | None = None  # the request's mean inter-token gap (vLLM's TPOT)

    def __post_init__(self) -> None:
        for key in ("ttft_ms", "itl_ms"):
            value = getattr(self, key)
            if value is not None and not value > 0:
                raise ValueError(f"bench.slo.{key}={value} must be > 0")


@dataclass
class BenchConfig:
    trials: int = 5  # per look; seed 000: one trial said 3.1 tok/s, five said 6.7 [6.4-10.2]
    # Adaptive trials: while a case has no clear verdict against the baseline, add another
    # batch of `trials`, up to this many (0 = off). Confidence is split over the looks.
    max_trials: int = 0
    # Adaptive trials stop on precision too: a case is done once its ratio's interval is at
    # most this wide (0.10: about ±5 %), clear verdict or not (null: only a verdict stops).
    target_width: float | None = None
    # sequential: one server at a time, all its trials in a row. interleaved: every
    # variant's server up at once, one trial of each per round, so slow drift of the
    # machine lands on all variants alike (needs memory for all servers together).
    order: str = "sequential"
    # Server launches per variant, trials nested in them (bench.trials per launch). One
    # launch's trials share its startup luck; with 2+ a verdict must hold in every launch.
    launches: int = 1
    # interleaved only: freeze (SIGSTOP) every server but the one measuring. A waiting vLLM
    # CPU server is not idle (its engine loop polls: 25 % of a core here), so unfrozen it
    # slows the one measuring. auto = on when the servers run on CPU.
    freeze_idle: str = "auto"
    warmup_requests: int = 1
    temperature: float = 0.0
    seed: int = 0
    workload: str = "copy_edit"
    request_timeout_s: float = 300.0
    reset_prefix_cache: bool = True  # between trials, so trial 1 is not the only cold one
    # A case whose outputs loop gets no winner (prompt lookup "accepts" the repetition, so
    # the speed-up is not real); true names one anyway, for workloads that loop on purpose.
    trust_loops: bool = False
    # One case per slice label of a case's workload file (named <case>.<slice>)
    split_by_slice: bool = False
    # Service-level objectives for goodput (requests/s meeting all of them)
    slo: SloConfig = field(default_factory=SloConfig)
    # Filled by conf/bench/*.yaml (default: single + concurrent4). Empty here so a bench
    # file replaces the set of cases instead of merging into a built-in one.
    cases: dict[str, CaseConfig] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.trials < 1:
            raise ValueError(f"bench.trials={self.trials} must be >= 1")
        if self.launches < 1:
            raise ValueError(f"bench.launches={self.launches} must be >= 1")
        if self.max_trials and self.max_trials < self.trials:
            raise ValueError(f"bench.max_trials={self.max_trials} is below bench.trials={self.trials}")
        if self.target_width is not None:
            if not self.target_width > 0:
                raise ValueError(f"bench.target_width={self.target_width} must be > 0")
            if self.max_trials <= self.trials:
                raise ValueError(
                    f"bench.target_width needs bench.max_trials above bench.trials={self.trials} "
                    "(the cap on the trials added to reach it)"
                )
        if self.order not in ("sequential", "interleaved"):
            raise ValueError(f"bench.order: {self.order!r} is not sequential or interleaved")
        if self.freeze_idle not in ("auto", "on", "off"):
            raise ValueError(f"bench.freeze_idle: {self.freeze_idle!r} is not auto, on or off")
        if self.temperature < 0:
            raise ValueError("bench.temperature must be >= 0")


@dataclass
class TrackingConfig:
    enabled: bool = True
    uri: str | None = None  # null = sqlite:///<workdir>/mlflow.db
    artifact_dir: str | None = None  # null = <workdir>/mlruns
    experiment: str = "specexp"


@dataclass
class CheckpointConfig:
    """Preflight of the target checkpoint for methods that load MTP layers from it."""

    preflight: bool = True  # scan safetensors headers for BF16 MTP layers the config would quantize
    autofix: bool = False  # append the missing ignore patterns (with a backup) instead of stopping


@dataclass
class SuiteConfig:
    """The functional regression suite every variant answers before its benchmarks."""

    name: str = "none"
    fail_fast: bool = False  # a variant with a regression stops before its benchmarks
    timeout_s: float = 120.0  # per request
    code_timeout_s: float = 10.0  # per code-execution check, in the sandbox
    # case name -> {messages, check, max_tokens, tools, requires, ...}; validated by
    # specexp.suite.cases so a typo names the case and the field
    cases: dict[str, Any] = field(default_factory=dict)


@dataclass
class SweepConfig:
    baseline: bool = True  # add the no-speculation variant of every configuration
    results_dir: str = "results"
    name: str | None = None
    # Measure each baseline twice, the copy as a variant against the original: an A/A check
    # (a verdict between identical configurations is a false winner).
    aa: bool = False
    # Check every launch plan with the installed vLLM's own parser before anything starts
    # (off: when this machine's vLLM is not the one that serves, and its verdict misleads).
    validate: bool = True


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    spec: SpecConfig = field(default_factory=SpecConfig)
    attention: AttentionConfig = field(default_factory=AttentionConfig)
    server: ServerConfig = field(default_factory=ServerConfig)
    launcher: LauncherConfig = field(default_factory=LauncherConfig)
    bench: BenchConfig = field(default_factory=BenchConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    suite: SuiteConfig = field(default_factory=SuiteConfig)
    sweep: SweepConfig = field(default_factory=SweepConfig)


def register() -> None:
    ConfigStore.instance().store(name="schema", node=Config)
