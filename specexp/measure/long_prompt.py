"""Prompts of an exact token count, built with the model's own tokenizer and chat template.

The seeds' long-input and fairness cases use an 8K prompt; "about 8K" would make TTFT
comparisons between runs meaningless, so the length is exact as the server counts it:
the chat template is applied and the document is trimmed token by token until the
templated prompt has exactly ``n`` tokens. The server's ``usage.prompt_tokens`` is
recorded beside it so the claim can be checked.

Each prompt is a long household log (seed 000's agent keeps one) with a question the
model answers in a few words: a fact stated once in the middle, a name to extract, or a
count. Asked to summarise 8K tokens, the small embedded model loops, the loop guard
rightly marks the figures untrusted, and the seed's fairness case had no usable result;
a short answer keeps TTFT and the wait between streams the figures that matter. Each
prompt's log is different from its first line on, so concurrent requests do not share a
prefix-cache hit.
"""

from __future__ import annotations

import os
import random
from functools import cache
from typing import Any

from specexp.errors import ConfigError

_PEOPLE = ("Alex", "Sam", "Jordan", "Robin", "Kim", "Noor")
_ROOMS = ("kitchen", "living room", "bedroom", "hallway", "bathroom", "study")
_ITEMS = ("apples", "bread", "milk", "coffee", "rice", "soap", "batteries", "eggs", "tea", "lemons")
_SHOPS = ("the hardware store", "the bookshop", "the pharmacy", "the garden centre", "the post office")
_BILLS = ("electricity", "water", "internet", "phone", "gas")
_PLUMBERS = ("Maria Lopez", "Tom Becker", "Aisha Khan", "Lars Nilsson")


def _entry(rng: random.Random, day: int) -> str:
    who, time = rng.choice(_PEOPLE), f"{rng.randrange(6, 23):02d}:{rng.choice(('00', '15', '30', '45'))}"
    kind = rng.randrange(6)
    if kind == 0:
        return f"Day {day}, {time}: {who} set the thermostat to {rng.randrange(17, 24)} degrees."
    if kind == 1:
        state = rng.choice(("on", "off"))
        return f"Day {day}, {time}: the {rng.choice(_ROOMS)} lights were turned {state} by {who}."
    if kind == 2:
        return f"Day {day}, {time}: {who} added {rng.choice(_ITEMS)} to the shopping list."
    if kind == 3:
        return f"Day {day}, {time}: the garage door was {rng.choice(('opened', 'closed'))}."
    if kind == 4:
        return (
            f"Day {day}, {time}: {who} paid the {rng.choice(_BILLS)} bill, {rng.randrange(20, 180)} dollars."
        )
    return f"Day {day}, {time}: a parcel from {rng.choice(_SHOPS)} arrived for {who}."


COUNT_QUESTION = "How many times was the garage door opened? Answer with a number only."


def _task(index: int) -> tuple[str, str]:
    """(the line placed in the middle of the log, the question asked after it)."""
    kind = index % 3
    if kind == 0:
        return (
            "Note: the spare key is now in the blue flowerpot.",
            "Where is the spare key? Answer briefly.",
        )
    if kind == 1:
        name = _PLUMBERS[(index // 3) % len(_PLUMBERS)]
        return (
            f"Note: the plumber who fixed the sink was {name}.",
            "Who fixed the sink? Answer with the name only.",
        )
    return ("", COUNT_QUESTION)


@cache
def load_tokenizer(path: str) -> Any:
    """The model's tokenizer from a local folder, loaded once per process."""
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def _count(tok: Any, text: str) -> int:
    enc = tok.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True
    )
    ids = enc["input_ids"] if hasattr(enc, "keys") else enc
    return len(ids)


def _log(rng: random.Random, first_day: int, min_tokens: int, tok: Any) -> tuple[str, int]:
    """Whole log entries, just over ``min_tokens`` tokens; and the day after the last."""
    lines: list[str] = []
    total, day = 0, first_day
    while total < min_tokens:
        lines.append(_entry(rng, day))
        total += len(tok.encode(lines[-1] + "\n", add_special_tokens=False))
        day += rng.randrange(0, 2)
    return "\n".join(lines), day


def exact_prompt(tokenizer_path: str, n_tokens: int, index: int = 0) -> list[dict[str, str]]:
    """A chat prompt whose templated form is exactly ``n_tokens`` tokens long."""
    tok = load_tokenizer(tokenizer_path)
    needle, question = _task(index)
    head = f"Household log {index + 1}:\n"
    frame = _count(tok, f"{head}{needle}\n\nQuestion: {question}")
    if n_tokens <= frame and needle:  # too short for a fact in the middle: ask for a count
        needle, question = "", COUNT_QUESTION
        frame = _count(tok, f"{head}\n\nQuestion: {question}")
    if n_tokens <= frame:
        raise ConfigError(
            f"bench: prompt_tokens={n_tokens} is shorter than the prompt frame ({frame} tokens)"
        )
    tail = f"\n\nQuestion: {question}"
    middle = f"\n{needle}\n" if needle else "\n"
    rng = random.Random(f"household-log/{index}")
    budget = n_tokens - frame
    before, day = _log(rng, 1, budget // 2, tok) if budget >= 64 else ("", 1)
    before_text = head + before + middle
    after, _ = _log(rng, day, budget, tok)
    ids = list(tok.encode(after, add_special_tokens=False))
    need = n_tokens - _count(tok, before_text + tail)
    # decode/encode does not round-trip at the cut (a partial word merges with what follows),
    # and the count is not monotonic in the cut: try cuts near the target, nearest first.
    for k in sorted(range(max(0, need - 16), need + 16), key=lambda c: (abs(c - need), c)):
        for joiner in ("", " ", " .", " . .", " . . ."):  # pads of 0-3 tokens bridge jumps
            text = before_text + tok.decode(ids[:k]) + joiner + tail
            if _count(tok, text) == n_tokens:
                return [{"role": "user", "content": text}]
    raise ConfigError(f"bench: could not build a prompt of exactly {n_tokens} tokens with {tokenizer_path}")
