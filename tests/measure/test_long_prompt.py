from __future__ import annotations

import os

import pytest

from specexp.assets import embedded
from specexp.errors import ConfigError
from specexp.measure.long_prompt import _count, exact_prompt, load_tokenizer


@pytest.fixture(scope="module")
def tokenizer_dir() -> str:
    name = "smollm2-135m-instruct"
    if not embedded.is_built(name):
        if os.environ.get("CI"):
            pytest.fail("CI: the embedded model should have been built by scripts/bootstrap.sh setup")
        pytest.skip("embedded model not built (scripts/bootstrap.sh setup)")
    return str(embedded.embedded_model_dir(name))


@pytest.mark.parametrize("n", [64, 65, 97, 512, 2048, 8000])
def test_prompts_are_exactly_n_tokens_with_the_chat_template(tokenizer_dir: str, n: int) -> None:
    for index in range(4):
        (msg,) = exact_prompt(tokenizer_dir, n, index)
        assert _count(load_tokenizer(tokenizer_dir), msg["content"]) == n


def test_concurrent_prompts_start_differently(tokenizer_dir: str) -> None:
    firsts = {exact_prompt(tokenizer_dir, 512, i)[0]["content"][:40] for i in range(4)}
    assert len(firsts) == 4  # no shared prefix-cache hit between streams started together


def test_too_short_is_a_config_error(tokenizer_dir: str) -> None:
    with pytest.raises(ConfigError, match="shorter than the prompt frame"):
        exact_prompt(tokenizer_dir, 5)


def test_long_prompts_ask_for_a_short_answer_about_the_middle(tokenizer_dir: str) -> None:
    # asked to summarise 8K tokens the small model loops; a fact, a name or a count it answers briefly
    asks = set()
    for index in range(4):
        (msg,) = exact_prompt(tokenizer_dir, 8000, index)
        text = msg["content"]
        question = text.rsplit("Question: ", 1)[1]
        assert "summar" not in question.lower() and "about" not in question.lower()
        assert any(word in question for word in ("briefly", "name only", "number only"))
        asks.add(question)
        if "Note:" in text:
            assert 0.4 < text.index("Note:") / len(text) < 0.6  # the fact sits in the middle
    assert len(asks) == 3  # a fact from the middle, a name, a count
