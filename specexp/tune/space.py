"""The search space of ``tune``: Hydra's sweep grammar read as Optuna distributions.

A search is written like a sweep (``spec=none,ngram 'spec.depth=range(1,9)'``), in
``conf/search/*.yaml`` or on the command line, so one grammar serves both: a list or
``choice()`` or ``glob()`` is categorical, ``range()`` an integer (Hydra's end is
exclusive, Optuna's inclusive: ``range(1,9)`` is 1..8), ``interval()`` a float
(``tag(log, interval(...))`` log-scaled, ``tag(int, interval(...))`` an integer). Keys
under ``spec.`` other than the method are inactive when the method is ``none``, so the
baseline is one candidate, not one per depth.

Client-side settings (``bench.*``: cases, concurrency, prompts) are not searched: one
server start measures every case, so they never cost a start.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import optuna
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import ChoiceSweep, IntervalSweep, RangeSweep
from hydra.errors import HydraException, OverrideParseException

from specexp.errors import ConfigError

Value = str | int | float
CLIENT_SIDE = ("bench", "suite", "tracking", "sweep")
SPEC_SWITCHES = ("spec", "spec.method")


@dataclass(frozen=True)
class Param:
    """One searched key; ``key=value`` is the override a chosen value becomes."""

    key: str
    kind: Literal["categorical", "int", "float"]
    choices: tuple[Value, ...] = ()
    low: float = 0.0
    high: float = 0.0
    step: float | None = None
    log: bool = False

    def distribution(self) -> optuna.distributions.BaseDistribution:
        if self.kind == "categorical":
            return optuna.distributions.CategoricalDistribution(self.choices)
        if self.kind == "int":
            return optuna.distributions.IntDistribution(
                int(self.low), int(self.high), step=int(self.step or 1), log=self.log
            )
        return optuna.distributions.FloatDistribution(self.low, self.high, log=self.log, step=self.step)

    def values(self) -> list[Value] | None:
        """Every value, when there are finitely many (a float interval has not)."""
        if self.kind == "categorical":
            return list(self.choices)
        if self.kind == "int":
            return list(range(int(self.low), int(self.high) + 1, int(self.step or 1)))
        return None

    def describe(self) -> str:
        if self.kind == "categorical":
            return "{" + ", ".join(map(str, self.choices)) + "}"
        scale = " log" if self.log else ""
        return f"{self.kind} [{self.low:g}, {self.high:g}]{scale}"

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "kind": self.kind,
            "choices": list(self.choices),
            "low": self.low,
            "high": self.high,
            "step": self.step,
            "log": self.log,
        }


def _spec_off(chosen: Mapping[str, Value]) -> bool:
    return any(str(chosen.get(k)) == "none" for k in SPEC_SWITCHES if k in chosen)


def active(param: Param, chosen: Mapping[str, Value]) -> bool:
    """Keys of the speculative part mean nothing without speculation."""
    if param.key.startswith("spec.") and param.key not in SPEC_SWITCHES:
        return not _spec_off(chosen)
    return True


@dataclass(frozen=True)
class SearchSpace:
    params: tuple[Param, ...]
    fixed: tuple[str, ...] = field(default=())  # plain overrides every candidate gets

    def param(self, key: str) -> Param | None:
        return next((p for p in self.params if p.key == key), None)

    def suggest(self, trial: optuna.Trial) -> dict[str, Value]:
        """Define-by-run: ask the trial for each active parameter, switches first."""
        chosen: dict[str, Value] = {}
        for p in self.params:
            if not active(p, chosen):
                continue
            if p.kind == "categorical":
                picked = trial.suggest_categorical(p.key, list(p.choices))
                chosen[p.key] = picked if picked is not None else "null"
            elif p.kind == "int":
                chosen[p.key] = trial.suggest_int(
                    p.key, int(p.low), int(p.high), step=int(p.step or 1), log=p.log
                )
            else:
                chosen[p.key] = trial.suggest_float(p.key, p.low, p.high, step=p.step, log=p.log)
        return chosen

    def overrides(self, chosen: Mapping[str, Value]) -> list[str]:
        """The fixed overrides, then one per chosen value (later wins in Hydra)."""
        return [*self.fixed, *(f"{p.key}={_fmt(chosen[p.key])}" for p in self.params if p.key in chosen)]

    def candidates(self) -> list[dict[str, Value]] | None:
        """Every distinct candidate of a finite space (inactive keys left out), or None."""
        out: list[dict[str, Value]] = []

        def walk(i: int, chosen: dict[str, Value]) -> None:
            if i == len(self.params):
                out.append(dict(chosen))
                return
            p = self.params[i]
            if not active(p, chosen):
                walk(i + 1, chosen)
                return
            for value in p.values() or []:
                chosen[p.key] = value
                walk(i + 1, chosen)
                del chosen[p.key]

        if any(p.values() is None for p in self.params):
            return None
        walk(0, {})
        return out

    def size(self) -> int | None:
        found = self.candidates()
        return None if found is None else len(found)

    def signature(self) -> dict[str, Any]:
        return {"params": [p.to_json() for p in self.params], "fixed": list(self.fixed)}


def _fmt(value: Value) -> str:
    if isinstance(value, float):
        return repr(round(value, 10))
    return str(value)


def _number(text: Any) -> Value:
    if isinstance(text, bool):
        return str(text).lower()
    if isinstance(text, int | float):
        return text
    return str(text)


def _float_range(start: float, stop: float, step: float) -> list[Value]:
    count = max(0, math.ceil((stop - start) / step - 1e-9))
    return [round(start + i * step, 10) for i in range(count)]


def parse_overrides(items: Sequence[str]) -> SearchSpace:
    """Sweep overrides become parameters; plain overrides stay fixed. Needs ``hydra_context``."""
    parser = OverridesParser.create(config_loader=GlobalHydra.instance().config_loader())
    params: list[Param] = []
    fixed: list[str] = []
    for item in items:
        try:
            parsed = parser.parse_overrides([item])
        except (OverrideParseException, HydraException) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ConfigError(f"cannot parse search override {item!r}: {first}") from None
        for ov in parsed:
            key = ov.get_key_element().lstrip("+~")
            if not ov.is_sweep_override():
                fixed.append(item)
                continue
            root = key.split(".", 1)[0]
            if root in CLIENT_SIDE:
                raise ConfigError(
                    f"{key}: client-side settings are not searched (one server start measures every "
                    "case); list the settings as cases in bench.cases instead"
                )
            params.append(_param(key, ov))
    seen: set[str] = set()
    for p in params:
        if p.key in seen:
            raise ConfigError(f"{p.key} is searched twice")
        seen.add(p.key)
    # switches first, so define-by-run knows whether the spec.* keys are active
    params.sort(key=lambda p: 0 if p.key in SPEC_SWITCHES else 1)
    return SearchSpace(tuple(params), tuple(fixed))


def _param(key: str, ov: Any) -> Param:
    value = ov.value()
    if isinstance(value, IntervalSweep):
        tags = set(value.tags or ())
        low, high = float(value.start or 0.0), float(value.end or 0.0)
        if low >= high:
            raise ConfigError(f"{key}: interval({low:g}, {high:g}) is empty")
        if "int" in tags:
            return Param(key, "int", low=math.ceil(low), high=math.floor(high), log="log" in tags)
        return Param(key, "float", low=low, high=high, log="log" in tags)
    if isinstance(value, RangeSweep):
        start, stop, step = value.start or 0, value.stop or 0, value.step or 1
        if isinstance(start, int) and isinstance(stop, int) and isinstance(step, int) and step > 0:
            if stop <= start:
                raise ConfigError(f"{key}: range({start}, {stop}) is empty")
            last = start + ((stop - 1 - start) // step) * step
            return Param(key, "int", low=start, high=last, step=step)
        values = _float_range(float(start), float(stop), float(step))
        if not values:
            raise ConfigError(f"{key}: the range expands to no values")
        return Param(key, "categorical", choices=tuple(values))
    if isinstance(value, ChoiceSweep):
        choices = tuple(_number(v) for v in value.list)
    else:  # glob() over a config group
        choices = tuple(ov.sweep_string_iterator())
    if not choices:
        raise ConfigError(f"{key}: the sweep expands to no values")
    if len(set(map(str, choices))) != len(choices):
        raise ConfigError(f"{key}: a value is listed twice")
    return Param(key, "categorical", choices=choices)


def with_baseline(space: SearchSpace, default_spec: str) -> tuple[SearchSpace, str | None]:
    """Make the no-speculation baseline a candidate: every measurement is read against it
    and, at some concurrency, no speculation may be the best. Returns the space and a note
    when a ``spec`` switch had to be added."""
    for key in SPEC_SWITCHES:
        p = space.param(key)
        if p is not None:
            if "none" in map(str, p.choices):
                return space, None
            added = Param(p.key, "categorical", choices=("none", *p.choices))
            params = tuple(added if q is p else q for q in space.params)
            return SearchSpace(params, space.fixed), f"{key}: added 'none' (the baseline is a candidate)"
    switch = Param("spec", "categorical", choices=("none", default_spec))
    return (
        SearchSpace((switch, *space.params), space.fixed),
        f"spec: searched over none,{default_spec} (the baseline is a candidate)",
    )
