"""``verify``: the live configuration (server answers, the local process) against a
recommendation; a fake server process stands in for vLLM (its command line and
environment are real, read through psutil)."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from specexp.config.compose import plan_sweep
from specexp.errors import LaunchError
from specexp.launch.base import EffectiveConfig
from specexp.launch.local import LocalLauncher
from specexp.launch.plan import build_plan, free_port
from specexp.launch.verify import compare, expected_from_variant, from_cmdline, listening_pid, read_live
from specexp.paths import conf_dir
from tests.helpers import REPO, run_cli

FAKE = REPO / "tests" / "fakes" / "fake_vllm_process.py"


def test_command_line_flags_in_both_forms() -> None:
    argv = [
        "python",
        "vllm_entry.py",
        "serve",
        "/models/m",
        '--speculative-config={"method":"ngram","num_speculative_tokens":3,"prompt_lookup_min":2}',
        "--block-size",
        "32",
        "--max-num-seqs=8",
        "--attention-backend=flashinfer",
    ]
    got = from_cmdline(argv)
    assert got["spec.method"] == "ngram" and got["spec.depth"] == 3 and got["spec.prompt_lookup_min"] == 2
    assert got["cache.block_size"] == "32" and got["scheduler.max_num_seqs"] == "8"
    assert got["attention.backend"] == "FLASHINFER" and got["spec.enabled"] is True
    assert from_cmdline(["vllm", "serve", "/m"])["spec.enabled"] is False


def test_the_most_direct_source_decides_and_disagreement_is_shown() -> None:
    live = EffectiveConfig(
        values={
            "spec.depth": 3,
            "process:spec.depth": 5,
            "cache.block_size": 16,
            "process.env.NCCL_ALGO": "Ring",
        },
        sources={
            "spec.depth": "/metrics",
            "cache.block_size": "/metrics",
            "process.env.NCCL_ALGO": "process",
        },
    )
    rows = {
        r.key: r
        for r in compare(
            {
                "spec.depth": 5,
                "cache.block_size": 16.0,
                "process.env.NCCL_ALGO": "Tree",
                "scheduler.max_num_seqs": 4,
            },
            live,
        )
    }
    assert rows["spec.depth"].status == "drift" and rows["spec.depth"].live == 3
    assert rows["spec.depth"].source == "/metrics" and rows["spec.depth"].others == "process: 5"
    assert rows["cache.block_size"].status == "ok"  # 16 and 16.0 are the same number
    assert rows["process.env.NCCL_ALGO"].status == "drift"
    assert rows["scheduler.max_num_seqs"].status == "not visible"


def test_expected_keys_of_a_recommendation() -> None:
    (v,) = plan_sweep(
        ["spec=ngram", "spec.depth=5", "server.block_size=32", "+server.env.NCCL_ALGO=Tree"],
        with_baseline=False,
    )
    exp = expected_from_variant(v)
    assert exp["spec.method"] == "ngram" and exp["spec.depth"] == 5
    assert (exp["spec.prompt_lookup_min"], exp["spec.prompt_lookup_max"]) == (2, 4)
    assert exp["cache.block_size"] == 32 and exp["process.env.NCCL_ALGO"] == "Tree"
    assert "attention.backend" not in exp  # auto: nothing pinned
    (none,) = plan_sweep(["spec=none"], with_baseline=False)
    assert expected_from_variant(none) == {"spec.enabled": False}


@pytest.fixture
def fake_server(tmp_path: Path) -> Iterator[str]:
    """A fake vLLM started by specexp's local launcher with an ngram depth-3 command line."""
    (v,) = plan_sweep(
        [
            f"launcher.vllm_command=[{sys.executable},{FAKE}]",
            "spec=ngram",
            "spec.depth=3",
            "+server.env.NCCL_ALGO=Ring",
        ],
        with_baseline=False,
    )
    plan = build_plan(v, port=free_port())
    with LocalLauncher(plan, tmp_path / "server.log", ready_timeout_s=30) as launcher:
        endpoint = launcher.wait_ready()
        yield endpoint.base_url


