from __future__ import annotations

from specexp.config.compose import plan_sweep
from specexp.config.schema import BenchConfig, CaseConfig
from specexp.launch.base import Endpoint
from specexp.measure import workload
from specexp.measure.runner import _case_prompts


def test_the_slices_bundle_gives_each_slice_its_own_prompts() -> None:
    (variant,) = plan_sweep(["spec=none", "bench=slices"], with_baseline=False)
    bench = variant.config.bench
    assert list(bench.cases) == ["smart_home", "portfolio", "todo", "coding_conflict"]
    endpoint = Endpoint(base_url="http://x", model="m")
    for i, (name, case) in enumerate(bench.cases.items()):
        prompts = _case_prompts(endpoint, bench, name, case, i)
        assert len(prompts) == case.num_prompts
        pool = {tuple((m["role"], m["content"]) for m in p) for p in workload.prompts_for(name, 0, 50, 0)}
        assert all(tuple((m["role"], m["content"]) for m in p) in pool for p in prompts)


def test_a_case_without_its_own_workload_uses_the_bench_workload() -> None:
    bench = BenchConfig(workload="todo", cases={"c": CaseConfig(num_prompts=2)})
    prompts = _case_prompts(Endpoint(base_url="http://x", model="m"), bench, "c", bench.cases["c"], 0)
    assert all("to-do" in p[-1]["content"] or "list" in p[-1]["content"] for p in prompts)


def test_variants_get_the_same_prompts_and_cases_differ() -> None:
    a = workload.prompts_for("copy_edit", 0, 6, seed=0)
    assert a == workload.prompts_for("copy_edit", 0, 6, seed=0)
    assert a != workload.prompts_for("copy_edit", 1, 6, seed=0)
