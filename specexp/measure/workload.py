"""Named prompt sets. Every variant gets the same prompts in the same order (fixed seed)."""

from __future__ import annotations

import random
from functools import cache
from pathlib import Path
from typing import cast

import yaml

from specexp.errors import ConfigError

WORKLOAD_DIR = Path(__file__).with_name("workloads")
Messages = list[dict[str, str]]


def available() -> list[str]:
    return sorted(p.stem for p in WORKLOAD_DIR.glob("*.yaml"))


@cache
def load(name: str) -> tuple[tuple[tuple[str, str], ...], ...]:
    path = WORKLOAD_DIR / f"{name}.yaml"
    if not path.exists():
        raise ConfigError(f"bench.workload: unknown workload {name!r}; known: {', '.join(available())}")
    doc = yaml.safe_load(path.read_text())
    prompts = doc.get("prompts") or []
    if not prompts:
        raise ConfigError(f"workload {name} has no prompts")
    return tuple(tuple((m["role"], m["content"]) for m in p) for p in prompts)


def prompts_for(name: str, case_index: int, count: int, seed: int) -> list[Messages]:
    """``count`` prompts for a case: a seeded rotation so cases differ but variants agree."""
    pool = list(load(name))
    rng = random.Random(seed * 1000 + case_index)
    rng.shuffle(pool)
    out = [pool[i % len(pool)] for i in range(count)]
    return [cast(Messages, [{"role": r, "content": c} for r, c in p]) for p in out]


def warmup_prompt() -> Messages:
    return [{"role": "user", "content": "Say hello in one short sentence."}]
