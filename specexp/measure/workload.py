"""Where a case's requests come from: a bundled set or a file, and which of its
conversations a case sends. Every variant gets the same requests in the same order.

``bench.workload`` (or a case's ``workload``) is a bundled set's name (a JSONL file in
``workloads/``) or ``file:PATH`` (read by ``measure.workload_files``). A relative PATH is
looked up from the working directory, then from the config tree (``conf/``), so the
shipped ``file:workloads/agent_traffic.jsonl`` works from anywhere.
"""

from __future__ import annotations

import functools
import random
from pathlib import Path

from specexp.errors import ConfigError
from specexp.measure.workload_files import Turn, Workload, read
from specexp.paths import conf_dir

WORKLOAD_DIR = Path(__file__).with_name("workloads")
FILE_PREFIX = "file:"
Messages = list[dict[str, str]]


def available() -> list[str]:
    return sorted(p.stem for p in WORKLOAD_DIR.glob("*.jsonl"))


def find_file(spec: str) -> Path:
    """The file a ``file:PATH`` names; a missing one is an error saying where it looked."""
    raw = Path(spec[len(FILE_PREFIX) :]).expanduser()
    if not str(raw) or str(raw) == ".":
        raise ConfigError(f"bench.workload={spec}: give a path after file:")
    tried = [raw] if raw.is_absolute() else [Path.cwd() / raw, conf_dir() / raw]
    for path in tried:
        if path.is_file():
            return path.resolve()
    raise ConfigError(f"bench.workload={spec}: no such file (looked at {', '.join(map(str, tried))})")


@functools.cache
def _read(path: Path, _mtime_ns: int, _size: int, name: str | None) -> Workload:
    return read(path, name)


def resolve(spec: str) -> Workload:
    """The workload a setting names, read and checked (once per file version)."""
    if spec.startswith(FILE_PREFIX):
        path = find_file(spec)
        name = None
    else:
        path = WORKLOAD_DIR / f"{spec}.jsonl"
        name = spec
        if not path.is_file():
            raise ConfigError(
                f"bench.workload: unknown workload {spec!r}; known: {', '.join(available())}; or file:PATH"
            )
    st = path.stat()
    return _read(path, st.st_mtime_ns, st.st_size, name)


def _text(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def load(spec: str) -> tuple[tuple[tuple[str, str], ...], ...]:
    """The workload's requests as (role, text) pairs (checks the file on the way)."""
    return tuple(tuple((m["role"], _text(m.get("content"))) for m in t.messages) for t in resolve(spec).turns)


def pick(
    work: Workload, count: int | None, *, seed: int, case_index: int, in_file_order: bool = False
) -> list[tuple[Turn, ...]]:
    """The conversations a case sends: all of them in file order (``count`` None), or
    ``count`` requests made of whole conversations (the last one cut short if needed),
    in a seeded order so cases differ but variants agree; repeated when the file is short.
    ``in_file_order`` keeps the file's order (a replayed trace)."""
    units = work.conversations()
    if count is None:
        return units
    if not in_file_order:
        random.Random(seed * 1000 + case_index).shuffle(units)
    out: list[tuple[Turn, ...]] = []
    n = 0
    while n < count:
        unit = units[len(out) % len(units)][: count - n]
        out.append(unit)
        n += len(unit)
    return out


def prompts_for(name: str, case_index: int, count: int, seed: int) -> list[Messages]:
    """``count`` single requests for a case (each conversation's first turn)."""
    picked = pick(resolve(name), count, seed=seed, case_index=case_index)
    return [
        [{"role": m["role"], "content": _text(m.get("content"))} for m in conv[0].messages] for conv in picked
    ]


def warmup_prompt() -> Messages:
    return [{"role": "user", "content": "Say hello in one short sentence."}]
