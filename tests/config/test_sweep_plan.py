"""What a sweep's variants may differ in: per-variant settings stay on each variant, and
settings of the whole sweep are refused in one line when they differ."""

from __future__ import annotations

import pytest

from specexp.config.compose import plan_sweep
from specexp.config.sweep_plan import SweepPlan
from specexp.errors import ConfigError


def test_each_trial_count_keeps_its_own_variants_and_baseline() -> None:
    """``bench.trials=3,5`` in an interleaved sweep: every variant keeps its own count (the
    schedule honours it: tests/run/test_schedule.py), each count with its own baseline, so
    no variant is silently measured with another's settings."""
    variants = plan_sweep(["spec.depth=3,5", "bench.trials=3,5", "bench.order=interleaved"])
    trials = {v.label: v.config.bench.trials for v in variants}
    assert trials == {
        "baseline trials=3": 3,
        "baseline trials=5": 5,
        "ngram-k3 trials=3": 3,
        "ngram-k3 trials=5": 5,
        "ngram-k5 trials=3": 3,
        "ngram-k5 trials=5": 5,
    }
    plan = SweepPlan.resolve(variants)
    assert plan.order == "interleaved" and len(plan.variants) == 6


def test_a_sweep_wide_setting_that_differs_is_one_line_naming_it() -> None:
    variants = plan_sweep(["spec.depth=3", "bench.order=sequential,interleaved", "sweep.baseline=false"])
    with pytest.raises(ConfigError, match=r"^bench\.order") as info:
        SweepPlan.resolve(variants)
    assert "\n" not in str(info.value)


def test_aa_measures_a_second_copy_of_each_baseline_against_the_first() -> None:
    variants = plan_sweep(["spec=none", "sweep.aa=true"])
    assert [v.label for v in variants] == ["baseline", "baseline (A/A copy)"]
    original, copy = variants
    assert original.is_baseline and not copy.is_baseline
    assert original.hash != copy.hash  # two results, two servers
    assert original.config.spec == copy.config.spec and original.config.server == copy.config.server
    assert SweepPlan.resolve(variants).aa
