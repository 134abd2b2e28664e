"""The ngram replay against vLLM's own counters (recorded) and hand-checked drafts."""

from __future__ import annotations

import json
from pathlib import Path

from specexp.tune.replay import GreedyOutput, NgramIndex, replay, replay_one

DATA = Path(__file__).parent / "data" / "ngram_k3_counters.json"


def test_replay_reproduces_vllm_counters_request_by_request() -> None:
    """A replay of real measurements: each request's prompt and greedy ids were returned by
    vLLM (CPU 0.32, ngram k=3, lookup 2..4) and its spec-decode counters read around it."""
    doc = json.loads(DATA.read_text())
    assert len(doc["requests"]) == 11
    for req in doc["requests"]:
        out = GreedyOutput(tuple(req["prompt_ids"]), tuple(req["output_ids"]))
        stats = replay([out], doc["k"], doc["min"], doc["max"])
        assert (stats.drafts, stats.draft_tokens, stats.accepted) == (
            req["drafts"],
            req["draft_tokens"],
            req["accepted"],
        )
        assert stats.accepted_per_pos == req["accepted_per_pos"]


def test_earliest_occurrence_of_the_longest_suffix_ngram() -> None:
    seq = [7, 1, 2, 3, 9, 1, 2, 3, 8, 1, 2, 3]
    index = NgramIndex(seq, max_n=4)
    # suffix [1,2,3] occurs at 1 and 5; the earliest wins, the draft starts after it
    assert index.propose_start(len(seq), 2, 4) == 4
    # a suffix 4-gram [3,1,2,3]... occurs? [3,9,1,2] no: the longest match is 3 tokens
    assert index.propose_start(len(seq), 4, 4) is None
    # the suffix itself is no earlier occurrence
    assert NgramIndex([5, 6, 7], 3).propose_start(3, 1, 3) is None


def test_steps_accept_up_to_the_first_mismatch_and_emit_one_more() -> None:
    # prompt "a b c d a b", generated "c d x": after prefill (first token c) the context
    # ends "a b c"; it matches at 0, drafts "d a" (k=2): "d" accepted, "a" is not "x"
    prompt, out = (1, 2, 3, 4, 1, 2), (3, 4, 9)
    stats = replay_one(NgramIndex((*prompt, *out), 4), len(prompt), 2, 1, 4)
    assert (stats.drafts, stats.draft_tokens, stats.accepted) == (1, 2, 1)
    assert stats.accepted_per_pos == [1, 0]
    assert stats.decode_steps == 1 and stats.decode_tokens == 2  # "d" accepted + "x" from the target
    one = replay_one(NgramIndex((*prompt, *out), 4), len(prompt), 1, 1, 4)
    assert (one.drafts, one.draft_tokens, one.accepted) == (1, 1, 1)  # "d" drafted and accepted, then "x"


def test_deeper_drafts_never_pass_the_context_end_and_counts_aggregate() -> None:
    outs = [GreedyOutput((1, 2, 3), (1, 2, 3, 1, 2, 3)), GreedyOutput((5, 5), (5, 5, 5))]
    for k in (1, 3, 8):
        total = replay(outs, k, 1, 3)
        parts = [replay([o], k, 1, 3) for o in outs]
        assert total.drafts == sum(p.drafts for p in parts)
        assert total.accepted_per_pos == [sum(p.accepted_per_pos[i] for p in parts) for i in range(k)]
        assert all(a >= b for a, b in zip(total.accepted_per_pos, total.accepted_per_pos[1:], strict=False))
        assert total.decode_tokens == sum(len(o.output_ids) - 1 for o in outs)
    assert replay(outs, 3, 1, 3).mean_length is not None
