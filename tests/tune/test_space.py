"""Hydra's sweep grammar read as an Optuna search space."""

from __future__ import annotations

import optuna
import pytest

from specexp.config.compose import hydra_context
from specexp.errors import ConfigError
from specexp.tune.space import SearchSpace, parse_overrides, with_baseline


def space(*items: str) -> SearchSpace:
    with hydra_context():
        return parse_overrides(list(items))


def test_grammar_becomes_distributions() -> None:
    s = space(
        "spec=none,ngram",
        "spec.depth=range(1,9)",
        "server.gpu_memory_utilization=interval(0.5,0.9)",
        "server.max_num_seqs=tag(log,interval(4,64))",
        "server.block_size=tag(int,interval(16,64))",
        "attention=glob(*)",
        "server.env.NCCL_ALGO=Ring,Tree",
        "suite=none",
    )
    p = {x.key: x for x in s.params}
    assert p["spec"].kind == "categorical" and p["spec"].choices == ("none", "ngram")
    # Hydra's range end is exclusive, Optuna's int range inclusive
    assert p["spec.depth"].distribution() == optuna.distributions.IntDistribution(1, 8)
    assert p["server.gpu_memory_utilization"].distribution() == optuna.distributions.FloatDistribution(
        0.5, 0.9
    )
    assert p["server.max_num_seqs"].log and p["server.max_num_seqs"].kind == "float"
    assert p["server.block_size"].kind == "int" and (
        p["server.block_size"].low,
        p["server.block_size"].high,
    ) == (16, 64)
    assert "flashinfer" in p["attention"].choices and "auto" in p["attention"].choices
    assert p["server.env.NCCL_ALGO"].choices == ("Ring", "Tree")
    assert s.fixed == ("suite=none",)
    assert s.params[0].key == "spec"  # switches first: define-by-run needs them before spec.*
    assert s.size() is None  # a float interval has no grid


def test_spec_keys_are_inactive_without_speculation() -> None:
    s = space("spec.depth=range(1,9)", "spec=none,ngram")
    cands = s.candidates()
    assert cands is not None and len(cands) == 9  # one baseline, not one per depth
    assert {"spec": "none"} in cands
    assert s.overrides({"spec": "ngram", "spec.depth": 5}) == ["spec=ngram", "spec.depth=5"]


def test_suggest_follows_the_switch() -> None:
    s = space("spec=none,ngram", "spec.depth=range(1,3)")
    study = optuna.create_study()
    study.enqueue_trial({"spec": "none"})
    study.enqueue_trial({"spec": "ngram", "spec.depth": 2})
    seen = []
    for _ in range(2):
        trial = study.ask()
        seen.append(s.suggest(trial))
        study.tell(trial, 1.0)
    assert seen == [{"spec": "none"}, {"spec": "ngram", "spec.depth": 2}]


def test_the_baseline_is_always_a_candidate() -> None:
    s, note = with_baseline(space("spec.depth=range(2,4)"), "ngram")
    assert s.params[0].key == "spec" and s.params[0].choices == ("none", "ngram")
    assert note is not None and "baseline" in note
    s2, note2 = with_baseline(space("spec=mtp,ngram", "spec.depth=3,5"), "mtp")
    assert s2.params[0].choices == ("none", "mtp", "ngram") and note2 is not None
    s3, note3 = with_baseline(space("spec=none,ngram", "spec.depth=3,5"), "mtp")
    assert s3.params[0].choices == ("none", "ngram") and note3 is None


@pytest.mark.parametrize(
    ("items", "message"),
    [
        (["bench.cases.single.concurrency=1,4"], "client-side settings are not searched"),
        (["bench=smoke,seed"], "client-side"),
        (["spec.depth=range(5,2)"], "empty"),
        (["spec.depth=1,2", "spec.depth=3,4"], "searched twice"),
        (["spec.depth=1,1"], "listed twice"),
        (["spec.depth=range(1"], "cannot parse"),
    ],
)
def test_bad_search_is_one_line(items: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        space(*items)
