"""How each quantization format matches module names against its ignore list, and the
minimal patterns that exclude a set of modules.

- compressed-tensors (``should_ignore_layer``): exact string equality, or a ``re:``
  pattern applied with ``re.match`` (anchored at the start only).
- ModelOpt (``is_layer_excluded``): exact, plain substring (also with ``language_model.``
  stripped from the name), or ``fnmatch`` on the name.

vLLM applies these to its own (possibly fused) module prefixes; on checkpoint names,
shard by shard, the result is the same when all shards of a fused layer agree, which is
what the tool checks.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from fnmatch import fnmatchcase, translate

from checkpoints_tools.quant_config import Format


def ct_matches(name: str, pattern: str) -> bool:
    if pattern.startswith("re:"):
        try:
            return re.match(pattern[3:], name) is not None
        except re.error:
            return False
    return name == pattern


def modelopt_matches(name: str, pattern: str) -> bool:
    stripped = name.replace("language_model.", "")
    return name == pattern or pattern in name or pattern in stripped or fnmatchcase(name, pattern)


def matches(fmt: Format, name: str, pattern: str) -> bool:
    return ct_matches(name, pattern) if fmt == "compressed-tensors" else modelopt_matches(name, pattern)


def is_ignored(fmt: Format, name: str, patterns: Iterable[str]) -> bool:
    return any(matches(fmt, name, p) for p in patterns)


def ignore_matcher(fmt: Format, patterns: Iterable[str]) -> Callable[[str], bool]:
    """``is_ignored`` with the patterns compiled once: a scan asks for every module of a
    checkpoint (25,000 on large MoE models), and must give the same answers."""
    patterns = list(patterns)
    if fmt == "compressed-tensors":
        exact = frozenset(p for p in patterns if not p.startswith("re:"))
        regexes = []
        for p in patterns:
            if p.startswith("re:"):
                try:
                    regexes.append(re.compile(p[3:]).match)
                except re.error:
                    continue  # never matches, as in ct_matches
        return lambda name: name in exact or any(m(name) is not None for m in regexes)
    subs = tuple(patterns)  # exact equality is a special case of the substring test
    globbed = [re.compile(translate(p)).match for p in patterns if any(c in p for c in "*?[")]

    def modelopt(name: str) -> bool:
        stripped = name.replace("language_model.", "") if "language_model." in name else name
        for p in subs:
            if p in name or p in stripped:
                return True
        return any(m(name) for m in globbed)

    return modelopt


def _regex_literal(text: str) -> str:
    return "".join("[.]" if c == "." else re.escape(c) for c in text)


def unit_patterns(fmt: Format, unit: str, whole_prefix: bool) -> list[str]:
    """Patterns that exclude ``unit``: a whole layer prefix, or one exact module name."""
    if not whole_prefix:
        return [unit]
    if fmt == "compressed-tensors":
        return [f"re:{_regex_literal(unit)}[.]"]
    out = [f"{unit}.*"]
    if "language_model." in unit:  # vLLM also strips it before its substring test
        out.append(f"{unit.replace('language_model.', '')}.*")
    return out
