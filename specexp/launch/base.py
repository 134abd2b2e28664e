"""The launcher contract every way of starting vLLM implements, and the registry of kinds.

A launcher knows nothing about benchmarks: it takes a LaunchPlan, returns an
Endpoint once the server answers, reads back what really runs, and guarantees
that ``stop()`` (also on error or Ctrl-C, through the context manager) leaves no
process behind on any node. The orchestration calls only what is declared here;
freezing idle servers (interleaved order on CPU) is an optional capability a
launcher declares by implementing ``Pausable``; a launcher whose progress has states
worth showing implements ``ReportsProgress``. A launcher class may also offer
``sweep_scope(report)``, a context manager the sweep holds around all its variants
(GPUStack: the model is put back as it was once, after the last variant), and
``describe(plan, config)``, extra lines for ``--dry-run`` (GPUStack: the request body),
and ``check_config(config)``, what a launch needs, checked before anything starts.

Launchers are found by ``launcher.kind`` in a registry of import paths, so adding
one is a new module plus one line, and the contract tests
(``tests/launch/test_contract.py``) run against it like against every other.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, Self, runtime_checkable

from specexp.errors import ConfigError, LaunchError

if TYPE_CHECKING:
    from specexp.config.schema import LauncherConfig
    from specexp.launch.plan import LaunchPlan


@dataclass(frozen=True)
class Endpoint:
    """Where to send requests. The API key is read from the environment when the endpoint
    is made and sent as a bearer token by every client; it is never part of a record."""

    base_url: str
    model: str  # the name requests must use
    tokenizer: str | None = None  # a local path to the model's tokenizer, when there is one
    api_key: str | None = field(default=None, repr=False, compare=False)
    # The vLLM server's own address when requests go through a proxy that forwards only the
    # OpenAI API (GPUStack): /metrics, /server_info and the prefix-cache reset are read there.
    control_url: str | None = None

    @property
    def control_base(self) -> str:
        return self.control_url or self.base_url

    @property
    def metrics_url(self) -> str:
        return f"{self.control_base}/metrics"

    def headers(self) -> dict[str, str]:
        return bearer(self.api_key)


def bearer(api_key: str | None) -> dict[str, str]:
    """The header every client sends when there is a key (none otherwise): one place, so no
    client path can forget or spell it differently."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def api_key_from_env(var: str | None) -> str | None:
    """The key behind ``launcher.api_key_env``; a named variable that is unset is an error,
    because every request would then fail with 401 after a long start."""
    if not var:
        return None
    key = os.environ.get(var)
    if not key:
        raise ConfigError(f"launcher.api_key_env={var}: the environment variable {var} is not set")
    return key


@dataclass
class StartupTiming:
    """Seconds from process start to each startup phase seen in the server log, and to ready.
    ``nodes`` holds the same per node for launchers that run several. ``prepare_s`` is the
    launcher's own time before the server process started (ports, SSH connections, the memory
    gate): with the health poll after vLLM's "startup complete" it is what the launcher adds
    to vLLM's own start."""

    ready_s: float | None = None
    phases: dict[str, float] = field(default_factory=dict)
    nodes: dict[str, dict[str, float]] = field(default_factory=dict)
    prepare_s: float | None = None

    @property
    def overhead_s(self) -> float | None:
        """The launcher's time on top of vLLM's own start: preparing, then noticing readiness."""
        if self.prepare_s is None:
            return None
        return round(self.prepare_s + self.phases.get("health_s", 0.0), 3)


@dataclass(frozen=True)
class EffectiveConfig:
    """What the running server says it runs, flattened (``spec.method``, ``spec.depth``,
    ``attention.backend``, ``cache.block_size``, ...), and where each value was read."""

    values: dict[str, Any] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)  # key -> where it was read
    notes: tuple[str, ...] = ()

    def fingerprint(self) -> dict[str, Any]:
        """The values that decide what is computed: equal fingerprints mean the same run."""
        return {k: v for k, v in self.values.items() if not k.startswith(_UNCOMPARED)}


# Values that differ between launches of the same configuration.
_UNCOMPARED = ("server.", "process.", "model.path")


