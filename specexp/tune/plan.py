"""TunePlan: a search resolved once (space, objectives, constraints, study, storage).

A search comes from ``conf/search/NAME.yaml`` and the command line; both speak Hydra's
sweep grammar, and the command line wins key by key. Nothing is launched while a plan is
made: a bad key, value, objective or constraint is one line before the study exists.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import yaml
from hydra import compose
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from specexp.config.compose import compose_config
from specexp.config.schema import Config, TrackingConfig
from specexp.errors import ConfigError
from specexp.paths import conf_dir, workdir
from specexp.tune.objectives import CONSTRAINT_NAMES, Objective, check_constraint_names, parse_objectives
from specexp.tune.space import SearchSpace, parse_overrides, with_baseline

STRATEGIES = ("model", "tpe", "grid", "random")


@dataclass
class SearchFile:
    """``conf/search/NAME.yaml``: what to search and what for."""

    params: dict[str, str] = field(default_factory=dict)  # key -> Hydra sweep grammar
    overrides: list[str] = field(default_factory=list)  # fixed for every candidate
    objectives: list[str] = field(default_factory=list)  # case.metric[:max|:min]
    constraints: list[str] = field(default_factory=lambda: list(CONSTRAINT_NAMES))
    n_trials: int = 8
    strategy: str = "model"
    # The depth model skips a candidate that, even twice the model's worst miss so far
    # above its prediction, would not beat the best measured figure by more than this.
    margin: float = 0.05
    seed: int = 0


@dataclass(frozen=True)
class TunePlan:
    study: str
    storage: str
    space: SearchSpace
    objectives: tuple[Objective, ...]
    constraints: tuple[str, ...]
    n_trials: int
    strategy: str
    margin: float
    seed: int
    config: Config  # the fixed part composed: cases, tracking, launcher, results folder
    notes: tuple[str, ...] = ()

    @property
    def results_dir(self) -> Path:
        base = Path(self.config.sweep.results_dir)
        return base if base.is_absolute() else workdir() / base

    @property
    def tracking(self) -> TrackingConfig:
        return self.config.tracking

    def signature(self) -> dict[str, Any]:
        """What a resumed study must match (a different space or objective is another study)."""
        space = self.space.signature()
        # where results and runs go may move between sessions (as a resumed sweep's), and
        # each process of a shared study may launch on its own node group
        local = ("tracking", "sweep", "launcher")
        space["fixed"] = [f for f in space["fixed"] if _key(f).split(".", 1)[0] not in local]
        return {
            "space": space,
            "objectives": [f"{o.name}:{o.direction}" for o in self.objectives],
            "constraints": list(self.constraints),
        }


def search_files() -> list[str]:
    return sorted(p.stem for p in (conf_dir() / "search").glob("*.yaml"))


def load_search(name: str) -> SearchFile:
    path = conf_dir() / "search" / f"{name}.yaml"
    if not path.is_file():
        raise ConfigError(f"no search {name!r} (conf/search/: {', '.join(search_files()) or 'empty'})")
    try:
        raw = yaml.safe_load(path.read_text()) or {}
        merged = OmegaConf.merge(OmegaConf.structured(SearchFile), raw)
        return cast(SearchFile, OmegaConf.to_object(merged))
    except (yaml.YAMLError, OmegaConfBaseException) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"conf/search/{name}.yaml: {first}") from None


def _key(item: str) -> str:
    return item.split("=", 1)[0].lstrip("+~")


def _spec_choice(fixed: list[str]) -> str:
    """The spec group the fixed part selects (the config's default when it selects none)."""
    try:
        cfg = compose(config_name="config", overrides=list(fixed), return_hydra_config=True)
        return str(cfg.hydra.runtime.choices.get("spec") or "ngram")
    except Exception:  # composing is checked properly right after, with a one-line error
        return "ngram"


def plan_tune(
    overrides: list[str],
    *,
    search: str | None = None,
    study: str | None = None,
    storage: str | None = None,
    n_trials: int | None = None,
    objectives: list[str] | None = None,
    strategy: str | None = None,
    margin: float | None = None,
    seed: int | None = None,
) -> TunePlan:
    """Resolve a search; needs ``hydra_context``."""
    file = load_search(search) if search else SearchFile()
    items = [*file.overrides, *(f"{k}={v}" for k, v in file.params.items()), *overrides]
    last = {_key(i): idx for idx, i in enumerate(items)}  # the command line wins, key by key
    items = [i for idx, i in enumerate(items) if last[_key(i)] == idx]
    space = parse_overrides(items)
    if not space.params:
        raise ConfigError(
            "nothing to search: give at least one key with several values (e.g. 'spec.depth=range(1,9)')"
        )
    space, note = with_baseline(space, _spec_choice(list(space.fixed)))
    config, _ = compose_config(list(space.fixed))
    strategy = strategy or file.strategy
    if strategy not in STRATEGIES:
        raise ConfigError(f"--strategy {strategy!r} is not one of {', '.join(STRATEGIES)}")
    if strategy == "grid" and space.size() is None:
        raise ConfigError("--strategy grid needs a finite space (interval() has no grid)")
    constraints = tuple(file.constraints)
    check_constraint_names(constraints)
    objs = parse_objectives(objectives or file.objectives, config.bench.cases)
    n = n_trials if n_trials is not None else file.n_trials
    if n < 1:
        raise ConfigError("--n-trials must be >= 1")
    m = margin if margin is not None else file.margin
    if not 0 <= m < 1:
        raise ConfigError("--margin must be in [0, 1)")
    name = study or f"tune-{search or 'cli'}-{datetime.now(UTC):%Y%m%d-%H%M%S}"
    return TunePlan(
        study=name,
        storage=storage or f"sqlite:///{workdir() / 'optuna.db'}",
        space=space,
        objectives=tuple(objs),
        constraints=constraints,
        n_trials=n,
        strategy=strategy,
        margin=m,
        seed=seed if seed is not None else file.seed,
        config=config,
        notes=(note,) if note else (),
    )
