from __future__ import annotations

import json
from pathlib import Path

import pytest

from specexp.config.compose import plan_sweep
from specexp.launch import plan as plan_mod
from specexp.launch.plan import build_plan, redact_argv, redact_env

SEED_FLAGS = """--distributed-executor-backend=mp
--tensor-parallel-size=4
--trust-remote-code
--max-model-len=500000
--gpu-memory-utilization=0.85
--max-num-seqs=4
--max-num-batched-tokens=8192
--kv-cache-dtype=fp8
--block-size=256
--mamba-cache-mode=align
--no-enable-flashinfer-autotune
--enable-auto-tool-choice
--tool-call-parser=glm47
--reasoning-parser=glm47
--attention-backend=B12X
--speculative-config={"method":"mtp","num_speculative_tokens":3,"moe_backend":"humming","attention_backend":"B12X"}""".splitlines()

SEED_ENV = """VLLM_USE_AOT_COMPILE=1
VLLM_USE_MEGA_AOT_ARTIFACT=1
VLLM_USE_V2_MODEL_RUNNER=1
CUTE_DSL_ARCH=sm_121a
VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0
VLLM_SSM_CONV_STATE_LAYOUT=DS
NCCL_IB_HCA=rocep1s0f0,roceP2p1s0f0
NCCL_IB_TC=104
NCCL_IB_QPS_PER_CONNECTION=4
NCCL_IB_SPLIT_DATA_ON_QPS=1
NCCL_SOCKET_IFNAME=enp1s0f0np0
GLOO_SOCKET_IFNAME=enp1s0f0np0""".splitlines()


def test_seed_003_plan_has_every_flag_and_env_var_of_the_seed() -> None:
    (v,) = plan_sweep(["experiment=spark_glm_mtp"], with_baseline=False)
    p = build_plan(v, resolve_model=False)
    assert len(p.nodes) == 4
    head = p.nodes[0]
    for flag in SEED_FLAGS:
        assert flag in head.argv, flag
    for item in SEED_ENV:
        key, value = item.split("=", 1)
        assert head.env[key] == value, key
    assert head.argv[head.argv.index("serve") + 1] == "/models/GLM-5.3-Flash-NVFP4"
    assert "--node-rank=0" in head.argv and "--master-addr=192.168.100.1" in head.argv
    for rank, node in enumerate(p.nodes[1:], start=1):
        assert f"--node-rank={rank}" in node.argv and "--headless" in node.argv
        assert not any(a.startswith("--port=") for a in node.argv)
        assert node.env["VLLM_HOST_IP"] == f"192.168.100.{rank + 1}"
        assert node.env["GLOO_SOCKET_IFNAME"] == "enp1s0f0np0"


def test_cpu_plan_is_eager_with_cpu_env_and_one_json_speculative_argument(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(plan_mod, "detect_device", lambda requested: "cpu")
    (v,) = plan_sweep(["spec.depth=5"], with_baseline=False)
    p = build_plan(v, port=8123, resolve_model=False)
    args = list(p.serve_args)
    assert args[0] == "embedded:smollm2-135m-instruct"
    assert "--enforce-eager" in args and "--port=8123" in args and "--host=127.0.0.1" in args
    spec_args = [a for a in args if a.startswith("--speculative-config=")]
    assert len(spec_args) == 1
    assert json.loads(spec_args[0].split("=", 1)[1]) == {
        "method": "ngram",
        "num_speculative_tokens": 5,
        "prompt_lookup_min": 2,
        "prompt_lookup_max": 4,
    }
    env = p.head.env
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "1" and env["HF_HUB_OFFLINE"] == "1"
    assert p.base_url == "http://127.0.0.1:8123"


def test_one_cpu_worker_runs_in_the_engine_core_unless_the_server_env_says_otherwise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(plan_mod, "detect_device", lambda requested: "cpu")
    cases = {
        "one": ["spec=none"],
        "tp2": ["spec=none", "server.tensor_parallel_size=2"],
        "kept": ["spec=none", "+server.env.VLLM_ENABLE_V1_MULTIPROCESSING=1"],
    }
    env = {}
    for name, overrides in cases.items():
        (v,) = plan_sweep(overrides, with_baseline=False)
        env[name] = build_plan(v, port=1, resolve_model=False).head.env
    assert env["one"]["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in env["tp2"]  # several workers: vLLM's mp executor
    assert env["kept"]["VLLM_ENABLE_V1_MULTIPROCESSING"] == "1"


def test_baseline_has_no_speculative_config_and_user_flags_come_last() -> None:
    (v,) = plan_sweep(
        ["spec=none", 'server.extra_args=["--max-num-seqs=8"]', "server.block_size=32"],
        with_baseline=False,
    )
    args = list(build_plan(v, port=9000, resolve_model=False).serve_args)
    assert not any(a.startswith("--speculative-config") for a in args)
    assert "--block-size=32" in args and args[-1] == "--max-num-seqs=8"


def test_intel_openmp_preload_follows_the_switch(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(plan_mod, "detect_device", lambda requested: "cpu")
    monkeypatch.setenv("SPECEXP_VLLM_VENV", str(tmp_path))
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "libiomp5.so").write_bytes(b"")
    on, off = plan_sweep(["spec=none", "launcher.intel_openmp=auto,off"], with_baseline=False)
    assert build_plan(on, port=1, resolve_model=False).head.env["LD_PRELOAD"].endswith("libiomp5.so")
    assert "LD_PRELOAD" not in build_plan(off, port=1, resolve_model=False).head.env


def test_secrets_are_redacted() -> None:
    assert redact_env({"HF_TOKEN": "abc", "NCCL_IB_TC": "104", "MY_API_KEY": "x"}) == {
        "HF_TOKEN": "***",
        "NCCL_IB_TC": "104",
        "MY_API_KEY": "***",
    }
    assert redact_argv(["vllm", "--api-key", "s3cret", "--hf-token=tok", "--port=1"]) == [
        "vllm",
        "--api-key",
        "***",
        "--hf-token=***",
        "--port=1",
    ]


def test_seed_dry_run_prints_every_node_without_connecting(monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    import asyncssh
    from rich.console import Console

    from specexp.run.sweep import dry_run

    def no_connection(*args: object, **kwargs: object) -> None:
        raise AssertionError("a dry run must not connect anywhere")

    monkeypatch.setattr(asyncssh, "connect", no_connection)
    variants = plan_sweep(["experiment=spark_glm_mtp"], with_baseline=False)
    buf = io.StringIO()
    dry_run(variants, Console(file=buf, width=300), validate=False)
    text = buf.getvalue()
    for rank in range(4):
        assert f"node {rank} (192.168.100.{rank + 1})" in text
        assert f"--node-rank={rank}" in text and f"VLLM_HOST_IP=192.168.100.{rank + 1}" in text
    assert text.count("--headless") == 3 and text.count("GLOO_SOCKET_IFNAME=enp1s0f0np0") == 4