class Launcher(Protocol):
    """One variant's server, on however many nodes. Used as a context manager."""

    kind: ClassVar[str]
    plan: LaunchPlan  # as launched: ports decided on the node that serves
    startup: StartupTiming
    substitutions: list[str]  # log lines where the server ran something other than asked

    def start(self) -> None:
        """Begin the launch and return without waiting for readiness."""

    def wait_ready(self) -> Endpoint:
        """Block until the server answers (or raise LaunchError with the reason)."""

    def logs(self) -> dict[str, Path]:
        """Every node's log on this machine, by node name (``server`` for one node)."""

    def move_logs(self, folder: Path) -> None:
        """Go on logging into ``folder`` with what was logged so far."""

    def effective_config(self, endpoint: Endpoint) -> EffectiveConfig:
        """Read back what really runs (the config in the file is not the config that runs)."""

    def failure(self) -> str | None:
        """Why the server is gone, if it is (exit status or signal, and its last log line)."""

    def request_stop(self) -> None:
        """Ask every node to shut down without waiting, so several servers wind down together."""

    def stop(self) -> None:
        """Stop every process on every node; idempotent."""

    def __enter__(self) -> Self: ...

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...


class StartStopContext:
    """``with launcher:`` starts it and stops it however the block is left."""

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


@runtime_checkable
class Pausable(Protocol):
    """Servers whose processes can be frozen while another is measured (a waiting vLLM CPU
    server still polls and takes CPU from the one being measured)."""

    def freeze(self) -> None: ...

    def thaw(self) -> None: ...


class HostMemoryLow(LaunchError):
    """A node's available memory fell below ``launcher.min_available_gib`` (before the launch
    or while it ran): the variant is stopped cleanly, and the next one starts only when
    every node is back above the line (its own gate says so)."""

    def __init__(self, node: str, available_gib: float, threshold_gib: float, when: str) -> None:
        self.node, self.available_gib, self.threshold_gib = node, available_gib, threshold_gib
        super().__init__(
            f"memory gate: {node} has {available_gib:.2f} GiB available, below "
            f"launcher.min_available_gib={threshold_gib:g} ({when}); every node stopped"
        )

    @property
    def figure(self) -> str:
        return f"{self.node}: {self.available_gib:.2f} GiB < {self.threshold_gib:g} GiB"


@runtime_checkable
class Guarded(Protocol):
    """Launchers that watch their hosts while a server runs (free memory on every node) and
    stop it when a guard trips; ``tripped()`` says which node and the figure."""

    def tripped(self) -> HostMemoryLow | None: ...


@runtime_checkable
class ReportsProgress(Protocol):
    """Launchers that report startup progress themselves (per-node phases of a multi-node
    start) through the sweep's progress line."""

    def on_progress(self, say: Callable[[str], None]) -> None: ...


class LauncherFactory(Protocol):
    def __call__(self, plan: LaunchPlan, config: LauncherConfig, log_dir: Path) -> Launcher: ...


# kind -> "module:attribute"; imported on first use so a kind's dependencies (asyncssh,
# a GPUStack client) load only when that kind runs.
_REGISTRY: dict[str, str] = {
    "local": "specexp.launch.local:LocalLauncher",
    "endpoint": "specexp.launch.endpoint:EndpointLauncher",
    "multinode": "specexp.launch.multinode:MultinodeLauncher",
    "gpustack": "specexp.launch.gpustack:GpustackLauncher",
}


def register(kind: str, target: str) -> None:
    _REGISTRY[kind] = target


def kinds() -> list[str]:
    return sorted(_REGISTRY)


def launcher_class(kind: str) -> Any:
    """The class registered for ``kind``; a wrong kind is one line listing the kinds."""
    target = _REGISTRY.get(kind)
    if target is None:
        raise ConfigError(f"launcher.kind: {kind!r} is not one of {', '.join(kinds())}")
    module, _, attr = target.partition(":")
    try:
        return getattr(importlib.import_module(module), attr)
    except ModuleNotFoundError as exc:
        if exc.name != module:
            raise
        raise ConfigError(f"launcher.kind={kind} is not available in this build (no {module})") from None


def check_launcher(config: LauncherConfig) -> None:
    """What any launch needs, checked before anything starts: the kind's own needs (the
    server to reach first), then that the key's variable is set (else every request would
    get 401 after a long start)."""
    check = getattr(launcher_class(config.kind), "check_config", None)
    if check is not None:
        check(config)
    api_key_from_env(config.api_key_env)


def target_device(config: LauncherConfig, *, connect: bool = True) -> str | None:
    """The device of the node that serves, for planning: ``launcher.device`` unless auto;
    for launchers whose nodes are elsewhere, asked there (``detect_device`` on the class).
    None: decide on this machine (local launches, or a dry run that must not connect)."""
    if config.device != "auto":
        return config.device
    probe = getattr(launcher_class(config.kind), "detect_device", None)
    if probe is None or not connect:
        return None
    device: str = probe(config)
    return device


def create_launcher(plan: LaunchPlan, config: LauncherConfig, log_dir: Path) -> Launcher:
    factory: LauncherFactory = launcher_class(plan.kind).from_plan
    return factory(plan, config, log_dir)
