from __future__ import annotations

import json
from pathlib import Path

from specexp.config.compose import plan_sweep
from specexp.sweep import _run_variant
from tests.launch.test_local import alive, fake_plan, worker_pid


def test_a_server_error_mid_measurement_fails_the_variant_not_the_sweep(tmp_path: Path) -> None:
    (variant,) = plan_sweep(["spec=none", "bench.warmup_requests=0"], with_baseline=False)
    plan = fake_plan("metrics500")
    messages: list[str] = []
    result = _run_variant(variant, plan, tmp_path / "v", None, None, messages.append)
    assert result.status == "failed"
    assert result.error is not None and result.error.startswith("HTTPStatusError")
    assert result.ready_s is not None  # it got as far as ready
    saved = json.loads((tmp_path / "v" / "result.json").read_text())
    assert saved["status"] == "failed"
    assert not alive(worker_pid(tmp_path / "v" / "server.log"))
    assert {"config.yaml", "launch.json", "server.log", "result.json"} <= {
        p.name for p in (tmp_path / "v").iterdir()
    }


def test_a_reused_sweep_name_never_overwrites_earlier_results(workdir: Path) -> None:
    from rich.console import Console

    from specexp.sweep import run_sweep

    first = workdir / "results" / "same"
    first.mkdir(parents=True)
    (first / "sweep.json").write_text("{}")
    (variant,) = plan_sweep(
        [
            "spec=none",
            "tracking=none",
            "model.path=/nonexistent/model",
            "launcher.vllm_command=[/nonexistent/vllm]",
        ],
        with_baseline=False,
    )
    outcome = run_sweep([variant], Console(file=open("/dev/null", "w")), name="same")  # noqa: SIM115
    assert outcome.directory.name == "same-2" and outcome.result.name == "same-2"
    assert (first / "sweep.json").read_text() == "{}"
    assert outcome.result.variants[0].status == "failed"  # the launch itself failed, and says why
    assert "cannot start /nonexistent/vllm" in (outcome.result.variants[0].error or "")
