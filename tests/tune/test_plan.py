"""A search from conf/search/*.yaml and the command line, resolved before anything starts."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from specexp.config.compose import hydra_context
from specexp.errors import ConfigError
from specexp.paths import conf_dir
from specexp.tune.plan import plan_tune


@pytest.fixture
def conf(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    copy = tmp_path / "conf"
    shutil.copytree(conf_dir(), copy)
    monkeypatch.setenv("SPECEXP_CONF", str(copy))
    return copy


def test_the_shipped_search_is_the_benchmarks_space() -> None:
    with hydra_context():
        plan = plan_tune([], search="ngram_depth", study="x")
    assert plan.space.size() == 9  # none + ngram depth 1..8
    assert [o.name for o in plan.objectives] == ["single.decode_tok_s", "concurrent4.output_tok_s"]
    assert plan.strategy == "model" and plan.n_trials == 9 and plan.margin == 0.05
    assert plan.storage.endswith("/optuna.db")


def test_the_command_line_wins_key_by_key(conf: Path) -> None:
    (conf / "search" / "mine.yaml").write_text(
        "params:\n  spec.depth: range(1,9)\n  spec: none,ngram\noverrides: [suite=none, bench.trials=3]\n"
        "objectives: [single]\nn_trials: 5\nstrategy: tpe\n"
    )
    with hydra_context():
        plan = plan_tune(["spec.depth=2,3", "bench.trials=2", "tracking=none"], search="mine", n_trials=7)
    depth = plan.space.param("spec.depth")
    assert depth is not None and depth.choices == (2, 3)
    assert "bench.trials=2" in plan.space.fixed and "bench.trials=3" not in plan.space.fixed
    assert plan.config.bench.trials == 2 and plan.n_trials == 7 and plan.strategy == "tpe"
    assert [o.name for o in plan.objectives] == ["single.decode_tok_s"]
    # where results go and how servers start are not part of what a resumed study must match
    with hydra_context():
        other = plan_tune(["spec.depth=2,3", "bench.trials=2", "launcher.ready_timeout_s=5"], search="mine")
    assert other.signature() == plan.signature()


def test_a_bad_search_file_is_one_line(conf: Path) -> None:
    (conf / "search" / "bad.yaml").write_text("params:\n  spec.depth: range(1,9)\nn_trial: 5\n")
    with pytest.raises(ConfigError, match=r"bad.yaml: Key 'n_trial' not in 'SearchFile'"), hydra_context():
        plan_tune([], search="bad")
    with pytest.raises(ConfigError, match="grid needs a finite space"), hydra_context():
        plan_tune(["server.gpu_memory_utilization=interval(0.5,0.9)"], strategy="grid")
