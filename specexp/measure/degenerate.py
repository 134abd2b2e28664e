"""Degenerate-output guard: detect generated text that loops.

With greedy decoding a small model falls into loops (" daisy-daisy-daisy…", a table
whose last rows cycle, a function body written again and again), and prompt lookup then
"accepts" most of its drafts: 2–3.5× speedups that are not real (local-engine.md: 61 %
and 1.5× on realistic prompts). Figures measured on looping outputs are flagged as
inflated, and their verdicts are not trusted.

A loop is a stretch of text that repeats one unit verbatim, back to back: about 3 times
for a unit of 5 tokens or more (2.8: the last copy may lack its separator), 2.2 times
from 16 tokens on (max_tokens usually cuts the last copy of a long unit), at least 4
times for a shorter one, and at least 8 tokens long in all; anywhere in the text, not
only at its end (the model can loop while reasoning and then answer). Tokens are words,
single punctuation marks and line breaks, compared case-insensitively; list numbering
("13.", "14.") and ordinal words ("Third,", "Fourth,") count as one token whatever their
value, since a loop keeps counting.
Structure is not a loop: a repeated unit without any letters that holds digits or
spans lines (CSV rows of zeros, matrix rows) or that is made of rule characters only
(``|---|---|``, ``=====``) is data or layout. A homogeneous JSON array or a templated list is not
verbatim: its values change from one record to the next. Measured on the labelled
corpus in ``tests/data/loop_corpus.jsonl`` (real SmolLM2 outputs and realistic
structured ones); see tests/measure/test_degenerate.py.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_TOKEN = re.compile(r"\w+|[^\w\s]|\n")
_ENUMERATOR = re.compile(r"(?m)^([ \t]*)\d+([.)])")
_ORDINALS = frozenset(
    ("first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth", "ninth", "tenth",
     "firstly", "secondly", "thirdly", "fourthly", "fifthly", "finally")
)  # fmt: skip
_RULE = frozenset("-=_*#~.|+:")  # the characters of rules, underlines and table borders
_LETTER = re.compile(r"[^\W\d_]")
_CHAR_RUN = re.compile(r"([^\s\-=_*#~.|+:])\1{31,}")  # one character 32+ times inside a word: "hhhh…"

MAX_PERIOD = 120  # tokens: a unit up to about 500 characters (a whole function, a paragraph)
MIN_SPAN = 8  # tokens covered by the repetition
SHORT_UNIT = 5  # units shorter than this need MIN_REPEATS_SHORT copies
MIN_REPEATS_SHORT = 4.0
MIN_REPEATS = 2.8  # the last copy may lack its final separator
LONG_UNIT = 16  # from here on the last copy may be cut by max_tokens
MIN_REPEATS_LONG = 2.2


@dataclass(frozen=True)
class Loop:
    """A repeated unit: where it starts (token index), its length and how much it covers."""

    start: int
    period: int  # tokens in the unit
    span: int  # tokens covered by the back-to-back copies
    unit: str

    @property
    def repeats(self) -> float:
        return self.span / self.period


def tokens(text: str) -> list[str]:
    normalized = _ENUMERATOR.sub(r"\1#\2", text.lower())
    return ["<ordinal>" if t in _ORDINALS else t for t in _TOKEN.findall(normalized)]


def _is_structure(unit: list[str]) -> bool:
    """Data without words (``0,0,0`` rows, ``[0, 0]`` cells) or rules and borders: layout,
    not a loop. A unit of symbols alone ("!", two emoji) is neither."""
    if all(t in _RULE or t == "\n" for t in unit):
        return True
    if any(_LETTER.search(t) for t in unit):
        return False
    return "\n" in unit or any(t.isdigit() for t in unit)


def _needed(period: int) -> float:
    if period < SHORT_UNIT:
        return MIN_REPEATS_SHORT
    return MIN_REPEATS_LONG if period >= LONG_UNIT else MIN_REPEATS


def _runs(toks: list[str], period: int) -> list[tuple[int, int]]:
    """Maximal stretches (start, span) where every token equals the one ``period`` later,
    covering at least two copies of the unit."""
    out = []
    run = 0
    for i in range(len(toks) - period):
        if toks[i] == toks[i + period]:
            run += 1
            continue
        if run >= period:
            out.append((i - run, run + period))
        run = 0
    if run >= period:
        out.append((len(toks) - period - run, run + period))
    return out


def find_loop(text: str) -> Loop | None:
    """The longest repetition that counts as a loop, or None."""
    if m := _CHAR_RUN.search(text):
        return Loop(start=0, period=1, span=len(m.group(0)), unit=m.group(1))
    toks = tokens(text)
    best: Loop | None = None
    for period in range(1, min(MAX_PERIOD, len(toks) // 2) + 1):
        for start, span in _runs(toks, period):
            if span < MIN_SPAN or span / period < _needed(period):
                continue
            unit = toks[start : start + period]
            if _is_structure(unit):
                continue
            if best is None or span > best.span:
                best = Loop(start=start, period=period, span=span, unit=" ".join(unit))
    return best


def is_looping(text: str) -> bool:
    return find_loop(text) is not None