def test_a_local_servers_process_is_read(fake_server: str) -> None:
    assert listening_pid(fake_server) is not None
    live = read_live(fake_server)
    assert live.values["process:spec.depth"] == 3 and live.values["process:spec.method"] == "ngram"
    assert live.values["process.env.NCCL_ALGO"] == "Ring"
    assert live.values["spec.enabled"] is False  # the fake exposes no spec-decode counters
    assert live.sources["spec.enabled"] == "/metrics"


def test_a_dead_endpoint_is_one_line() -> None:
    with pytest.raises(LaunchError, match="does not answer"):
        read_live(f"http://127.0.0.1:{free_port()}")


@pytest.fixture
def conf(tmp_path: Path) -> Path:
    copy = tmp_path / "conf"
    shutil.copytree(conf_dir(), copy)
    (copy / "experiment" / "depth5.yaml").write_text(
        "# @package _global_\ndefaults:\n  - override /spec: ngram\n"
        "spec:\n  depth: 5\nserver:\n  env:\n    NCCL_ALGO: Ring\n"
    )
    (copy / "experiment" / "plain.yaml").write_text(
        "# @package _global_\ndefaults:\n  - override /spec: none\n"
    )
    return copy


def test_verify_exit_codes(fake_server: str, conf: Path, tmp_path: Path) -> None:
    env = {"SPECEXP_CONF": str(conf)}
    drift = run_cli(
        ["verify", "--endpoint", fake_server, "--against", "depth5"], tmp_path, timeout=120, env=env
    )
    assert drift.returncode == 1, drift.stdout + drift.stderr
    assert "DRIFT" in drift.stdout and "spec.depth 3 (recommended 5)" in drift.stdout.replace("\n", " ")
    dead = run_cli(
        ["verify", "--endpoint", f"http://127.0.0.1:{free_port()}", "--against", "depth5"],
        tmp_path,
        timeout=120,
        env=env,
    )
    assert dead.returncode == 2 and dead.stderr.strip().count("\n") == 0
    assert dead.stderr.startswith("specexp: error: endpoint http://127.0.0.1:")
    unknown = run_cli(
        ["verify", "--endpoint", fake_server, "--against", "nosuch"], tmp_path, timeout=120, env=env
    )
    assert unknown.returncode == 2 and "no conf/experiment/nosuch.yaml" in unknown.stderr


def test_a_run_id_recommends_what_its_server_reported_running(workdir: Path) -> None:
    from mlflow.tracking import MlflowClient

    from specexp.launch.verify import _expected
    from specexp.record.results import VariantResult

    result = VariantResult(
        label="ngram-k5",
        variant_hash="d" * 12,
        is_baseline=False,
        overrides=["spec=ngram", "spec.depth=5"],
        effective={
            "spec.method": "ngram",
            "spec.depth": 5,
            "cache.block_size": 16,
            "process.cmdline": ["vllm", "serve"],
            "model.path": "/somewhere",
            "server.version": "0.32.0",
        },
    )
    client = MlflowClient(f"sqlite:///{workdir / 'mlflow.db'}")
    exp = client.create_experiment("specexp", artifact_location=(workdir / "mlruns").as_uri())
    run = client.create_run(exp)
    (workdir / "result.json").write_text(result.model_dump_json())
    client.log_artifact(run.info.run_id, str(workdir / "result.json"))
    expected, what = _expected(run.info.run_id)
    assert what == f"run {run.info.run_id} (ngram-k5)"
    assert expected["spec.depth"] == 5 and expected["cache.block_size"] == 16
    assert expected["spec.prompt_lookup_min"] == 2  # from its overrides, composed
    assert not any(k.startswith(("process.cmdline", "model.path", "server.")) for k in expected)
