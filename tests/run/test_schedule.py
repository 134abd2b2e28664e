from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path
from typing import cast

import pytest

from specexp.config.compose import plan_sweep
from specexp.launch.local import LocalLauncher
from specexp.measure.runner import VariantBench
from specexp.run import schedule
from tests.launch.test_local import alive, worker_pid
from tests.run.helpers import SMALL, session


def test_interleaved_takes_one_trial_of_each_variant_per_round(tmp_path: Path) -> None:
    variants = plan_sweep(["spec=ngram", "bench.trials=3", "bench.order=interleaved", *SMALL])
    assert [v.is_baseline for v in variants] == [True, False]
    sessions = [session(v, tmp_path / str(i)) for i, v in enumerate(variants)]
    finished: list[str] = []
    schedule.interleaved(sessions, lambda s: finished.append(s.variant.label), freeze=False)
    assert finished == [v.label for v in variants]
    base, spec = (s.result for s in sessions)
    assert base.status == spec.status == "ok"
    for case in ("single", "concurrent4"):
        a = [t.started_at for t in base.cases[case].trials]
        b = [t.started_at for t in spec.cases[case].trials]
        assert len(a) == len(b) == 3
        assert a[0] < b[0] < a[1] < b[1] < a[2] < b[2]  # round-robin, baseline first in each round
    assert spec.cases["single"].verdict is not None  # judged against the baseline's trials
    for i in range(2):
        lines = (tmp_path / str(i) / "requests.jsonl").read_text().splitlines()
        assert len(lines) == 3 * (1 + 4) and json.loads(lines[0])["case"] == "single"
        assert not alive(worker_pid(tmp_path / str(i) / "server.log"))


def _alive_stamps(log: Path) -> list[float]:
    return [float(m[1]) for m in re.finditer(r"^ALIVE (\d+\.\d+)$", log.read_text(), re.M)]


def test_interleaved_freezes_every_server_but_the_one_measuring(tmp_path: Path) -> None:
    variants = plan_sweep(
        ["spec=ngram", "bench.trials=2", "bench.order=interleaved", *SMALL, "bench.warmup_requests=1"]
    )
    sessions = [session(v, tmp_path / str(i)) for i, v in enumerate(variants)]
    schedule.interleaved(sessions, lambda _s: None, freeze=True)
    assert [s.result.status for s in sessions] == ["ok", "ok"]
    assert all(c.failed_requests == 0 for s in sessions for c in s.result.cases.values())  # after thaws too
    windows = {
        i: [(t.started_at, t.started_at + t.duration_s) for c in s.result.cases.values() for t in c.trials]
        for i, s in enumerate(sessions)
    }
    for me, other in ((0, 1), (1, 0)):
        mine, theirs = _alive_stamps(tmp_path / str(me) / "server.log"), windows[other]
        assert len(theirs) == 4
        for begin, end in theirs:  # frozen while the other measured
            assert not [t for t in mine if begin < t < end], (me, begin, end)
        assert any(begin < t < end for t in mine for begin, end in windows[me])  # alive in its own turn
        assert not alive(worker_pid(tmp_path / str(me) / "server.log"))


def test_interleaved_goes_on_when_one_server_fails_to_start(tmp_path: Path) -> None:
    variants = plan_sweep(["spec=ngram", "bench.trials=1", "bench.order=interleaved", *SMALL])
    sessions = [session(variants[0], tmp_path / "0"), session(variants[1], tmp_path / "1", "crash")]
    schedule.interleaved(sessions, lambda _s: None, freeze=True)
    assert sessions[0].result.status == "ok" and len(sessions[0].result.cases["single"].trials) == 1
    assert sessions[1].result.status == "failed" and "KV cache" in (sessions[1].result.error or "")
    assert json.loads((tmp_path / "1" / "result.json").read_text())["status"] == "failed"


def test_interleaved_goes_on_when_one_server_dies_mid_measurement(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only the variant whose server died fails, with the server's reason; the trials it had
    finished are kept; the other variant measures all its trials."""
    variants = plan_sweep(["spec=ngram", "bench.trials=3", "bench.order=interleaved", *SMALL])
    sessions = [session(v, tmp_path / str(i)) for i, v in enumerate(variants)]
    victim = sessions[1]
    original = victim.check_alive

    def kill_after_first(vb: VariantBench) -> None:
        launcher = cast(LocalLauncher, victim.launcher)
        if vb.done == 1 and launcher.pgid is not None:
            os.killpg(launcher.pgid, signal.SIGKILL)
            deadline = time.monotonic() + 30
            while launcher.failure() is None and time.monotonic() < deadline:  # until it is reaped
                time.sleep(0.01)
        original(vb)

    monkeypatch.setattr(victim, "check_alive", kill_after_first)
    schedule.interleaved(sessions, lambda _s: None, freeze=False)
    base, spec = (s.result for s in sessions)
    assert base.status == "ok" and len(base.cases["single"].trials) == 3
    assert spec.status == "failed" and "killed by SIGKILL" in (spec.error or "")
    assert len(spec.cases["single"].trials) == 1  # what it measured before is kept
    assert not alive(worker_pid(tmp_path / "1" / "server.log"))


def test_interleaved_honours_each_variants_own_trial_count(tmp_path: Path) -> None:
    variants = plan_sweep(["spec=ngram", "bench.trials=2", "bench.order=interleaved", *SMALL])
    variants[1].config.bench.trials = 4
    sessions = [session(v, tmp_path / str(i)) for i, v in enumerate(variants)]
    schedule.interleaved(sessions, lambda _s: None, freeze=False)
    assert [len(s.result.cases["single"].trials) for s in sessions] == [2, 4]


def test_interleaved_stops_adding_rounds_once_every_interval_is_as_narrow_as_asked(tmp_path: Path) -> None:
    # an A/A on the same fake server: with a target any interval meets, the first look ends it
    adaptive = ["bench.trials=5", "bench.max_trials=15", "bench.target_width=1e9"]
    variants = plan_sweep(["spec=ngram", *adaptive, "bench.order=interleaved", *SMALL])
    sessions = [session(v, tmp_path / str(i)) for i, v in enumerate(variants)]
    schedule.interleaved(sessions, lambda _s: None, freeze=False)
    assert [len(s.result.cases["single"].trials) for s in sessions] == [5, 5]
    verdict = sessions[1].result.cases["single"].verdict
    assert verdict is not None and verdict.ci_low is not None  # an interval to be narrow
