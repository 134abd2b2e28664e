"""``deploy``: a recommended config put into service and checked live, with any launcher.

Local: the fake vLLM process as ``launcher.vllm_command`` (it reports speculative depth
through the same ``/metrics`` counters vLLM has, ``FAKE_VLLM_SPEC_DEPTH``). GPUStack: the
replayed server of ``tests/launch/test_gpustack.py``. Real GPUStack: ``tests/e2e/test_gpustack_real.py``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from specexp.cli import main
from tests.launch.test_gpustack import KEY, KEY_ENV, replay
from tests.run.test_sweep import FAKE

LOCAL = [f"launcher.vllm_command=[{sys.executable},{FAKE}]", "--no-validate", "--verify-then-stop"]


def deploy(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = main(["deploy", *args])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def test_local_deploy_verifies_the_depth_on_the_servers_metrics(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = deploy(
        capsys, "cpu_demo", "--launcher", "local", *LOCAL, "+server.env.FAKE_VLLM_SPEC_DEPTH=3"
    )
    assert code == 0, out
    assert "spec.depth" in out and "verified: ngram-k3 runs as the file says" in out


def test_local_deploy_that_runs_another_depth_is_drift_exit_1(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = deploy(capsys, "cpu_demo", *LOCAL, "+server.env.FAKE_VLLM_SPEC_DEPTH=2")
    assert code == 1
    assert "drift: what runs differs from the experiment file (spec.depth)" in out


def test_deploy_takes_an_experiment_file_from_anywhere(
    workdir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    file = tmp_path / "recommended.yaml"
    file.write_text(
        "# @package _global_\ndefaults:\n  - override /spec: ngram\nspec:\n  depth: 2\n", encoding="utf-8"
    )
    code, out = deploy(capsys, str(file), *LOCAL, "+server.env.FAKE_VLLM_SPEC_DEPTH=2")
    assert code == 0, out
    assert "ngram-k2" in out


def test_deploy_refuses_a_sweep_in_one_line(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out = deploy(capsys, "cpu_demo", *LOCAL, "spec.depth=2,3")
    assert code == 2
    assert out.strip() == "specexp: error: deploy takes one configuration; these overrides make 2"


def test_gpustack_deploy_leaves_the_model_in_service_verified(
    workdir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Replay: GPUStack 2.3.0's recorded answers; the instance is the fake vLLM at depth 3."""
    monkeypatch.setenv(KEY_ENV, KEY)
    with replay(tmp_path, depth=3) as setup:
        args = [
            "cpu_demo",
            "--launcher",
            "gpustack",
            "--no-validate",
            f"launcher.api_key_env={KEY_ENV}",
            f"launcher.gpustack.url={setup.fake.url}",
            "launcher.gpustack.poll_interval_s=0.1",
        ]
        code, out = deploy(capsys, *args)
        assert code == 0, out
        assert "gpustack.backend_parameters" in out and "verified" in out
        (model,) = setup.fake.models.values()  # kept in service, not put back
        assert '--speculative-config={"method":"ngram","num_speculative_tokens":3' in " ".join(
            model["backend_parameters"]
        )
        code, out = deploy(capsys, *args, "spec.depth=5")  # the file says 5, the instance runs 3
        assert code == 1
        assert "drift" in out and "spec.depth" in out
    for path in workdir.rglob("*"):
        if path.is_file():
            assert KEY not in path.read_text(errors="replace"), path
