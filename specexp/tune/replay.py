"""Exact acceptance of prompt lookup (ngram) at every depth, from one greedy output.

Greedy output does not depend on speculation (it is lossless up to numerics), and vLLM's
ngram proposer is a deterministic function of the context: the longest suffix n-gram of
length ``prompt_lookup_max`` down to ``prompt_lookup_min`` that occurred earlier in the
context, its earliest occurrence, and up to k tokens that followed it
(``vllm/v1/spec_decode/ngram_proposer.py``). So replaying the baseline's prompt and greedy
tokens through the same rule gives, for every depth and lookup window, the drafts the
server will make and how many of their tokens the target accepts — what its counters will
say — without starting it.

The context only grows, and every context is a prefix of the one token sequence, so the
earliest occurrence of each n-gram is indexed once per sequence and every (k, min, max)
replays from that index in O(steps).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class GreedyOutput:
    """One request's chat-templated prompt ids and the greedy ids generated for it."""

    prompt_ids: tuple[int, ...]
    output_ids: tuple[int, ...]


@dataclass
class ReplayStats:
    """What vLLM's spec-decode counters would count over a set of requests, plus the step
    structure the step-cost model needs. Units as vLLM's: per-position rate = accepted at
    that position / drafts; mean acceptance length includes the bonus token."""

    k: int
    drafts: int = 0
    draft_tokens: int = 0
    accepted: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)
    decode_steps: int = 0  # forward passes after the first token (drafted or not)
    decode_tokens: int = 0  # tokens those steps emitted

    def add(self, other: ReplayStats) -> None:
        self.drafts += other.drafts
        self.draft_tokens += other.draft_tokens
        self.accepted += other.accepted
        self.decode_steps += other.decode_steps
        self.decode_tokens += other.decode_tokens
        width = max(len(self.accepted_per_pos), len(other.accepted_per_pos))
        self.accepted_per_pos = [
            (self.accepted_per_pos[i] if i < len(self.accepted_per_pos) else 0)
            + (other.accepted_per_pos[i] if i < len(other.accepted_per_pos) else 0)
            for i in range(width)
        ]

    @property
    def per_position(self) -> list[float]:
        return [n / self.drafts for n in self.accepted_per_pos] if self.drafts else []

    @property
    def rate(self) -> float | None:
        return self.accepted / self.draft_tokens if self.draft_tokens else None

    @property
    def mean_length(self) -> float | None:
        return 1 + self.accepted / self.drafts if self.drafts else None

    @property
    def tokens_per_step(self) -> float:
        """Tokens one decode step emits on average (1 without speculation)."""
        return self.decode_tokens / self.decode_steps if self.decode_steps else 1.0

    @property
    def drafts_per_step(self) -> float:
        """Draft tokens one decode step verifies on average (what a step costs extra)."""
        return self.draft_tokens / self.decode_steps if self.decode_steps else 0.0


class NgramIndex:
    """For one token sequence: the earliest start of every n-gram (n <= ``max_n``)."""

    def __init__(self, tokens: Sequence[int], max_n: int) -> None:
        self.tokens = tuple(tokens)
        self.max_n = max_n
        self._first: list[dict[tuple[int, ...], int]] = [{} for _ in range(max_n + 1)]
        seq = self.tokens
        for n in range(1, max_n + 1):
            first = self._first[n]
            for p in range(len(seq) - n + 1):
                first.setdefault(seq[p : p + n], p)

    def propose_start(self, t: int, min_n: int, max_n: int) -> int | None:
        """Where the draft for context ``tokens[:t]`` starts, or None (no proposal).

        The longest suffix n-gram (``max_n`` down to ``min_n``) with an earlier occurrence
        ending before the context's last token; of that length, the earliest occurrence.
        """
        if t < min_n:
            return None
        seq = self.tokens
        for n in range(min(max_n, self.max_n, t - 1), min_n - 1, -1):
            p = self._first[n].get(seq[t - n : t])
            if p is not None and p + n <= t - 1:
                return p + n
        return None


def replay_one(index: NgramIndex, prompt_len: int, k: int, min_n: int, max_n: int) -> ReplayStats:
    """Step through one request as the engine does: the first token comes from prefill;
    after every step the proposer drafts from the context so far, the target accepts the
    drafted tokens up to the first one that differs from its greedy choice, and emits one
    token of its own (the correction, or the bonus after a full acceptance)."""
    seq = index.tokens
    end = len(seq)
    stats = ReplayStats(k=k, accepted_per_pos=[0] * k)
    t = prompt_len + 1  # context after prefill: the prompt and the first generated token
    while t < end:
        start = index.propose_start(t, min_n, max_n)
        accepted = 0
        if start is not None:
            draft_len = min(k, t - start)  # a draft never reaches past the context
            while accepted < draft_len and t + accepted < end and seq[start + accepted] == seq[t + accepted]:
                accepted += 1
            stats.drafts += 1
            stats.draft_tokens += draft_len
            stats.accepted += accepted
            for i in range(accepted):
                stats.accepted_per_pos[i] += 1
        emitted = min(accepted + 1, end - t)
        stats.decode_steps += 1
        stats.decode_tokens += emitted
        t += accepted + 1
    return stats


def replay(outputs: Iterable[GreedyOutput], k: int, min_n: int, max_n: int) -> ReplayStats:
    """Counters over a set of requests (a case's prompts, each as often as a trial sends it)."""
    total = ReplayStats(k=k, accepted_per_pos=[0] * k)
    for out in outputs:
        index = NgramIndex((*out.prompt_ids, *out.output_ids), max_n)
        total.add(replay_one(index, len(out.prompt_ids), k, min_n, max_n))
    return total
