from __future__ import annotations

import json
from pathlib import Path
from typing import cast

import httpx

from specexp.config.compose import plan_sweep
from specexp.launch.base import Launcher
from specexp.run.variant import run_variant
from tests.launch.test_local import alive, worker_pid
from tests.run.helpers import SMALL, session


def test_a_server_error_mid_measurement_fails_the_variant_and_keeps_its_files(tmp_path: Path) -> None:
    (variant,) = plan_sweep(["spec=none", *SMALL], with_baseline=False)
    s = session(variant, tmp_path / "v", "metrics500")
    result = run_variant(s, None)
    assert result.status == "failed"
    assert result.error is not None and result.error.startswith("HTTPStatusError")
    assert result.ready_s is not None  # it got as far as ready
    saved = json.loads((tmp_path / "v" / "result.json").read_text())
    assert saved["status"] == "failed"
    assert not alive(worker_pid(tmp_path / "v" / "server.log"))
    assert {"config.yaml", "launch.json", "server.log", "result.json"} <= {
        p.name for p in (tmp_path / "v").iterdir()
    }


def test_the_effective_configuration_is_read_back_after_ready(tmp_path: Path) -> None:
    (variant,) = plan_sweep(["spec=none", "bench.trials=1", *SMALL], with_baseline=False)
    result = run_variant(session(variant, tmp_path / "v"), None)
    assert result.status == "ok", result.error
    # the fake logs that FLASHINFER cannot run on CPU: the backend that really ran is recorded
    assert result.effective["attention.backend"] == "CPU_ATTN"
    assert result.effective_sources["attention.backend"].startswith("server log")
    assert result.effective["process.cmdline"][1].endswith("fake_vllm_process.py")


def test_launches_nest_trials_and_each_launch_is_a_fresh_server(tmp_path: Path) -> None:
    (variant,) = plan_sweep(["spec=none", "bench.trials=2", *SMALL], with_baseline=False)
    result = run_variant(session(variant, tmp_path / "v"), None, launches=2)
    assert result.status == "ok", result.error
    trials = result.cases["single"].trials
    assert [(t.trial, t.launch) for t in trials] == [(0, 0), (1, 0), (2, 1), (3, 1)]
    assert len(result.launch_ready_s) == 2
    first, second = (
        worker_pid(tmp_path / "v" / "server.log"),
        worker_pid(tmp_path / "v" / "launch-1" / "server.log"),
    )
    assert first != second and not alive(first) and not alive(second)


def test_fail_fast_stops_a_regressing_variant_before_its_benchmarks(tmp_path: Path) -> None:
    base_v, spec_v = plan_sweep(["spec=ngram", "bench.trials=1", *SMALL, "suite.fail_fast=true"])
    for v in (base_v, spec_v):  # a one-case suite (Hydra cannot replace a typed dict from the CLI)
        v.config.suite.cases = {
            "capital": {
                "messages": [{"role": "user", "content": "capital?"}],
                "check": {"kind": "exact", "expected": "Paris"},
            }
        }
    base = run_variant(session(base_v, tmp_path / "0"), None)
    assert base.status == "ok" and base.suite is not None and base.suite.passed == 1
    spec = run_variant(session(spec_v, tmp_path / "1", "serve-wrong"), base)
    assert spec.status == "failed" and spec.cases == {}
    assert spec.error == "suite none: 1 regression(s) (capital); benchmarks skipped (suite.fail_fast=true)"
    saved = json.loads((tmp_path / "1" / "suite.json").read_text())
    assert saved["cases"][0]["regression"] is True and saved["cases"][0]["output"] == "Lyon"
    assert saved["cases"][0]["first_divergence"] == 0


class _DyingLauncher:
    """A server whose exit the launcher sees only after ``polls_before_exit`` looks, as when
    its sockets closed (the client's connection error) before the process could be collected."""

    def __init__(self, polls_before_exit: int) -> None:
        self.polls = 0
        self.polls_before_exit = polls_before_exit

    def failure(self) -> str | None:
        self.polls += 1
        return "vllm serve killed by SIGKILL: no output" if self.polls > self.polls_before_exit else None


def test_a_connection_error_waits_for_the_servers_own_reason(tmp_path: Path) -> None:
    (variant,) = plan_sweep(["spec=none", *SMALL], with_baseline=False)
    s = session(variant, tmp_path / "v")
    dying = _DyingLauncher(polls_before_exit=3)
    s.launcher = cast(Launcher, dying)
    s.fail(httpx.ReadError(""))
    assert s.result.status == "failed" and s.result.error == "vllm serve killed by SIGKILL: no output"
    # an error that is not about the connection does not wait for a server that is alive
    s2 = session(variant, tmp_path / "w")
    alive_server = _DyingLauncher(polls_before_exit=10**9)
    s2.launcher = cast(Launcher, alive_server)
    s2.fail(ValueError("bad value"))
    assert s2.result.error == "ValueError: bad value" and alive_server.polls == 1
