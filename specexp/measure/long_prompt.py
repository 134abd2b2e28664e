"""Prompts of an exact token count, built with the model's own tokenizer and chat template.

The seeds' long-input and fairness cases use an 8K prompt; "about 8K" would make TTFT
comparisons between runs meaningless, so the length is exact as the server counts it:
the chat template is applied and the filler is trimmed token by token until the templated
prompt has exactly ``n`` tokens. The server's ``usage.prompt_tokens`` is recorded beside it
so the claim can be checked. Each prompt starts differently, so concurrent requests do not
share a prefix-cache hit.
"""

from __future__ import annotations

import os
from functools import cache
from typing import Any

from specexp.errors import ConfigError
from specexp.measure import workload

QUESTION = "\n\nIn one sentence, what is the document above about?"


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


def _filler_ids(tok: Any, index: int, min_tokens: int) -> list[int]:
    """Token ids of realistic text (the workload's own prompts, rotated by ``index``), repeated
    as text and tokenized once, so the cut is the only place decoding can shift a boundary."""
    texts = [content for prompt in workload.load("copy_edit") for _role, content in prompt]
    unit = "\n\n".join(texts[index % len(texts) :] + texts[: index % len(texts)])
    per_unit = max(len(tok.encode(unit, add_special_tokens=False)), 1)
    text = "\n\n".join([unit] * (min_tokens // per_unit + 1))
    return list(tok.encode(text, add_special_tokens=False))


def exact_prompt(tokenizer_path: str, n_tokens: int, index: int = 0) -> list[dict[str, str]]:
    """A chat prompt whose templated form is exactly ``n_tokens`` tokens long."""
    tok = load_tokenizer(tokenizer_path)
    head = f"Document {index + 1}:\n"
    base = _count(tok, head + QUESTION)
    if n_tokens < base + 1:
        raise ConfigError(f"bench: prompt_tokens={n_tokens} is shorter than the prompt frame ({base} tokens)")
    need = n_tokens - base
    ids = _filler_ids(tok, index, need + 16)
    # decode/encode does not round-trip at the cut (a partial word merges with what follows),
    # and the count is not monotonic in the cut: try cuts near the target, nearest first.
    for k in sorted(range(max(0, need - 16), need + 16), key=lambda c: (abs(c - need), c)):
        for joiner in ("", " ", " .", " . .", " . . ."):  # pads of 0-3 tokens bridge jumps
            text = head + tok.decode(ids[:k]) + joiner + QUESTION
            if _count(tok, text) == n_tokens:
                return [{"role": "user", "content": text}]
    raise ConfigError(f"bench: could not build a prompt of exactly {n_tokens} tokens with {tokenizer_path}")
