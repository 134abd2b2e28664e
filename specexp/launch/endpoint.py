"""Measure a server someone else started: nothing is started or stopped.

Users check production this way (the seed's production server had drifted from the
A/B's choice), and every peer client can. The effective configuration is read from the
server itself, like for every launcher.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import httpx

from specexp.errors import ConfigError, LaunchError
from specexp.launch.base import (
    EffectiveConfig,
    Endpoint,
    StartStopContext,
    StartupTiming,
    api_key_from_env,
)
from specexp.launch.effective import read_effective

if TYPE_CHECKING:
    from specexp.config.schema import LauncherConfig
    from specexp.launch.plan import LaunchPlan


class EndpointLauncher(StartStopContext):
    kind: ClassVar[str] = "endpoint"

    def __init__(
        self,
        plan: LaunchPlan,
        base_url: str,
        *,
        model: str | None = None,
        tokenizer: str | None = None,
        api_key: str | None = None,
        ready_timeout_s: float = 60.0,
    ) -> None:
        self.plan = plan
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.tokenizer = tokenizer
        self.api_key = api_key
        self.ready_timeout_s = ready_timeout_s
        self.startup = StartupTiming()
        self.substitutions: list[str] = []

    @classmethod
    def from_plan(cls, plan: LaunchPlan, config: LauncherConfig, log_dir: Path) -> EndpointLauncher:
        if not config.base_url:
            raise ConfigError("launcher=endpoint needs launcher.base_url (the server to measure)")
        served = plan.served_model if plan.served_model != plan.model_path else None
        return cls(
            plan,
            config.base_url,
            model=served,
            tokenizer=plan.model_path if Path(plan.model_path).is_dir() else None,
            api_key=api_key_from_env(config.api_key_env),
            ready_timeout_s=min(config.ready_timeout_s, 120.0),
        )

    def start(self) -> None:
        """Nothing to start: the server is someone else's."""

    def wait_ready(self) -> Endpoint:
        """The server must answer ``/v1/models``; its first model is the one measured unless
        the config names one."""
        t0 = time.perf_counter()
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        last = "no answer"
        with httpx.Client(timeout=5.0, headers=headers) as client:
            while time.perf_counter() - t0 < self.ready_timeout_s:
                try:
                    resp = client.get(f"{self.base_url}/v1/models")
                    if resp.status_code == 200:
                        ids = [m.get("id") for m in resp.json().get("data") or []]
                        model = self.model or (ids[0] if ids else None)
                        if model is None:
                            raise LaunchError(f"{self.base_url} serves no model (/v1/models is empty)")
                        self.startup = StartupTiming(ready_s=round(time.perf_counter() - t0, 3))
                        return Endpoint(self.base_url, model, self.tokenizer, api_key=self.api_key)
                    last = f"HTTP {resp.status_code}"
                    if resp.status_code in (401, 403):
                        break  # a wrong key does not get better by waiting
                except (httpx.HTTPError, ValueError) as exc:
                    last = type(exc).__name__
                time.sleep(1.0)
        raise LaunchError(f"endpoint {self.base_url} does not answer /v1/models ({last})")

    def logs(self) -> dict[str, Path]:
        return {}

    def move_logs(self, folder: Path) -> None:
        """No logs: the server's output is where its owner keeps it."""

    def effective_config(self, endpoint: Endpoint) -> EffectiveConfig:
        return read_effective(endpoint)

    def failure(self) -> str | None:
        return None

    def request_stop(self) -> None:
        """Never stops a server it did not start."""

    def stop(self) -> None:
        """Never stops a server it did not start."""
