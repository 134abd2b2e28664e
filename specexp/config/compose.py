"""Compose configs with Hydra and expand sweep overrides into Variants.

Hydra's own ``OverridesParser`` reads the grammar (``a,b``, ``range()``,
``choice()``, ``glob()``), so sweeps mean exactly what they mean in any Hydra
app; specexp takes the cartesian product itself so the whole variant list
exists before anything launches (printable, validated, resumable). ``@hydra.main``
is not used: it cannot sit behind a ``sweep`` subcommand and it changes the
working directory.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import Any, cast

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException, OverrideParseException
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from specexp.config.schema import Config, SpecConfig, register
from specexp.config.variant import Variant
from specexp.errors import ConfigError
from specexp.paths import conf_dir


@contextmanager
def hydra_context() -> Iterator[None]:
    register()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3", job_name="specexp"):
        yield
    GlobalHydra.instance().clear()


def _one_line(exc: BaseException) -> str:
    """Hydra wraps the useful message (with the full key) in causes; keep one line of it."""
    levels: list[tuple[str, str]] = []  # (first line, full_key) from outermost to innermost
    cur: BaseException | None = exc
    while cur is not None:
        lines = [ln.strip() for ln in str(cur).splitlines() if ln.strip() and ln.strip() != "None"]
        full_key = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("full_key:")), "")
        lines = [ln for ln in lines if not ln.startswith(("full_key:", "object_type", "See https"))]
        if lines:
            text = lines[0]
            # "Available options in 'attention':" followed by one option per line
            heads = [i for i, ln in enumerate(lines) if ln.endswith(":") and i + 1 < len(lines)]
            if heads:
                i = heads[0]
                items = []
                for ln in lines[i + 1 :]:
                    if ln.endswith(":"):
                        break
                    items.append(ln)
                text = (text + "; " if i else "") + lines[i] + " " + ", ".join(items)
            levels.append((text, full_key))
        cur = cur.__cause__ or cur.__context__
    if not levels:
        return type(exc).__name__
    keyed = [lv for lv in levels if lv[1]]
    text, key = keyed[-1] if keyed else levels[-1]
    if key and key not in text:
        text = f"{key}: {text}"
    outer = levels[0][0]
    return text if outer in text or text in outer else f"{text} ({outer})"


def compose_config(overrides: Sequence[str], *, baseline: bool = False) -> tuple[Config, dict[str, Any]]:
    """Compose ``conf/config.yaml`` with plain (non-sweep) overrides; needs ``hydra_context``.

    ``baseline``: the no-speculation form of the same configuration. Its ``spec`` node is
    the ``spec=none`` default as a whole, so keys an experiment file sets on top of the
    spec group (``spec.depth: 3``, ``spec.moe_backend``) do not leak into the baseline.
    """
    try:
        cfg = compose(config_name="config", overrides=list(overrides))
        if baseline:
            cfg.spec = OmegaConf.structured(SpecConfig())
        resolved = cast(dict[str, Any], OmegaConf.to_container(cfg, resolve=True))
        obj = cast(Config, OmegaConf.to_object(cfg))
    except (HydraException, OmegaConfBaseException, ValueError) as exc:
        raise ConfigError(_one_line(exc)) from None
    if not obj.bench.cases:
        raise ConfigError("bench.cases is empty: nothing to measure")
    return obj, resolved


def expand(overrides: Sequence[str]) -> tuple[list[list[str]], list[str]]:
    """Cartesian product of the sweep overrides, in command-line order (last axis fastest).

    Returns the combinations and the keys that vary (used to name variants).
    """
    parser = OverridesParser.create(config_loader=GlobalHydra.instance().config_loader())
    parsed = []
    for item in overrides:
        try:
            parsed += parser.parse_overrides([item])
        except (OverrideParseException, HydraException) as exc:
            hint = " (quote list values: 'key=[\"--flag=1\"]')" if "[" in item else ""
            raise ConfigError(f"cannot parse override {item!r}: {_one_line(exc)}{hint}") from None
    axes: list[list[str]] = []
    varying: list[str] = []
    for ov in parsed:
        key = ov.get_key_element()
        if ov.is_sweep_override():
            if not ov.is_discrete_sweep():
                raise ConfigError(
                    f"{key}: interval() needs a search; sweep takes lists, range(), choice(), glob()"
                )
            values = list(ov.sweep_string_iterator())
            if not values:
                raise ConfigError(f"{key}: the sweep expands to no values")
            axes.append([f"{key}={v}" for v in values])
            if len(values) > 1:
                varying.append(key)
        else:
            axes.append([ov.input_line or f"{key}={ov.get_value_element_as_str()}"])
    return [list(combo) for combo in itertools.product(*axes)], varying


def _is_spec_override(item: str) -> bool:
    key = item.split("=", 1)[0].lstrip("+~")
    return key == "spec" or key.startswith("spec.")


def _apply_mtp_fallback(config: Config) -> tuple[Config, tuple[str, ...]]:
    spec = config.spec
    if spec.method != "mtp" or config.model.has_mtp:
        return config, ()
    if not spec.mtp_fallback:
        raise ConfigError(
            f"spec.method=mtp but model {config.model.name} has no MTP layers "
            "(set spec.mtp_fallback=ngram, or pick another spec)"
        )
    new = replace(spec, method=spec.mtp_fallback)
    if new.method == "ngram":
        new = replace(
            new,
            prompt_lookup_min=new.prompt_lookup_min or 2,
            prompt_lookup_max=new.prompt_lookup_max or 4,
        )
    note = (
        f"model {config.model.name} has no MTP layers: spec.method=mtp runs as "
        f"{new.method} (prompt lookup) with depth {new.depth}"
    )
    return replace(config, spec=new), (note,)


def _label(config: Config, combo: Sequence[str], varying: Sequence[str], baseline: bool) -> str:
    spec = config.spec
    head = "baseline" if baseline or spec.method == "none" else f"{spec.method}-k{spec.depth}"
    rest = []
    for item in combo:
        key, _, value = item.partition("=")
        key = key.lstrip("+~")
        if key in varying and not _is_spec_override(item):
            rest.append(f"{key.split('.')[-1]}={value}")
    return " ".join([head, *rest])


def build_variant(combo: Sequence[str], varying: Sequence[str], baseline: bool = False) -> Variant:
    config, resolved = compose_config(combo, baseline=baseline)
    config, notes = _apply_mtp_fallback(config)
    if notes:
        resolved["spec"] = OmegaConf.to_container(OmegaConf.structured(config.spec))
    return Variant(
        config=config,
        resolved=resolved,
        overrides=tuple(combo),
        label=_label(config, combo, varying, baseline),
        is_baseline=baseline or config.spec.method == "none",
        notes=notes,
    )


def plan_sweep(overrides: Sequence[str], with_baseline: bool | None = None) -> list[Variant]:
    """Expand overrides into Variants: per configuration, its no-speculation baseline first.

    A baseline is the same combination without speculation (every ``spec`` override
    dropped, the spec node reset to ``spec=none``); identical variants (same hash) are kept
    once. ``sweep.aa=true`` adds a second copy of each baseline, measured as a variant of its
    own against the first: an A/A check of whether specexp names a winner between identical
    configurations.
    """
    with hydra_context():
        combos, varying = expand(overrides)
        first, _ = compose_config(combos[0])
        add_baseline = first.sweep.baseline if with_baseline is None else with_baseline
        variants: list[Variant] = []
        seen: set[str] = set()
        for combo in combos:
            candidates = []
            variant = build_variant(combo, varying)
            if add_baseline or first.sweep.aa:
                base = [c for c in combo if not _is_spec_override(c)]
                baseline = build_variant(base, varying, baseline=True)
                candidates.append(baseline)
                if first.sweep.aa:
                    candidates.append(
                        replace(
                            baseline,
                            replica=1,
                            label=f"{baseline.label} (A/A copy)",
                            is_baseline=False,
                            baseline_hash=baseline.hash,
                        )
                    )
                if baseline.hash != variant.hash:
                    variant = replace(variant, baseline_hash=baseline.hash)
            candidates.append(variant)
            for v in candidates:
                if v.hash not in seen:
                    seen.add(v.hash)
                    variants.append(v)
    return variants
