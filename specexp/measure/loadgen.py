"""One measured window of a case: its conversations sent closed loop or on a schedule.

- **Closed loop** (``concurrency`` streams): each stream takes the next conversation and
  plays it to the end; a stream never waits for a schedule.
- **Open loop** (a due time per conversation, from ``measure.arrivals``): a dispatcher
  starts each conversation when it is due, whether or not earlier ones have finished,
  like production traffic; an optional cap on open requests makes a late request wait
  for a slot (AIPerf's sleep-then-gate: no catch-up, the wait shows as lateness).
  Without a cap, a request is made just before it is due and its body held until then,
  so at the due time only the socket write is left (``client.stream_chat``'s ``due``).

A conversation's turns go one after another: each is sent when the previous answer has
ended (and, replaying a trace, not before its own timestamp), with that answer in its
history, so the server's prefix cache sees what it would see in production. When a turn
fails, the rest of its conversation is recorded as not sent. Each request records when it
was due and how late it went out (request on the socket minus due time): a client that
cannot keep up would otherwise quietly offer less load than asked
(``benchmarks/arrival_fidelity.py`` measures it).
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, cast

import aiohttp

from specexp.measure.client import SPIN_S, chat_payload, sleep_until, stream_chat
from specexp.measure.workload_files import Turn
from specexp.record.results import RequestRecord

Message = dict[str, Any]
LEAD_S = 0.02  # open loop: a conversation's task starts this long before it is due
# an uncapped request is made this long before it is due, its body held until then: long
# enough for its set-up on a loaded core, short of any server's keep-alive timeout
ARM_S = 0.01


@dataclass(frozen=True)
class RequestDefaults:
    """What a request gets when its record does not say (the case's and the bench's settings)."""

    model: str
    max_tokens: int
    temperature: float
    seed: int
    ignore_eos: bool = False


@dataclass(frozen=True)
class Window:
    conversations: Sequence[tuple[Turn, ...]]
    due_s: Sequence[float] | None = None  # open loop: each conversation's first turn; None: closed
    concurrency: int | None = None  # closed loop: streams; open loop: cap on open requests
    trace_start_s: float | None = None  # replaying a trace: later turns wait for timestamp - this


def build_payload(turn: Turn, history: list[Message], defaults: RequestDefaults) -> dict[str, Any]:
    """The request body: the record's own fields win over the case's defaults; specexp sets
    only the model name and streaming."""
    messages = [*history, *turn.new_messages(first=not history)]
    body = chat_payload(
        defaults.model,
        cast(list[dict[str, str]], messages),
        max_tokens=defaults.max_tokens,
        temperature=defaults.temperature,
        seed=defaults.seed,
        ignore_eos=defaults.ignore_eos,
    )
    body.update(turn.fields)
    if "max_completion_tokens" in turn.fields and "max_tokens" not in turn.fields:
        body.pop("max_tokens", None)
    body.update(model=defaults.model, stream=True, stream_options={"include_usage": True})
    return body


async def run_window(
    client: aiohttp.ClientSession,
    url: str,
    window: Window,
    defaults: RequestDefaults,
    *,
    timeout_s: float,
    t0: float | None = None,
    spin_s: float = SPIN_S,
) -> list[RequestRecord]:
    """Every request of the window, in plan order (conversation by conversation)."""
    convs = list(window.conversations)
    base = [0]
    for conv in convs:
        base.append(base[-1] + len(conv))
    records: list[RequestRecord | None] = [None] * base[-1]
    open_loop = window.due_s is not None
    gate = asyncio.Semaphore(window.concurrency) if open_loop and window.concurrency else None
    start = time.perf_counter() if t0 is None else t0

    async def send(index: int, payload: dict[str, Any], due: float | None) -> RequestRecord:
        if due is None:
            return await stream_chat(client, url, payload, index=index, t0=start, timeout_s=timeout_s)
        if gate is None:  # made just before its due time, its body held until then
            await sleep_until(start + due - ARM_S, 0.0)
            return await stream_chat(
                client,
                url,
                payload,
                index=index,
                t0=start,
                timeout_s=timeout_s,
                due=start + due,
                spin_s=spin_s,
            )
        # capped: a request waits for its slot from its due time (the wait is lateness)
        await sleep_until(start + due, spin_s)
        async with gate:
            return await stream_chat(client, url, payload, index=index, t0=start, timeout_s=timeout_s)

    async def play(ci: int, first_due: float | None) -> None:
        history: list[Message] = []
        due = first_due
        conv = convs[ci]
        for k, turn in enumerate(conv):
            index = base[ci] + k
            payload = build_payload(turn, history, defaults)  # ready before it is due
            if k > 0:
                due = time.perf_counter() - start
                if window.trace_start_s is not None and turn.timestamp_s is not None:
                    due = max(due, turn.timestamp_s - window.trace_start_s)
            rec = await send(index, payload, due)
            rec.slice, rec.session, rec.turn = turn.slice, turn.session, k
            if due is not None:
                rec.scheduled_s = due
                rec.late_s = rec.start_s + rec.send_delay_s - due
            records[index] = rec
            if not rec.ok:
                now = time.perf_counter() - start
                for j in range(k + 1, len(conv)):
                    records[base[ci] + j] = RequestRecord(
                        index=base[ci] + j,
                        start_s=now,
                        error=f"not sent: turn {k + 1} of its conversation failed",
                        slice=conv[j].slice,
                        session=conv[j].session,
                        turn=j,
                    )
                return
            history = [
                *history,
                *turn.new_messages(first=not history),
                {"role": "assistant", "content": rec.text},
            ]

    # a full garbage collection walks every object the process holds (the sweep has MLflow,
    # Hydra and pydantic loaded): milliseconds in which no request goes out. Frozen, the
    # objects that existed before the window are not walked again until it ends.
    gc.freeze()
    try:
        await _dispatch(convs, window, play, spin_s, start)
    finally:
        gc.unfreeze()
    return [r for r in records if r is not None]


async def _dispatch(
    convs: list[tuple[Turn, ...]],
    window: Window,
    play: Callable[[int, float | None], Coroutine[Any, Any, None]],
    spin_s: float,
    start: float,
) -> None:
    """Closed loop: streams that each take the next conversation. Open loop: every
    conversation started when it is due."""
    async with asyncio.TaskGroup() as group:
        if window.due_s is None:
            pending = iter(range(len(convs)))

            async def stream() -> None:
                for ci in pending:  # shared: each stream takes the next conversation
                    await play(ci, None)

            for _ in range(min(window.concurrency or 1, len(convs))):
                group.create_task(stream())
        else:
            dues = list(window.due_s)
            for ci in sorted(range(len(convs)), key=lambda i: dues[i]):
                # each conversation waits for its own due time: started a little early, its
                # first request goes out without waiting for the loop to start it
                await sleep_until(start + dues[ci] - LEAD_S, 0.0)
                group.create_task(play(ci, dues[ci]))
