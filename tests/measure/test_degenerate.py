"""The loop guard on a labelled corpus (tests/data/loop_corpus.jsonl: 78 real SmolLM2 outputs
of the demo and slices workloads, natural and ``ignore_eos``, and of structured-output
prompts, plus realistic structured outputs and the loops the issue describes), and on
the shapes that matter one by one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specexp.measure.degenerate import find_loop, is_looping

CORPUS = [
    json.loads(line)
    for line in (Path(__file__).parents[1] / "data" / "loop_corpus.jsonl").read_text().splitlines()
]


def test_the_corpus_is_labelled_and_large_enough() -> None:
    assert len(CORPUS) >= 60 and len({c["id"] for c in CORPUS}) == len(CORPUS)
    assert {c["label"] for c in CORPUS} == {"loop", "clean"}
    real = [c for c in CORPUS if c["kind"] == "real"]
    assert sum(c["label"] == "loop" for c in real) >= 20 and sum(c["label"] == "clean" for c in real) >= 40
    assert sum(c["structured"] for c in CORPUS) >= 30


def test_precision_and_recall_on_the_corpus() -> None:
    predicted = [(c, is_looping(c["text"])) for c in CORPUS]
    tp = sum(1 for c, p in predicted if p and c["label"] == "loop")
    fp = [c["id"] for c, p in predicted if p and c["label"] == "clean"]
    missed = [c["id"] for c, p in predicted if not p and c["label"] == "loop"]
    assert not [i for i in fp if next(c for c in CORPUS if c["id"] == i)["structured"]], fp
    assert tp / (tp + len(missed)) >= 0.95, missed
    assert tp / (tp + len(fp)) >= 0.95, fp


@pytest.mark.parametrize(
    "text",
    [
        "Sure! Here is the list: daisy-daisy-daisy-daisy-daisy-daisy-daisy-daisy-daisy-daisy",
        "The answer is " + "the answer is the answer is " * 12,
        "Result: " + "!" * 80,
        "def f():\n    return 1\n" + "print(f())\n" * 10,
        "Shhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhh",  # one character inside a word
    ],
)
def test_loops_are_detected(text: str) -> None:
    assert is_looping(text)


@pytest.mark.parametrize(
    "text",
    [
        "def add_all(values):\n    total = 0\n    for v in values:\n        total += v\n    return total",
        "The quick brown fox jumped over the lazy dog. The dog was not amused, and it barked at the fox.",
        "| Name | Role |\n|------|------|\n| Alice | engineer |\n| Bob | designer |\n| Carol | manager |",
        "- apples\n- bananas\n- bread\n- milk\n- eggs\n- cheese",
        "very very very good",
    ],
)
def test_realistic_outputs_are_not_loops(text: str) -> None:
    assert not is_looping(text)


def test_a_loop_is_found_where_it_is_with_its_unit() -> None:
    text = (
        "Step one is done. " + "I will check again. " * 4 + "Then we are finished and nothing repeats here."
    )
    loop = find_loop(text)
    assert loop is not None and loop.period == 5 and loop.repeats >= 4
    assert set(loop.unit.split()) == {"i", "will", "check", "again", "."}
    assert loop.start == 4  # the "." closing "step one is done" already starts the cycle


def test_counting_list_numbers_do_not_hide_a_loop() -> None:
    body = "".join(
        f"{i}. Add tea leaves to the kettle.\n{i + 1}. Pour the kettle into the pot.\n"
        for i in range(1, 12, 2)
    )
    assert is_looping(body)
    assert not is_looping(
        "".join(f"{i}. Item {w}\n" for i, w in enumerate(["tea", "milk", "bread", "eggs", "jam"], 1))
    )
