"""A candidate's claim is decided by one INSERT: racing processes, one winner."""

from __future__ import annotations

import multiprocessing as mp
from pathlib import Path

import sqlalchemy as sa

from specexp.tune.claims import Claims


def _race(url: str, trial: int, start: mp.synchronize.Event, out: mp.Queue) -> None:
    claims = Claims(sa.create_engine(url, connect_args={"timeout": 60}), "s")
    start.wait()
    out.put((trial, claims.claim("cand", trial, lambda _n: False)))


def test_racing_processes_leave_exactly_one_holder(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'claims.db'}"
    Claims(sa.create_engine(url), "s")  # the table exists before the race, as after open_study
    ctx = mp.get_context("spawn")
    start, out = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_race, args=(url, n, start, out)) for n in range(6)]
    for p in procs:
        p.start()
    start.set()
    got = dict(out.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    winners = [n for n, holder in got.items() if holder is None]
    assert len(winners) == 1
    assert all(holder == winners[0] for n, holder in got.items() if n != winners[0])


def test_a_released_claim_passes_to_one_trial_only(tmp_path: Path) -> None:
    claims = Claims(sa.create_engine(f"sqlite:///{tmp_path / 'c.db'}"), "s")
    assert claims.claim("k", 3, lambda _n: False) is None
    assert claims.claim("k", 4, lambda _n: False) == 3  # trial 3 still measures it
    assert claims.claim("k", 5, lambda n: n == 3) is None  # trial 3 was interrupted: 5 takes over
    assert claims.claim("k", 6, lambda n: n == 3) == 5  # 3's release is spent; 5 holds it
    assert Claims(claims.engine, "other").claim("k", 1, lambda _n: False) is None  # per study
