from __future__ import annotations

import pytest

from specexp.config.compose import plan_sweep
from specexp.errors import ConfigError


def labels(overrides: list[str], with_baseline: bool | None = None) -> list[str]:
    return [v.label for v in plan_sweep(overrides, with_baseline)]


def test_depth_sweep_adds_one_baseline_and_falls_back_to_ngram() -> None:
    variants = plan_sweep(["spec.depth=3,5"])
    assert [v.label for v in variants] == ["baseline", "ngram-k3", "ngram-k5"]
    base, k3, k5 = variants
    assert base.config.spec.method == "none" and base.is_baseline
    assert (k3.config.spec.method, k3.config.spec.depth) == ("ngram", 3)
    assert k5.config.spec.depth == 5
    assert "no MTP layers" in k3.notes[0]
    assert k3.baseline_hash == base.hash == k5.baseline_hash


def test_cartesian_product_in_command_line_order_with_a_baseline_per_configuration() -> None:
    variants = plan_sweep(["spec.depth=3,5", "attention=flashinfer,b12x", "server.block_size=16,32"])
    spec = [v for v in variants if not v.is_baseline]
    base = [v for v in variants if v.is_baseline]
    assert len(spec) == 8 and len(base) == 4
    assert [
        (v.config.spec.depth, v.config.attention.backend, v.config.server.block_size) for v in spec[:2]
    ] == [
        (3, "FLASHINFER", 16),
        (3, "FLASHINFER", 32),
    ]
    by_hash = {v.hash: v for v in base}
    for v in spec:
        assert v.baseline_hash is not None
        b = by_hash[v.baseline_hash]
        assert b.config.attention.backend == v.config.attention.backend
        assert b.config.server.block_size == v.config.server.block_size
    assert len({v.hash for v in variants}) == 12


def test_range_choice_and_glob_use_hydra_grammar() -> None:
    assert labels(["spec=ngram", "spec.depth=range(2,5)"], with_baseline=False) == [
        "ngram-k2",
        "ngram-k3",
        "ngram-k4",
    ]
    assert labels(["spec=ngram", "spec.depth=choice(1,6)"], with_baseline=False) == [
        "ngram-k1",
        "ngram-k6",
    ]
    backends = [
        v.config.attention.backend
        for v in plan_sweep(["attention=glob(*)", "spec=none"], with_baseline=False)
    ]
    assert sorted(backends) == sorted(["auto", "B12X", "CPU_ATTN", "FLASHINFER", "FLASH_ATTN", "TRITON_ATTN"])


def test_no_baseline_and_identical_variants_kept_once() -> None:
    assert labels(["spec=none,none"]) == ["baseline"]
    assert labels(["spec.depth=3"], with_baseline=False) == ["ngram-k3"]
    assert labels(["sweep.baseline=false", "spec.depth=3"]) == ["ngram-k3"]


def test_same_config_same_hash_and_tracking_does_not_change_it() -> None:
    a = plan_sweep(["spec.depth=3"], with_baseline=False)[0]
    b = plan_sweep(["spec.depth=3", "tracking.experiment=other"], with_baseline=False)[0]
    c = plan_sweep(["spec.depth=4"], with_baseline=False)[0]
    assert a.hash == b.hash != c.hash


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("spec.dept=3", "spec.dept"),
        ("server.max_num_seqs=lots", "server.max_num_seqs"),
        ("spec.method=medusa7", "spec.method"),
        ("spec=none spec.depth=3", "spec.depth=3 needs a speculative method"),
        ("spec.depth=interval(1,6)", "interval() needs a search"),
        ("attention=nope", "attention"),
        ("server.gpu_memory_utilization=1.5", "gpu_memory_utilization"),
        ("spec.depth=3,", "spec.depth"),
        ("bench.target_width=0.1", "bench.target_width needs bench.max_trials"),
        ("bench.target_width=0 bench.max_trials=20", "bench.target_width=0"),
    ],
)
def test_bad_override_is_one_line_naming_the_key(override: str, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        plan_sweep(override.split())
    msg = str(info.value)
    assert expected in msg
    assert "\n" not in msg


def test_mtp_on_a_model_without_mtp_layers_can_be_refused() -> None:
    with pytest.raises(ConfigError, match="no MTP layers"):
        plan_sweep(["spec.mtp_fallback=null"], with_baseline=False)


def test_spark_experiment_composes_the_seed_configuration() -> None:
    (v,) = plan_sweep(["experiment=spark_glm_mtp"], with_baseline=False)
    c = v.config
    assert c.model.path == "/models/GLM-5.3-Flash-NVFP4" and c.model.has_mtp
    assert (c.spec.method, c.spec.depth, c.spec.moe_backend) == ("mtp", 3, "humming")
    assert c.attention.backend == "B12X" and c.attention.draft_backend == "same"
    assert c.server.tensor_parallel_size == 4 and c.launcher.nnodes == 4
    assert c.server.env["GLOO_SOCKET_IFNAME"] == "enp1s0f0np0"
    assert v.notes == ()
