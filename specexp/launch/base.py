"""The launcher contract every way of starting vLLM implements (local, multi-node, GPUStack).

A launcher knows nothing about benchmarks: it takes a LaunchPlan, returns an
Endpoint once the server answers, and guarantees that ``stop()`` (also on
error or Ctrl-C, through the context manager) leaves no process behind.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Protocol, Self


@dataclass(frozen=True)
class Endpoint:
    base_url: str
    model: str  # the name requests must use
    tokenizer: str | None = None  # a local path to the model's tokenizer, when there is one

    @property
    def metrics_url(self) -> str:
        return f"{self.base_url}/metrics"


@dataclass
class StartupTiming:
    """Seconds from process start to each startup phase seen in the server log, and to ready."""

    ready_s: float | None = None
    phases: dict[str, float] = field(default_factory=dict)


class Launcher(Protocol):
    startup: StartupTiming
    log_path: Path

    def start(self) -> None: ...

    def wait_ready(self) -> Endpoint: ...

    def stop(self) -> None: ...

    def __enter__(self) -> Self: ...

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...
