from __future__ import annotations

import pytest

from specexp.measure.degenerate import is_looping, repeated_ngram_share, tail_period

LOOPS = [
    "Sure! Here is the list: daisy-daisy-daisy-daisy-daisy-daisy-daisy-daisy-daisy-daisy-daisy-daisy-daisy",
    "The answer is " + "the answer is the answer is " * 12,
    "Result: " + "!" * 80,
    "def f():\n    return 1\n" + "print(f())\n" * 10,
]
REAL = [
    "def add_all(values):\n    total = 0\n    for v in values:\n        total = total + v\n    return total",
    "The quick brown fox jumped over the lazy dog. The dog was not amused, and it barked loudly at the fox.",
    "| Name | Role | City |\n|------|------|------|\n"
    "| Alice | engineer | Berlin |\n| Bob | designer | Paris |",
    "- apples\n- bananas\n- bread\n- milk\n- eggs\n- cheese",
    "Each node keeps a copy of the configuration. When a node starts, it reads the configuration from disk "
    "and announces itself to the other nodes. If a node stops answering, the remaining nodes elect a leader.",
]


@pytest.mark.parametrize("text", LOOPS)
def test_loops_are_detected(text: str) -> None:
    assert is_looping(text)


@pytest.mark.parametrize("text", REAL)
def test_realistic_copy_edit_outputs_are_not_loops(text: str) -> None:
    assert not is_looping(text)
    assert repeated_ngram_share(text) < 0.5 and tail_period(text) is None


def test_short_texts_are_never_judged() -> None:
    assert repeated_ngram_share("a a a a") == 0.0
